"""The run log as the event source (ADR 0009): the relay publishes the log's events by id
behind a watermark, so an id drawn by a statement that commits late holds back the newer
events until it commits (then all go, in id order), and one rolled back is passed; a database
from before revision 0007 keeps its outbox's events and publishes each once."""

from __future__ import annotations

import asyncio
import json

import asyncpg
import nats.errors

from services.ledger.app import create_app
from services.ledger.database import migrate
from services.ledger.settings import LedgerSettings
from shared import subjects
from tests.ledger.conftest import LedgerClient, none_waiting, plain, wait_until_serving
from tests.ledger.test_outbox import ledger_id


async def stream_ids(nc, subject: str, timeout: float = 10.0, expect: int = 1) -> list[tuple[int, str]]:
    """``(eventId, Nats-Msg-Id)`` of the stream's messages on ``subject`` in stream order, once
    ``expect`` are there (or the timeout passed)."""
    return [(event_id, msg_id) for _, event_id, msg_id in await stream_entries(nc, subject, timeout, expect)]


async def stream_entries(nc, subject: str, timeout: float = 10.0, expect: int = 1) -> list[tuple[int, int, str]]:
    """:func:`stream_ids` with each message's stream sequence first."""
    js = nc.jetstream()
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        info = await js.stream_info(subjects.LEDGER_EVENTS_STREAM, subjects_filter=subject)
        if sum((info.state.subjects or {}).values()) >= expect:
            break
        await asyncio.sleep(0.05)
    sub = await js.pull_subscribe(subject, stream=subjects.LEDGER_EVENTS_STREAM)
    found: list[tuple[int, int, str]] = []
    try:
        while True:
            try:
                batch = await sub.fetch(500, timeout=1)
            except (TimeoutError, nats.errors.TimeoutError):
                break
            for msg in batch:
                found.append((msg.metadata.sequence.stream, json.loads(msg.data)["eventId"],
                              (msg.headers or {}).get("Nats-Msg-Id", "")))
                await msg.ack()
    finally:
        await sub.unsubscribe()
    return found


async def draw_an_event(conn: asyncpg.Connection, run_id: str) -> int:
    """In ``conn``'s open transaction, a statement like the ledger's: it writes a row, then its
    log entry with the run's JSON (an event); the entry's id."""
    await conn.execute("UPDATE runs SET updated_at = now() WHERE run_id = $1", run_id)
    return await conn.fetchval(
        "INSERT INTO run_log (run_id, kind, detail, run) VALUES (CAST($1 AS text), 'run.status', '{}', "
        "json_build_object('runId', CAST($1 AS text))) RETURNING id", run_id)


async def test_an_event_that_commits_after_newer_ones_holds_them_back_then_all_go_in_id_order(ledger, nc, db,
                                                                                                ledger_db, unique):
    late, after = f"late{unique}", f"after{unique}"
    await ledger.run(late)
    assert await none_waiting(db)
    held = await asyncpg.connect(plain(ledger_db))
    try:
        tx = held.transaction()
        await tx.start()
        late_id = await draw_an_event(held, late)
        await ledger.run(after)  # committed with ids above late_id
        newer = await db.fetchval("SELECT min(id) FROM run_log WHERE run_id = $1", after)
        assert newer > late_id
        await asyncio.sleep(0.5)  # many relay looks: none may pass the id still to commit
        assert await stream_ids(nc, subjects.ledger_run_events(after), timeout=0, expect=0) == []
        await tx.commit()
    finally:
        await held.close()
    assert await none_waiting(db)
    prefix = await ledger_id(db)
    # This test's two runs only: on a shared server the stream also holds other tests' events.
    every = sorted([*await stream_entries(nc, subjects.ledger_run_events(late), expect=2),
                    *await stream_entries(nc, subjects.ledger_run_events(after))])
    mine = [event_id for _, event_id, msg_id in every if msg_id.startswith(prefix) and event_id >= late_id]
    assert mine[0] == late_id and mine == sorted(mine) and len(mine) == len(set(mine)) == 2


async def test_ids_rolled_back_do_not_hold_the_relay(ledger, nc, db, ledger_db, unique):
    """Two statements draw ids between the ledger's changes and roll back after the relay met
    the gaps: every committed event still arrives, once."""
    gone, runs = [f"gone{unique}", f"gone2{unique}"], [f"a{unique}", f"b{unique}"]
    for run in gone:  # one each: the drawing statements lock their run's row
        await ledger.run(run)
    held = [await asyncpg.connect(plain(ledger_db)) for _ in runs]
    burned = []
    try:
        transactions = [conn.transaction() for conn in held]
        for conn, tx, run, gone_run in zip(held, transactions, runs, gone, strict=True):
            await tx.start()
            burned.append(await draw_an_event(conn, gone_run))
            await ledger.run(run)
        await asyncio.sleep(0.3)  # the relay meets the gaps while their transactions run
        for tx in transactions:
            await tx.rollback()
    finally:
        for conn in held:
            await conn.close()
    assert await none_waiting(db)
    for run, burned_id in zip(runs, burned, strict=True):
        found = await stream_ids(nc, subjects.ledger_run_events(run))
        assert len(found) == 1 and found[0][0] > burned_id
    assert await db.fetchval("SELECT count(*) FROM run_log WHERE id = ANY($1::bigint[])", burned) == 0


async def test_a_database_from_before_0007_publishes_its_outbox_once_then_the_log(nats_url, nc, database_url,
                                                                                  unique):
    """A database at 0006 (the outbox era) holding a run and an event not yet published, as the
    older code wrote them, is migrated by a ledger starting on it: the old event is published
    once under its old message id, and the next change's event id is above it."""
    run, dsn = f"old{unique}", plain(database_url)
    assert await migrate.upgrade(database_url, "0006") == "0006"
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("INSERT INTO runs (run_id, shard, event) VALUES ($1, 'uo1', 'invasion')", run)
        await conn.execute("INSERT INTO run_log (run_id, kind, detail) VALUES ($1, 'run.created', '{}')", run)
        old_id = await conn.fetchval(
            "INSERT INTO ledger_outbox (run_id, type, run) VALUES (CAST($1 AS text), 'run.created', "
            "json_build_object('runId', CAST($1 AS text))) RETURNING id", run)
        prefix = await ledger_id(conn)
        settings = LedgerSettings(nats_url=nats_url, database_url=database_url, db_pool_size=4)
        async with create_app(settings):
            await wait_until_serving(nc)
            assert (await LedgerClient(nc).ask(subjects.LEDGER_RUN_STATUS, runId=run, status="running"))["status"] \
                == 200
            found = await stream_ids(nc, subjects.ledger_run_events(run), expect=2)
            assert await none_waiting(conn)
        assert [msg_id for _, msg_id in found] == [f"{prefix}:{event_id}" for event_id, _ in found]
        assert found[0][0] == old_id and found[1][0] > old_id and len(found) == 2
        assert await conn.fetchval("SELECT count(*) FROM ledger_outbox") == 0
        # Older code still writing to the outbox (a rolling upgrade) draws the log's ids: no
        # event id, hence no message id, is ever given out twice.
        taken = await conn.fetchval("INSERT INTO ledger_outbox (run_id, type, run) VALUES ($1, 'x', '{}') "
                                    "RETURNING id", run)
        assert taken > max(event_id for event_id, _ in found)
    finally:
        await conn.close()

