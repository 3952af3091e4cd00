"""With its database away the ledger answers 503 and its retry sentence — never a hang, never a
500, never a password — in every shape an outage takes at the driver, each provoked here
against a real PostgreSQL: a refused connection, a connection reset, a backend terminated
mid-statement, a connection that died mid-protocol (asyncpg's InternalClientError), a
statement cancelled or timed out, a pool with no connection to spare, a server that stops
answering, a server stopped mid-statement. After each, nothing is half-applied: the change
and its run-log entry are both there or both not, and the request retried with the same body
lands exactly once."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from services.ledger.app import UNAVAILABLE, create_app
from services.ledger.database import migrate, store
from services.ledger.events import outbox_relay
from services.ledger.settings import LedgerSettings
from shardbus import embedded
from shared import subjects
from tests.ledger.conftest import LedgerClient, plain, wait_until_serving
from tests.ledger.pg_proxy import PgProxy

PROMPT_S = 1.0
"""A 503 for an outage the driver sees at once must come within this."""


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@asynccontextmanager
async def in_process_ledger(nats_url: str, nc, database_url: str, pool_size: int = 1) -> AsyncIterator[LedgerClient]:
    """A ledger on the test's loop (so a proxy on the same loop sees its sockets), one
    connection by default so the test knows which backend serves it."""
    app = create_app(LedgerSettings(nats_url=nats_url, database_url=database_url, migrate_on_start=False,
                                    db_pool_size=pool_size))
    async with app:
        await wait_until_serving(nc)
        yield LedgerClient(nc, timeout=8.0)


def assert_unavailable(reply: dict, secret: str | None = None) -> None:
    assert reply["status"] == 503, reply
    assert reply["error"] == UNAVAILABLE, reply
    if secret:
        assert secret not in json.dumps(reply)


async def timed(coro) -> tuple[dict, float]:
    started = time.monotonic()
    reply = await coro
    return reply, time.monotonic() - started


async def ledger_backends(db: asyncpg.Connection) -> list[int]:
    """Backend pids of the ledger's pool on the test's database (not the test's own connections,
    not the outbox relay's session)."""
    return [r["pid"] for r in await db.fetch(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
        "AND backend_type = 'client backend' AND coalesce(application_name, '') NOT IN ('outage-test', $1)",
        outbox_relay.APPLICATION_NAME)]


async def wait_blocked_on_lock(db: asyncpg.Connection, timeout: float = 5.0) -> int:
    """The pid of the ledger backend waiting for a lock (its statement is mid-flight)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = await db.fetchrow(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' "
            "AND pid <> pg_backend_pid()")
        if row:
            return row["pid"]
        await asyncio.sleep(0.02)
    raise AssertionError("the ledger's statement never waited for the lock")


@asynccontextmanager
async def row_locked(database_url: str, run_id: str) -> AsyncIterator[asyncpg.Connection]:
    """Hold the run's row (SELECT … FOR UPDATE in an open transaction) until the block ends:
    a ledger statement changing it waits, mid-flight, until then."""
    locker = await asyncpg.connect(plain(database_url), timeout=10, server_settings={"application_name": "outage-test"})
    tx = locker.transaction()
    await tx.start()
    try:
        await locker.execute("SELECT 1 FROM runs WHERE run_id = $1 FOR UPDATE", run_id)
        yield locker
    finally:
        try:
            await tx.rollback()
            await locker.close(timeout=5)
        except Exception:  # the server went away under it (a test stopping PostgreSQL)
            locker.terminate()


async def assert_status_change_not_half_applied(db: asyncpg.Connection, run_id: str, status: str) -> bool:
    """The run's status and its run-log agree: it has ``status`` with exactly one log entry
    saying so, or it does not and no entry says so. Returns whether it was applied."""
    run = await db.fetchval("SELECT status FROM runs WHERE run_id = $1", run_id)
    entries = await db.fetchval("SELECT count(*) FROM run_log WHERE run_id = $1 AND kind = 'run.status' "
                                "AND detail->>'status' = $2", run_id, status)
    assert (run == status and entries == 1) or (run != status and entries == 0), (run, entries)
    return run == status


async def retried_lands_once(client: LedgerClient, db: asyncpg.Connection, run_id: str, status: str) -> None:
    reply = await client.ask(subjects.LEDGER_RUN_STATUS, runId=run_id, status=status)
    assert reply["status"] == 200 and reply["run"]["status"] == status, reply
    assert await assert_status_change_not_half_applied(db, run_id, status)


async def test_requests_get_503_while_the_database_is_unreachable(nats_url, nc, unique):
    url = f"postgresql://ledger:s3cret-{unique}@127.0.0.1:{_closed_port()}/ledger"
    app = create_app(LedgerSettings(nats_url=nats_url, database_url=url, migrate_on_start=False))
    async with app:
        await wait_until_serving(nc)
        client = LedgerClient(nc)
        for subject, body in [(subjects.LEDGER_RUN_CREATE, {"shard": "uo1", "event": "x"}),
                              (subjects.LEDGER_CONSOLE, {"runId": "r1"}),
                              (subjects.ledger_expired("world"), {"kind": "creature", "ref": "c1"})]:
            reply = await client.ask(subject, **body)
            assert reply["status"] == 503 and "unreachable" in reply["error"], reply
            assert f"s3cret-{unique}" not in reply["error"]


@pytest.fixture
async def proxy(ledger_db) -> AsyncIterator[PgProxy]:
    url = make_url(ledger_db)
    proxy = await PgProxy(url.host or "127.0.0.1", url.port or 5432).start()
    try:
        yield proxy
    finally:
        await proxy.close()


@pytest.mark.timeout(60)
async def test_a_connection_that_died_mid_protocol_is_answered_503_and_not_used_again(nats_url, nc, ledger_db, db,
                                                                                         proxy, unique):
    """pg_terminate_backend on the ledger's idle connection: PostgreSQL sends its FATAL message
    and closes. The ledger reads the message before the socket's end (held back by the proxy,
    as a slow network would), so its next statement on that connection meets asyncpg's
    InternalClientError ("cannot switch to state …; another operation … is in progress"). That
    request is answered 503, and the broken connection is thrown away: the very next request,
    the socket's end still unread, is served on a new one."""
    run = f"dead-{unique}"
    async with in_process_ledger(nats_url, nc, proxy.url(ledger_db)) as client:
        await client.run(run)  # the pool's one connection is now open, idle, through the proxy
        (backend,) = await ledger_backends(db)
        proxy.hold_close, _ = True, proxy.server_closed.clear()
        assert await db.fetchval("SELECT pg_terminate_backend($1)", backend)
        await asyncio.wait_for(proxy.server_closed.wait(), 5)
        await asyncio.sleep(0.2)  # the ledger reads the FATAL message; the socket's end is held

        reply, took = await timed(client.ask(subjects.LEDGER_RUN_STATUS, runId=run, status="running"))
        assert_unavailable(reply)
        assert took < PROMPT_S
        assert not await assert_status_change_not_half_applied(db, run, "running")
        await retried_lands_once(client, db, run, "running")  # the held socket still unread
        proxy.release()


@pytest.mark.timeout(60)
async def test_a_backend_terminated_mid_statement_is_answered_503_and_applies_nothing(nats_url, nc, ledger_db, db,
                                                                                       ledger, unique):
    run = f"term-{unique}"
    await ledger.run(run)
    async with row_locked(ledger_db, run):
        asking = asyncio.create_task(ledger.ask(subjects.LEDGER_RUN_STATUS, runId=run, status="running"))
        backend = await wait_blocked_on_lock(db)
        assert await db.fetchval("SELECT pg_terminate_backend($1)", backend)
        reply = await asyncio.wait_for(asking, 5)
    assert_unavailable(reply)
    assert not await assert_status_change_not_half_applied(db, run, "running")
    await retried_lands_once(ledger, db, run, "running")


@pytest.mark.timeout(60)
async def test_a_statement_cancelled_mid_flight_is_answered_503_and_applies_nothing(nats_url, nc, ledger_db, db,
                                                                                     ledger, unique):
    """pg_cancel_backend (an operator's cancel, or the cancel asyncpg sends for a timed-out
    statement) raises QueryCanceledError, SQLSTATE 57014."""
    run = f"cancel-{unique}"
    await ledger.run(run)
    async with row_locked(ledger_db, run):
        asking = asyncio.create_task(ledger.ask(subjects.LEDGER_RUN_STATUS, runId=run, status="running"))
        backend = await wait_blocked_on_lock(db)
        assert await db.fetchval("SELECT pg_cancel_backend($1)", backend)
        reply = await asyncio.wait_for(asking, 5)
    assert_unavailable(reply)
    assert not await assert_status_change_not_half_applied(db, run, "running")
    await retried_lands_once(ledger, db, run, "running")


@pytest.mark.timeout(60)
async def test_a_statement_over_the_statement_timeout_is_answered_503_and_applies_nothing(nats_url, nc, ledger_db,
                                                                                          db, monkeypatch, unique):
    monkeypatch.setattr(store, "STATEMENT_TIMEOUT_S", 0.5)
    run = f"slow-{unique}"
    async with in_process_ledger(nats_url, nc, ledger_db) as client:
        await client.run(run)
        async with row_locked(ledger_db, run):
            reply, took = await timed(client.ask(subjects.LEDGER_RUN_STATUS, runId=run, status="running"))
        assert_unavailable(reply)
        assert took < 0.5 + PROMPT_S
        assert not await assert_status_change_not_half_applied(db, run, "running")
        await retried_lands_once(client, db, run, "running")


@pytest.mark.timeout(60)
async def test_no_connection_to_spare_within_the_acquire_timeout_is_answered_503(nats_url, nc, ledger_db, db,
                                                                                 monkeypatch, unique):
    """The pool's only connection is held by a statement waiting for a lock; another request
    waits for a connection no longer than the acquire timeout."""
    monkeypatch.setattr(store, "ACQUIRE_TIMEOUT_S", 0.3)
    monkeypatch.setattr(store, "STATEMENT_TIMEOUT_S", 4.0)
    run, other = f"busy-{unique}", f"other-{unique}"
    async with in_process_ledger(nats_url, nc, ledger_db) as client:
        await client.run(run)
        await client.run(other)
        async with row_locked(ledger_db, run):
            holding = asyncio.create_task(client.ask(subjects.LEDGER_RUN_STATUS, runId=run, status="running"))
            await wait_blocked_on_lock(db)
            reply, took = await timed(client.ask(subjects.LEDGER_RUN_STATUS, runId=other, status="running"))
            assert_unavailable(reply)
            assert took < 0.3 + PROMPT_S
        assert (await asyncio.wait_for(holding, 5))["status"] == 200  # the lock's release let it through
        assert not await assert_status_change_not_half_applied(db, other, "running")
        await retried_lands_once(client, db, other, "running")


@pytest.mark.timeout(60)
async def test_a_server_that_stops_answering_mid_statement_is_answered_503(nats_url, nc, ledger_db, db, monkeypatch,
                                                                           unique):
    """The ledger's backend is frozen (SIGSTOP: a hung or partitioned server — the socket
    stays open and silent). The statement is given up after the statement timeout and a
    margin, answered 503, and its connection thrown away: the next request is served on a new
    one while the frozen backend is still stopped. Whatever the frozen backend does once it
    runs again, the change and its log entry are both there or both not."""
    monkeypatch.setattr(store, "STATEMENT_TIMEOUT_S", 0.5)
    run, other = f"frozen-{unique}", f"alive-{unique}"
    async with in_process_ledger(nats_url, nc, ledger_db) as client:
        await client.run(run)
        await client.run(other)
        (backend,) = await ledger_backends(db)
        try:
            os.kill(backend, signal.SIGSTOP)
        except OSError as exc:  # a PostgreSQL on another host, or another user's we may not signal
            pytest.skip(f"cannot freeze the ledger's backend ({exc!r})")
        try:
            reply, took = await timed(client.ask(subjects.LEDGER_RUN_STATUS, runId=run, status="running"))
            assert_unavailable(reply)
            assert took < 0.5 + store.UNRESPONSIVE_AFTER_S + PROMPT_S
            assert (await client.console(other))["status"] == 200
        finally:
            os.kill(backend, signal.SIGCONT)
        deadline = time.monotonic() + 5
        while backend in await ledger_backends(db) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await assert_status_change_not_half_applied(db, run, "running")
        await retried_lands_once(client, db, run, "running")


@pytest.mark.timeout(60)
async def test_connections_reset_by_the_network_are_answered_503(nats_url, nc, ledger_db, db, proxy, unique):
    """A reset while connecting (ConnectionResetError) and a reset of an open connection
    mid-statement (asyncpg's ConnectionDoesNotExistError caused by ECONNRESET)."""
    run = f"reset-{unique}"
    async with in_process_ledger(nats_url, nc, proxy.url(ledger_db)) as client:
        proxy.reset_all()  # the pool's open connection (wait_until_serving used it) …
        proxy.reset_new = True  # … and every new one
        await asyncio.sleep(0.1)
        reply, took = await timed(client.ask(subjects.LEDGER_RUN_CREATE, runId=run, shard="uo1", event="reset"))
        assert_unavailable(reply)
        assert took < PROMPT_S
        assert await db.fetchval("SELECT count(*) FROM runs WHERE run_id = $1", run) == 0
        proxy.reset_new = False
        await client.run(run)

        async with row_locked(ledger_db, run):
            asking = asyncio.create_task(client.ask(subjects.LEDGER_RUN_STATUS, runId=run, status="running"))
            await wait_blocked_on_lock(db)
            proxy.reset_all()
            reply = await asyncio.wait_for(asking, 5)
            assert_unavailable(reply)
        # The backend never learnt its client was gone: once the lock is released its statement
        # may still commit. Applied or not, never half; the retry lands once.
        await asyncio.sleep(0.2)
        await assert_status_change_not_half_applied(db, run, "running")
        await retried_lands_once(client, db, run, "running")


@pytest.mark.timeout(120)
async def test_a_server_stopped_mid_statement_is_answered_503_until_it_is_back(nats_url, nc, unique):
    """The test's own PostgreSQL is stopped (fast shutdown) while a statement waits for a lock.
    That request is answered at once, and as the database has it: the shutdown terminates the
    lock's holder too, and its backend may release the lock before the ledger's backend takes
    its own SIGTERM — then the statement commits (about 1 run in 5 here) and the answer is 200;
    else it is rolled back and the answer is 503. Every request while the server is down is
    answered 503 promptly; once it is back the retried request lands exactly once."""
    pg_dir = Path(tempfile.mkdtemp(prefix="shardbus-pg-stop-"))  # not under pytest's 0700 tmp root
    pgdata, port = pg_dir / "data", embedded.free_port()
    servers = [embedded.start_postgres(pgdata, port=port, durable=False)]
    secret = f"pw-{unique}"
    try:
        servers[0].create_database("ledger")
        url = servers[0].url("ledger").replace("postgres@", f"postgres:{secret}@")
        await migrate.upgrade(url)
        run = f"stop-{unique}"
        async with in_process_ledger(nats_url, nc, url) as client:
            await client.run(run)
            async with row_locked(url, run):
                asking = asyncio.create_task(client.ask(subjects.LEDGER_RUN_STATUS, runId=run, status="running"))
                admin = await asyncpg.connect(plain(url), timeout=10,
                                              server_settings={"application_name": "outage-test"})
                await wait_blocked_on_lock(admin)
                await admin.close()
                assert await asyncio.to_thread(servers[0].stop) == 0
                mid_statement = await asyncio.wait_for(asking, 5)
                print(f"\nthe statement the stop caught mid-flight was answered {mid_statement['status']}")
                if mid_statement["status"] != 200:
                    assert_unavailable(mid_statement, secret)
            for _ in range(3):
                reply, took = await timed(client.ask(subjects.LEDGER_RUN_STATUS, runId=run, status="running"))
                assert_unavailable(reply, secret)
                assert took < PROMPT_S
            servers.append(await asyncio.to_thread(embedded.start_postgres, pgdata, port=port, durable=False))
            db = await asyncpg.connect(plain(url), timeout=10, server_settings={"application_name": "outage-test"})
            try:
                applied = await assert_status_change_not_half_applied(db, run, "running")
                assert applied == (mid_statement["status"] == 200), mid_statement
                await retried_lands_once(client, db, run, "running")
            finally:
                await db.close()
    finally:
        for server in servers:
            server.stop()
        shutil.rmtree(pg_dir, ignore_errors=True)


@pytest.mark.timeout(60)
async def test_a_request_in_flight_when_the_ledger_stops_is_answered(nats_url, nc, ledger_db, db, monkeypatch, unique):
    """Stopping the ledger lets in-flight requests finish (their statements are bounded by the
    statement timeout, well inside the stop's grace): the caller gets its answer — here 503,
    the statement timed out behind a lock — rather than silence until its own timeout."""
    monkeypatch.setattr(store, "STATEMENT_TIMEOUT_S", 1.0)
    run = f"stopping-{unique}"
    app = create_app(LedgerSettings(nats_url=nats_url, database_url=ledger_db, migrate_on_start=False, db_pool_size=1))
    await app.start()
    stopped = False
    try:
        await wait_until_serving(nc)
        client = LedgerClient(nc, timeout=8.0)
        await client.run(run)
        async with row_locked(ledger_db, run):
            asking = asyncio.create_task(client.ask(subjects.LEDGER_RUN_STATUS, runId=run, status="running"))
            await wait_blocked_on_lock(db)
            await app.stop()
            stopped = True
            assert_unavailable(await asyncio.wait_for(asking, 5))
    finally:
        if not stopped:
            await app.stop()
    assert not await assert_status_change_not_half_applied(db, run, "running")


# --- the commands that reach the database ------------------------------------------------------

def _shardbus(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shardbus", *args], env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def test_migrate_with_the_database_away_says_so_plainly(unique):
    secret = f"pw-{unique}"
    done = _shardbus("migrate", "--database-url", f"postgresql://ledger:{secret}@127.0.0.1:{_closed_port()}/ledger")
    said = done.stdout + done.stderr
    assert done.returncode == 1, said
    assert "cannot reach the database at postgresql+asyncpg://ledger:***@127.0.0.1" in said, said
    assert "Traceback" not in said and secret not in said, said


@pytest.mark.timeout(60)
def test_a_ledger_started_with_its_database_away_exits_for_a_restart_with_one_line(nats_url, unique):
    """Its start's migration cannot reach the database: one log line saying so (no password),
    exit 75 (EX_TEMPFAIL) for the supervisor to start it again, no traceback."""
    secret = f"pw-{unique}"
    done = _shardbus("run", "ledger", timeout=45, env={
        "SHARDBUS_NATS_URL": nats_url, "SHARDBUS_MIGRATE_ON_START": "true",
        "SHARDBUS_DATABASE_URL": f"postgresql://ledger:{secret}@127.0.0.1:{_closed_port()}/ledger"})
    said = done.stdout + done.stderr
    assert done.returncode == 75, said[-3000:]
    assert "the database is unreachable" in said, said[-3000:]
    assert "Traceback" not in said and secret not in said, said[-3000:]
