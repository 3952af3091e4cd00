"""Fixtures for the ledger's tests: a migrated database, an in-process ledger on the real
NATS and PostgreSQL, a client that asks it, and helpers to read the tables directly."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import nats
import pytest

from services.ledger.app import create_app
from services.ledger.settings import LedgerSettings
from shared import subjects


def plain(url: str) -> str:
    """asyncpg wants ``postgresql://``, not SQLAlchemy's ``postgresql+asyncpg://``."""
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


class LedgerClient:
    """Asks the ledger over NATS as any other service or a website would."""

    def __init__(self, nc, timeout: float = 5.0) -> None:
        self.nc = nc
        self.timeout = timeout

    async def raw(self, subject: str, payload: bytes) -> dict[str, Any]:
        """Send ``payload`` as it is; the decoded reply."""
        return json.loads((await self.nc.request(subject, payload, timeout=self.timeout)).data)

    async def ask(self, subject: str, **body: Any) -> dict[str, Any]:
        """Send ``body`` as JSON; the decoded reply."""
        return await self.raw(subject, json.dumps(body).encode())

    async def run(self, run_id: str, status: str = "scheduled", shard: str = "uo1") -> dict[str, Any]:
        """Create run ``run_id`` and walk it to ``status`` (via running when needed)."""
        reply = await self.ask(subjects.LEDGER_RUN_CREATE, runId=run_id, shard=shard, event="invasion")
        assert reply["status"] == 200, reply
        path = {"scheduled": [], "running": ["running"], "missed": ["missed"]}.get(status, ["running", status])
        for step in path:
            reply = await self.ask(subjects.LEDGER_RUN_STATUS, runId=run_id, status=step)
            assert reply["status"] == 200, reply
        return reply["run"]

    async def record(self, run_id: str, ref: str, *, module: str = "world", kind: str = "creature",
                     reserve: bool = False, key: str | None = None, **extra: Any) -> dict[str, Any]:
        """Record (or reserve) one resource; the reply."""
        subject = subjects.LEDGER_RESOURCE_RESERVE if reserve else subjects.LEDGER_RESOURCE_RECORD
        return await self.ask(subject, runId=run_id, module=module, kind=kind, ref=ref,
                              idempotencyKey=key or f"{run_id}:{module}:{kind}:{ref}", **extra)

    async def console(self, run_id: str) -> dict[str, Any]:
        """The run console."""
        return await self.ask(subjects.LEDGER_CONSOLE, runId=run_id)


async def wait_until_serving(nc, timeout: float = 30.0) -> None:
    """Wait until a ledger answers. Just after a ledger stopped, nats-server may for a moment
    still pick the stopped member of the ``ledger`` queue group and answer "no responders"; a
    ledger just started on a busy machine may take longer than one try's 2 s to answer its first
    request (seen in a CI-like run at load 10): both are asked again until ``timeout``."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            await nc.request(subjects.LEDGER_RUNS, b'{"limit": 1}', timeout=2)
            return
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.05)


@pytest.fixture
def ledger_db(migrated_database_url: str) -> str:
    """A fresh database at the newest schema: a copy of the session's migrated template
    (tests/conftest.py), not a migration per test."""
    return migrated_database_url


@pytest.fixture
async def ledger(nats_url: str, ledger_db: str, nc) -> AsyncIterator[LedgerClient]:
    """An in-process ledger serving the test's database; a client to ask it."""
    settings = LedgerSettings(nats_url=nats_url, database_url=ledger_db, db_pool_size=4)
    app = create_app(settings)
    async with app:
        await wait_until_serving(nc)
        yield LedgerClient(nc)


@pytest.fixture
async def db(ledger_db: str) -> AsyncIterator[asyncpg.Connection]:
    """A direct connection to the ledger's database, to check what was written."""
    conn = await asyncpg.connect(plain(ledger_db), timeout=10)
    try:
        yield conn
    finally:
        await conn.close()


async def log_kinds(db: asyncpg.Connection, run_id: str) -> list[str]:
    """The run's log entry kinds, in order."""
    return [r["kind"] for r in await db.fetch("SELECT kind FROM run_log WHERE run_id = $1 ORDER BY id", run_id)]


WAITING = ("SELECT count(*) FROM run_log l, ledger_relay w WHERE l.id > w.relayed_through AND l.run IS NOT NULL")
"""Events the relay has not published yet."""


async def none_waiting(db, timeout: float = 10.0) -> bool:
    """Whether the relay's watermark passes every event within ``timeout``."""
    deadline = asyncio.get_running_loop().time() + timeout
    while await db.fetchval(WAITING):
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def next_message(sub, timeout: float = 3.0):
    """The next message of a subscription, or a TimeoutError."""
    return await asyncio.wait_for(sub.next_msg(timeout=timeout), timeout + 1)
