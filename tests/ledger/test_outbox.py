"""The run log as the event source (ADR 0009, keeping ADR 0003's guarantees): every change's
update event is the log entry written in the statement that makes the change and reaches the
stream LEDGER_EVENTS exactly once — also when the ledger is killed between the commit and the
publish, when a relay dies mid-batch long after JetStream's duplicate window, and when an
entry commits after newer ones or never commits at all."""

from __future__ import annotations

import asyncio
import json
import signal
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import nats.errors
import pytest

from services.ledger.app import create_app
from services.ledger.events import outbox_relay
from services.ledger.settings import LedgerSettings
from shared import subjects
from tests.ledger.conftest import LedgerClient, next_message, none_waiting, plain, wait_until_serving
from tests.processes import ServiceProcesses


async def stream_events(nc, run_id: str, expect: int, timeout: float = 10.0) -> list[tuple[dict[str, Any], str]]:
    """Every message the stream holds for the run, with its Nats-Msg-Id, once ``expect`` are
    there (or the timeout passed), and a moment more to show nothing else arrives."""
    js = nc.jetstream()
    subject = subjects.ledger_run_events(run_id)
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        info = await js.stream_info(subjects.LEDGER_EVENTS_STREAM, subjects_filter=subject)
        if (info.state.subjects or {}).get(subject, 0) >= expect:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    sub = await js.pull_subscribe(subject, stream=subjects.LEDGER_EVENTS_STREAM)
    found: list[tuple[dict[str, Any], str]] = []
    try:
        while True:
            try:
                batch = await sub.fetch(500, timeout=1)
            except (TimeoutError, nats.errors.TimeoutError):
                break
            for msg in batch:
                found.append((json.loads(msg.data), (msg.headers or {}).get("Nats-Msg-Id", "")))
                await msg.ack()
    finally:
        await sub.unsubscribe()
    return found


@asynccontextmanager
async def relay_lock_held(ledger_db: str):
    """The test holds the relay's advisory lock: no ledger relays until it lets go."""
    conn = await asyncpg.connect(plain(ledger_db), server_settings={"application_name": "outbox-test"})
    try:
        assert await conn.fetchval("SELECT pg_try_advisory_lock($1)", outbox_relay.LOCK_KEY)
        yield conn
    finally:
        await conn.close()


async def ledger_id(db) -> str:
    return str(await db.fetchval("SELECT ledger_id FROM ledger_identity"))


EVENTS_OF_RUN = "SELECT count(*) FROM run_log WHERE run_id = $1 AND run IS NOT NULL"

async def make_changes(client: LedgerClient, run: str, creatures: int) -> int:
    """A run walked to its end with ``creatures`` reserved and confirmed; the events it made."""
    await client.run(run, "running")
    for n in range(creatures):
        reply = await client.record(run, f"{run}-c{n}", reserve=True)
        assert reply["status"] == 200, reply
        row = reply["resource"]
        assert (await client.ask(subjects.LEDGER_RESOURCE_CONFIRM, resourceId=row["resourceId"]))["status"] == 200
    assert (await client.ask(subjects.LEDGER_RUN_STATUS, runId=run, status="completed"))["status"] == 200
    return 3 + 2 * creatures


def assert_exactly_once(found: list[tuple[dict[str, Any], str]], expected: int, prefix: str) -> None:
    ids = [event["eventId"] for event, _ in found]
    assert len(ids) == expected, f"{len(ids)} events in the stream, {expected} changes made"
    assert len(set(ids)) == expected, "an event was published twice"
    assert ids == sorted(ids), "events left out of commit order"
    assert all(msg_id == f"{prefix}:{event['eventId']}" for event, msg_id in found)


async def test_each_event_carries_its_id_reaches_the_stream_once_and_the_watermark_passes_it(ledger, nc, db,
                                                                                            unique):
    run = f"r{unique}"
    live = await nc.subscribe(subjects.ledger_run_events(run))
    made = await make_changes(ledger, run, 3)
    first = json.loads((await next_message(live)).data)
    assert first["type"] == "run.created" and first["run"]["runId"] == run and isinstance(first["eventId"], int)
    found = await stream_events(nc, run, made)
    assert_exactly_once(found, made, await ledger_id(db))
    assert [e["type"] for e, _ in found][:4] == ["run.created", "run.status", "resource.recorded",
                                                 "resource.confirmed"]
    entries = await db.fetch("SELECT id, kind FROM run_log WHERE run_id = $1 ORDER BY id", run)
    assert [(e["id"], e["kind"]) for e in entries] == [(ev["eventId"], ev["type"]) for ev, _ in found]
    assert await none_waiting(db)
    assert await db.fetchval("SELECT count(*) FROM ledger_outbox") == 0
    await live.unsubscribe()


async def test_a_change_and_its_event_commit_together_a_refusal_writes_none(nats_url, nc, ledger_db, db, unique):
    run = f"r{unique}"
    settings = LedgerSettings(nats_url=nats_url, database_url=ledger_db, db_pool_size=4)
    async with relay_lock_held(ledger_db), create_app(settings):  # nothing is published
        await wait_until_serving(nc)
        ledger = LedgerClient(nc)
        await ledger.run(run, "completed")
        assert await db.fetchval(EVENTS_OF_RUN, run) == 3
        assert (await ledger.ask(subjects.LEDGER_RUN_STATUS, runId=run, status="running"))["status"] == 409
        assert (await ledger.record(run, "c1", reserve=True))["status"] == 409
        assert await db.fetchval(EVENTS_OF_RUN, run) == 3
        reply = await ledger.record(run, "c2")
        row = await db.fetchrow("SELECT kind, resource FROM run_log ORDER BY id DESC LIMIT 1")
        assert row["kind"] == "resource.recorded" and json.loads(row["resource"]) == reply["resource"]
        # One row per change besides the resource: the log entry is the event, no outbox row.
        assert await db.fetchval("SELECT count(*) FROM ledger_outbox") == 0


@pytest.mark.timeout(120)
async def test_a_ledger_killed_between_commit_and_publish_loses_no_event_and_repeats_none(
        nats_url, nc, ledger_db, db, tmp_path, unique):
    """The relay's lock is held by the test, so the ledger process commits changes that it
    cannot publish; it is SIGKILLed with all of them in the outbox. A new ledger publishes
    each, once."""
    run = f"killed{unique}"
    procs = ServiceProcesses(tmp_path, nats_url)
    try:
        async with relay_lock_held(ledger_db):
            victim = procs.start("ledger", database_url=ledger_db)
            client = LedgerClient(nc)
            await wait_until_serving(nc)
            made = await make_changes(client, run, 10)
            assert await db.fetchval(EVENTS_OF_RUN, run) == made
            procs.stop(victim, signal.SIGKILL)
        assert await stream_events(nc, run, 0, timeout=0) == []  # nothing left the killed ledger
        procs.start("ledger", database_url=ledger_db)
        found = await stream_events(nc, run, made)
        assert_exactly_once(found, made, await ledger_id(db))
        assert await none_waiting(db)
    finally:
        procs.stop_all()


@pytest.mark.timeout(60)
async def test_a_relay_that_died_mid_batch_is_finished_without_repeats_after_the_duplicate_window(
        nats_url, nc, ledger_db, db, unique):
    """A dead relay's state, made by hand: its last finished batch ended at the stream's last
    sequence, then the first half of the next batch was published with the relay's message
    ids and the watermark not moved. The duplicate window is 0.2 s and has passed, so JetStream
    would take the half again: the next relay must find it in the stream itself."""
    run = f"mid{unique}"
    settings = LedgerSettings(nats_url=nats_url, database_url=ledger_db, db_pool_size=4,
                              events_duplicate_window_s=0.2)
    prefix = await ledger_id(db)
    js = nc.jetstream()
    async with relay_lock_held(ledger_db):
        async with create_app(settings):
            await wait_until_serving(nc)
            made = await make_changes(LedgerClient(nc), run, 4)
        last = (await js.stream_info(subjects.LEDGER_EVENTS_STREAM)).state.last_seq
        await db.execute("UPDATE ledger_relay SET stream_after = $1", last)
        batch = await db.fetch("SELECT id, kind, run::text AS run, resource::text AS resource FROM run_log "
                               "WHERE run_id = $1 ORDER BY id", run)
        assert len(batch) == made
        for event in batch[: len(batch) // 2]:
            await js.publish(subjects.ledger_run_events(run),
                             outbox_relay.payload(event["id"], event["kind"], event["run"], event["resource"]),
                             headers={"Nats-Msg-Id": outbox_relay.message_id(prefix, event["id"])})
        await asyncio.sleep(0.5)  # past the duplicate window
    async with create_app(settings):
        found = await stream_events(nc, run, made)
    assert_exactly_once(found, made, prefix)


async def test_two_replicas_relay_one_at_a_time_and_the_second_takes_over(nats_url, nc, ledger_db, db, unique):
    settings = LedgerSettings(nats_url=nats_url, database_url=ledger_db, db_pool_size=4)
    relaying = ("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                "AND ((classid::bigint << 32) | objid::bigint) = $1")
    first, second = create_app(settings), create_app(settings)
    async with second:
        async with first:
            await wait_until_serving(nc)
            await asyncio.sleep(outbox_relay.POLL_S * 1.5)
            assert await db.fetchval(relaying, outbox_relay.LOCK_KEY) == 1
            before = await make_changes(LedgerClient(nc), f"a{unique}", 1)
        # Whichever replica relayed, the one left does now.
        await wait_until_serving(nc)
        after = await make_changes(LedgerClient(nc), f"b{unique}", 1)
        assert len(await stream_events(nc, f"a{unique}", before)) == before
        assert len(await stream_events(nc, f"b{unique}", after)) == after
