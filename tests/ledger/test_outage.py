"""With its database unreachable the ledger answers 503 — never a hang, never a password."""

from __future__ import annotations

import socket

from services.ledger.app import create_app
from services.ledger.settings import LedgerSettings
from shared import subjects
from tests.ledger.conftest import LedgerClient, wait_until_serving


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
