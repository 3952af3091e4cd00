"""The relay: publishes the update events that ledger statements wrote into the run log (an
entry with its run's JSON is its change's event, ADR 0009) into the JetStream stream
``LEDGER_EVENTS``, in id order, and moves its watermark (``ledger_relay``) past them. Events
written to the legacy ``ledger_outbox`` (before revision 0007, or by older code during a
rolling upgrade) are published and deleted first, as ADR 0003 did.

Exactly one relay works at a time, whichever ledger replica holds a PostgreSQL advisory lock
on its own connection; the others wait for it (a killed relay's session ends, its lock with
it, and another takes over within ``POLL_S``). The replica that committed a change wakes its
own relay at once; a change committed on another replica is found by the relay's look every
``LOOK_S``. (Not NOTIFY: it takes a database-wide lock at commit, serialising every committing
statement — measured, 7,700 → 3,000 statements/s with 32 in flight.)

Nothing is published twice, even by a relay that dies mid-batch:
- every event carries ``Nats-Msg-Id: <ledger id>:<event id>``, so JetStream drops a repeat
  within the stream's duplicate window;
- with the watermark the relay keeps the stream's sequence after its last finished batch
  (``stream_after``); a relay that takes over reads the stream after it, and skips the events
  it finds there already — so even a takeover long after the window is exact.

Nothing is skipped either: ids are drawn before their statements commit, so an id can be
missing below a visible one because its statement has not committed yet, or because it rolled
back. The relay stops at such a gap until every transaction that was running when it looked
again has ended (PostgreSQL's snapshot horizon): then the id can never appear and is passed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass

import asyncpg
from nats.aio.client import Client as NATS
from nats.js.errors import NotFoundError

from services.ledger.database.queries.outbox import (
    LEGACY_ANY,
    LEGACY_DELETE,
    LEGACY_MARK,
    LEGACY_TAKE,
    RELAY_ADVANCE,
    RELAY_EVENTS,
    RELAY_HORIZON,
    RELAY_LEDGER_ID,
    RELAY_START,
    RELAY_STATE,
    RELAY_TRY_LOCK,
)
from shared import natspy_internals, subjects

log = logging.getLogger("shardbus.ledger.relay")

LOCK_KEY = 0x5B_1ED6_0B0C
"""pg advisory lock key held by the one relay at work."""

BATCH = 256
"""Events taken per batch."""

SCAN_MAX = 4 * BATCH
"""At takeover, at most this many stream messages are read to find a dead relay's batch;
beyond that (other ledgers share the stream) JetStream's duplicate window is relied on."""

APPLICATION_NAME = "shardbus-ledger-relay"
"""The relay's session in pg_stat_activity (one per ledger replica, waiting or at work)."""

POLL_S = 1.0
"""How often a waiting replica tries for the lock."""

LOOK_S = 0.05
"""How often the relay looks for events it was not woken for (another replica's)."""

RETRY_MAX_S = 5.0
"""Longest pause after a failure (database or NATS away), doubling from ``POLL_S / 10``."""

PUBLISH_TIMEOUT_S = 5.0
"""How long one publish waits for the stream's acknowledgement."""

GAP_MAX_S = 60.0
"""Longest the relay waits at a missing id for the transactions that might still commit it.
Only ledger statements write the run log and each ends within its statement timeout (5 s),
so past this the id is rolled back even if an unrelated transaction holds the horizon."""

LEGACY_LOOK_S = POLL_S
"""How often the relay looks into the legacy outbox (older code may still write to it)."""


def message_id(ledger_id: str, event_id: int) -> str:
    """The ``Nats-Msg-Id`` of an event: unique across databases sharing one stream."""
    return f"{ledger_id}:{event_id}"


def payload(event_id: int, kind: str, run: str, resource: str | None) -> bytes:
    """The event as published (``run`` and ``resource`` are JSON text from PostgreSQL)."""
    tail = "" if resource is None else f',"resource":{resource}'
    return f'{{"eventId":{event_id},"type":{json.dumps(kind)},"run":{run}{tail}}}'.encode()


async def stop_task(task: asyncio.Task[None]) -> None:
    """Cancel ``task`` until it has ended. Once is not always enough on Python 3.11: a cancel
    that lands as a ``wait_for`` inside asyncpg (connect, pool acquire) completes is swallowed
    there, and the loop would carry on — seen as a ledger whose shutdown never ended."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=0.1)
    if not task.cancelled() and task.exception() is not None:
        log.warning("background task ended with an error", extra={"reason": repr(task.exception())})


@dataclass
class Gap:
    """An id missing just above the watermark: when it was first missed; at the look after, the
    first transaction not yet begun (``xmax``) and the newest id visible then (``upto``)."""

    missing: int
    seen_at: float
    xmax: int | None = None
    upto: int = 0
    warned: bool = False


class OutboxRelay:
    """Run with :meth:`start`; :meth:`wake` after a commit; :meth:`stop` at shutdown."""

    def __init__(self, dsn: str, nc: NATS, *, connect_timeout_s: float = 3.0) -> None:
        self._dsn = dsn
        self._nc = nc
        self._js = nc.jetstream(timeout=PUBLISH_TIMEOUT_S)
        self._connect_timeout_s = connect_timeout_s
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._through = 0
        self._already: set[int] = set()
        self._gap: Gap | None = None
        self._settled = 0
        """Every id up to this one that is not visible never will be (a gap passed)."""
        self.published = 0
        """Events published since it started (the ledger's metrics)."""

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="ledger-outbox-relay")

    def wake(self) -> None:
        """A change was committed here: look now rather than at the next poll."""
        self._wake.set()

    async def stop(self) -> None:
        if self._task is not None:
            await stop_task(self._task)
            self._task = None

    async def _run(self) -> None:
        pause = POLL_S / 10
        while True:
            try:
                await self._serve()
                pause = POLL_S / 10
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001  (database or NATS away: the events wait in the log)
                log.warning("outbox relay paused", extra={"reason": type(exc).__name__, "retry_s": pause})
                await asyncio.sleep(pause)
                pause = min(pause * 2, RETRY_MAX_S)

    async def _serve(self) -> None:
        conn: asyncpg.Connection = await asyncpg.connect(
            self._dsn, timeout=self._connect_timeout_s, server_settings={"application_name": APPLICATION_NAME})
        try:
            lock = RELAY_TRY_LOCK
            while not await conn.fetchval(lock.sql, *lock.args({"key": LOCK_KEY})):  # noqa: ASYNC110  (polls a lock)
                await asyncio.sleep(POLL_S)
            ledger_id = str(await conn.fetchval(RELAY_LEDGER_ID.sql))
            await self._take_over_legacy(conn, ledger_id)
            await self._take_over(conn, ledger_id)
            legacy_at = -LEGACY_LOOK_S
            while True:
                self._wake.clear()
                if time.monotonic() - legacy_at >= LEGACY_LOOK_S:
                    while await self._legacy_batch(conn, ledger_id) == BATCH:
                        pass
                    legacy_at = time.monotonic()
                while await self._batch(conn, ledger_id) == BATCH:
                    pass
                try:
                    await asyncio.wait_for(self._wake.wait(), LOOK_S)
                except TimeoutError:
                    pass
        finally:
            conn.terminate()  # ends the session: the lock goes with it

    async def _last_seq(self) -> int:
        info = await self._js.stream_info(subjects.LEDGER_EVENTS_STREAM)
        return info.state.last_seq

    async def _published_after(self, mark: int, ledger_id: str) -> list[int] | None:
        """The event ids of this ledger the stream holds after sequence ``mark``; None when the
        stream moved too far to read them all (the duplicate window is relied on then)."""
        last = await self._last_seq()
        if last - mark > SCAN_MAX:
            log.warning("outbox takeover: the stream moved too far to check; relying on its duplicate window",
                        extra={"after": mark, "last": last})
            return None
        prefix, found = f"{ledger_id}:", []
        for seq in range(mark + 1, last + 1):
            try:
                msg = await self._js.get_msg(subjects.LEDGER_EVENTS_STREAM, seq)
            except NotFoundError:  # deleted or aged out
                continue
            msg_id = (msg.headers or {}).get("Nats-Msg-Id", "")
            if msg_id.startswith(prefix) and msg_id[len(prefix):].isdigit():
                found.append(int(msg_id[len(prefix):]))
        return found

    async def _take_over(self, conn: asyncpg.Connection, ledger_id: str) -> None:
        """Read the watermark, and find the events a relay that died mid-batch had already
        published after its last finished batch: they are passed, not published again."""
        self._gap, self._already, self._settled = None, set(), 0
        through, stream_after = await conn.fetchrow(RELAY_STATE.sql)
        self._through = through
        if stream_after is None:
            await conn.execute(RELAY_START.sql, *RELAY_START.args({"seq": await self._last_seq()}))
            return
        found = await self._published_after(stream_after, ledger_id)
        self._already = {event_id for event_id in found or () if event_id > through}
        log.info("outbox takeover", extra={"already_published": len(self._already), "through": through})

    async def _batch(self, conn: asyncpg.Connection, ledger_id: str) -> int:
        """Publish the run log's events above the watermark, in id order, up to the first id
        that may still commit; how many entries the watermark moved past."""
        entries = await conn.fetch(RELAY_EVENTS.sql, *RELAY_EVENTS.args({"after": self._through, "batch": BATCH}))
        through, events = self._through, []
        for entry in entries:
            unsettled = entry["id"] != through + 1 and entry["id"] - 1 > self._settled
            if unsettled and not await self._gap_passed(conn, through + 1, entries[-1]["id"]):
                break
            through = entry["id"]
            if entry["run"] is not None and through not in self._already:
                events.append(entry)
        if through == self._through:
            return 0
        seq = await self._publish(ledger_id, [(e["id"], e["run_id"], e["kind"], e["run"], e["resource"])
                                              for e in events])
        await conn.execute(RELAY_ADVANCE.sql, *RELAY_ADVANCE.args({"through": through, "seq": seq}))
        moved = sum(1 for entry in entries if entry["id"] <= through)
        self._through = through
        self._already = {event_id for event_id in self._already if event_id > through}
        return moved

    async def _gap_passed(self, conn: asyncpg.Connection, missing: int, newest: int) -> bool:
        """Whether the id ``missing`` can no longer commit (nor any other below the newest id
        visible at the look after it was first missed: then they are all passed at once).
        The horizon is taken at that second look: by then a statement that drew such an id has
        its transaction id (every ledger statement writes a row before its log entries), so it
        is among those the horizon waits for."""
        gap = self._gap
        now = time.monotonic()
        if gap is None or gap.missing != missing:
            self._gap = Gap(missing, now)
            return False
        horizon = await conn.fetchrow(RELAY_HORIZON.sql)
        if gap.xmax is None:
            gap.xmax, gap.upto = int(horizon["xmax"]), newest
            return False
        waited = now - gap.seen_at
        if int(horizon["xmin"]) < gap.xmax and waited < GAP_MAX_S:
            if waited > GAP_MAX_S / 4 and not gap.warned:
                gap.warned = True
                log.warning("outbox relay waits for a transaction that may still commit an event",
                            extra={"missing": missing, "waited_s": round(waited, 1)})
            return False
        if waited >= GAP_MAX_S:
            log.warning("outbox relay passed ids no transaction committed within its wait",
                        extra={"from": missing, "through": gap.upto, "waited_s": round(waited, 1)})
        self._gap, self._settled = None, max(self._settled, gap.upto)
        return True

    async def _publish(self, ledger_id: str, events: list[tuple[int, str, str, str, str | None]]) -> int:
        """Publish ``(id, run id, type, run, resource)`` events in order; the stream's sequence
        of the last one (0: none)."""
        if not events:
            return 0
        # Published back to back on one connection, which JetStream stores in the order sent, and
        # the acknowledgements awaited together: one round trip a batch, not one an event (the
        # relay's waits were most of the ledger's NATS traffic under load, bench/ledger.py). Any
        # failure fails the batch, which is published again whole: the message ids drop repeats.
        await natspy_internals.ensure_publish_async_reply(self._js)  # once, before the first publish
        acks = [await self._js.publish_async(
                    subjects.ledger_run_events(run_id), payload(event_id, kind, run, resource),
                    stream=subjects.LEDGER_EVENTS_STREAM, headers={"Nats-Msg-Id": message_id(ledger_id, event_id)})
                for event_id, run_id, kind, run, resource in events]
        done = await asyncio.wait_for(asyncio.gather(*acks), PUBLISH_TIMEOUT_S)
        self.published += len(events)
        return max(ack.seq for ack in done)

    async def _take_over_legacy(self, conn: asyncpg.Connection, ledger_id: str) -> None:
        """Delete the legacy-outbox events a relay that died mid-batch had already published."""
        mark = await conn.fetchval(LEGACY_MARK.sql)
        if mark is None:
            return
        found = await self._published_after(mark, ledger_id)
        if found:
            await conn.execute(LEGACY_DELETE.sql, *LEGACY_DELETE.args({"ids": found}))
        log.info("outbox takeover (legacy outbox)", extra={"already_published": len(found or ())})

    async def _legacy_batch(self, conn: asyncpg.Connection, ledger_id: str) -> int:
        """Publish the legacy outbox's oldest events, in id order, and delete them; how many."""
        if not await conn.fetchval(LEGACY_ANY.sql):
            return 0
        mark = await self._last_seq()
        events = await conn.fetch(LEGACY_TAKE.sql, *LEGACY_TAKE.args({"mark": mark, "batch": BATCH}))
        events.sort(key=lambda e: e["id"])
        await self._publish(ledger_id, [(e["id"], e["run_id"], e["type"], e["run"], e["resource"]) for e in events])
        await conn.execute(LEGACY_DELETE.sql, *LEGACY_DELETE.args({"ids": [e["id"] for e in events]}))
        return len(events)
