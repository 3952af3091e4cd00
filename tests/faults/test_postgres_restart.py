"""Fault: the ledger's PostgreSQL (the test's own) is stopped for 5 s and started again on the
same port and data while two ledger processes serve a steady workload: every request type
(run created, moved to running and to completed, resource recorded, reserved, confirmed,
console read) sent every 100 ms. During the outage each is answered 503 at once (no hang, no
500, no password); after the restart each succeeds again within seconds; nothing is
half-applied: every 503'd request, retried with the same body (same run id, same
idempotency key), lands exactly once, and the tables and the run log hold exactly what the
answered requests did."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import nats
import pytest

from services.ledger.database import migrate
from shardbus import embedded
from shared import subjects
from tests.faults.shard_traffic import ShardTraffic
from tests.ledger.conftest import plain, wait_until_serving
from tests.processes import ServiceProcesses

pytestmark = pytest.mark.faults

EVERY_S, STOCK = 0.1, 200
"""Each request type is sent every 100 ms (70 requests/s in all), each time on a fresh one of
``STOCK`` targets prepared for it (more than the scenario uses, its waits drawn out to their
bounds included)."""

OUTAGE_S = 5.0
"""How long PostgreSQL stays away, at least."""

OUTAGE_AT_MOST_S = 10.0
"""Longest the outage is drawn out until every request type has been answered 503 in it."""

STEADY_WITHIN_S = 20.0
"""Longest wait, before the outage, for every request type to have been answered 200."""

REQUEST_TIMEOUT_S, PROMPT_S = 5.0, 1.0
"""A request unanswered this long is a hang; a 503 must come within the second."""

RESUME_WITHIN_S = 5.0
"""Longest acceptable time from the restart until every request type has succeeded again."""

SECRET = "pg-s3cret-7d41"
"""The password in the ledgers' database URL (trust auth ignores it); no answer or log may carry it."""

HOLDER = "holder"
"""The running run that every recorded, reserved and confirmed resource belongs to."""

STEPS = {"create": (subjects.LEDGER_RUN_CREATE, "scheduled", None, "run.created"),
         "running": (subjects.LEDGER_RUN_STATUS, "running", None, "run.status"),
         "completed": (subjects.LEDGER_RUN_STATUS, "completed", None, "run.status"),
         "record": (subjects.LEDGER_RESOURCE_RECORD, None, "confirmed", "resource.recorded"),
         "reserve": (subjects.LEDGER_RESOURCE_RESERVE, None, "pending", "resource.recorded"),
         "confirm": (subjects.LEDGER_RESOURCE_CONFIRM, None, "confirmed", "resource.confirmed"),
         "console": (subjects.LEDGER_CONSOLE, None, None, None)}
"""Each request type: its subject, the run status it sets, the resource status it sets, the
run-log entry it writes."""


@dataclass
class Sent:
    """One request and its answer (status 0: no answer in time)."""

    name: str
    run: str
    key: str | None = None
    resource_id: int = 0
    status: int = 0
    error: str = ""
    at: float = 0.0
    took: float = 0.0

    def body(self) -> dict:
        """The request's JSON body."""
        if self.name == "confirm":
            return {"resourceId": self.resource_id}
        if self.key:
            return {"runId": self.run, "module": "world", "kind": "creature", "ref": self.key,
                    "idempotencyKey": self.key}
        return {"runId": self.run, **({"shard": "uo1", "event": "pg"} if self.name == "create" else
                                      {"status": self.name} if STEPS[self.name][1] else {})}


async def ask(nc: nats.NATS, s: Sent) -> dict:
    """Send ``s``'s request; fill in its status, error and timing; the reply."""
    s.at = time.monotonic()
    try:
        reply = json.loads((await nc.request(STEPS[s.name][0], json.dumps(s.body()).encode(),
                                             timeout=REQUEST_TIMEOUT_S)).data)
    except Exception as exc:  # a timeout or no responders: the hang this test looks for
        reply = {"status": 0, "error": repr(exc)}
    s.status, s.error, s.took = reply["status"], reply.get("error", ""), time.monotonic() - s.at
    return reply


async def prepare(nc: nats.NATS, done: list[Sent]) -> dict[str, list[Sent]]:
    """Each type's ``STOCK`` requests, their targets made ready: runs to create, to move to
    running, to complete; keys to record or reserve; reserved rows to confirm."""
    gate = asyncio.Semaphore(16)  # a busy machine answers a few hundred a second: no pile-up

    async def must(s: Sent) -> Sent:
        async with gate:
            reply = await ask(nc, s)
        assert s.status == 200, s
        done.append(s)
        return Sent("confirm", s.run, s.key, reply["resource"]["resourceId"]) if s.name == "reserve" else s

    for name in ("create", "running"):
        await must(Sent(name, HOLDER))
    later = {"running": [Sent("create", f"s{i}") for i in range(STOCK)],
             "completed": [Sent("create", f"r{i}") for i in range(STOCK)],
             "confirm": [Sent("reserve", HOLDER, f"p{i}") for i in range(STOCK)]}
    await asyncio.gather(*(must(s) for s in later["running"] + later["completed"]))
    await asyncio.gather(*(must(Sent("running", s.run)) for s in later["completed"]))
    confirms = await asyncio.gather(*(must(s) for s in later["confirm"]))
    return {"create": [Sent("create", f"n{i}") for i in range(STOCK)],
            "running": [Sent("running", s.run) for s in later["running"]],
            "completed": [Sent("completed", s.run) for s in later["completed"]],
            "record": [Sent("record", HOLDER, f"a{i}") for i in range(STOCK)],
            "reserve": [Sent("reserve", HOLDER, f"b{i}") for i in range(STOCK)],
            "confirm": list(confirms), "console": [Sent("console", HOLDER) for _ in range(STOCK)]}


async def keep_sending(nc: nats.NATS, queue: list[Sent], sent: list[Sent], stop: asyncio.Event) -> None:
    """Send the queued requests one every ``EVERY_S`` until ``stop``."""
    for s in queue:
        if stop.is_set():
            return
        sent.append(s)
        await ask(nc, s)
        await asyncio.sleep(EVERY_S)
    raise AssertionError(f"{queue[0].name}: the prepared requests ran out")


def expected(done: list[Sent]) -> tuple[dict, dict, Counter]:
    """Runs → status, keys → (run, status), and the run log, as ``done`` (in order) left them."""
    runs, resources, log = {}, {}, Counter()
    for s in done:
        _, run_status, resource_status, kind = STEPS[s.name]
        runs.update({s.run: run_status} if run_status else {})
        resources.update({s.key: (s.run, resource_status)} if resource_status else {})
        if kind:
            log[kind, s.run, s.key or (run_status if kind == "run.status" else None)] += 1
    return runs, resources, log


async def read_db(db: asyncpg.Connection) -> tuple[dict, dict, Counter]:
    """What the tables hold, in the shapes of ``expected``."""
    runs = dict(await db.fetch("SELECT run_id, status FROM runs"))
    resources = {r[0]: (r[1], r[2]) for r in await db.fetch("SELECT idempotency_key, run_id, status FROM resources")}
    log = Counter(tuple(r) for r in await db.fetch(
        "SELECT l.kind, l.run_id, COALESCE(s.idempotency_key, l.detail->>'status') "
        "FROM run_log l LEFT JOIN resources s ON s.id = l.resource_id"))
    return runs, resources, log


def already_in(s: Sent, runs: dict, resources: dict) -> bool:
    """Whether the tables already hold what request ``s`` would change."""
    want_runs, want_resources, _ = expected([s])
    return bool(want_runs or want_resources) and want_runs.items() <= runs.items() \
        and want_resources.items() <= resources.items()


async def until_each_type(sent: list[Sent], status: int, since: float, timeout: float) -> set[str]:
    """Wait (at most ``timeout``) until each request type has been answered ``status`` to a
    request sent after ``since``; the types still waiting then."""
    def waiting() -> set[str]:
        return set(STEPS) - {s.name for s in sent if s.status == status and s.at > since}

    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            while waiting():
                await asyncio.sleep(0.02)
    return waiting()


async def ledger_pids(nc: nats.NATS) -> set[int]:
    """The pid of every ledger answering ``shardbus.ping`` within half a second."""
    inbox, pids = nc.new_inbox(), set()

    async def answered(msg) -> None:  # an empty message is NATS saying "no responders"
        if msg.data and (reply := json.loads(msg.data)).get("service") == "ledger":
            pids.add(reply["pid"])

    sub = await nc.subscribe(inbox, cb=answered)
    await nc.publish(subjects.PING, b"", reply=inbox)
    await asyncio.sleep(0.5)
    await sub.unsubscribe()
    return pids


@pytest.mark.timeout(180)
async def test_a_5_s_postgres_outage_is_answered_503_and_half_applies_nothing(nats_url, tmp_path):
    # Not under tmp_path: each new pytest session on this machine chmods pytest's temporary root
    # to 0700, which would lock PostgreSQL (run as its own user under root) out of its data.
    pg_dir = Path(tempfile.mkdtemp(prefix="shardbus-pg-restart-"))
    pgdata, port = pg_dir / "data", embedded.free_port()
    servers = [embedded.start_postgres(pgdata, port=port, durable=False)]
    procs = ServiceProcesses(tmp_path, nats_url)
    nc = await nats.connect(nats_url, connect_timeout=5, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    prepared: list[Sent] = []
    sent: list[Sent] = []
    stop, senders, traffic = asyncio.Event(), [], None
    try:
        traffic = await ShardTraffic.start(procs)
        servers[0].create_database("ledger")
        url = servers[0].url("ledger").replace("postgres@", f"postgres:{SECRET}@")
        db = await asyncpg.connect(plain(url), timeout=10)
        await db.execute(f"ALTER ROLE postgres PASSWORD '{SECRET}'")
        await db.close()
        await migrate.upgrade(url)
        ledgers = [procs.start("ledger", database_url=url, migrate_on_start="false") for _ in range(2)]
        await wait_until_serving(nc)
        if await ledger_pids(nc) != {ledger.proc.pid for ledger in ledgers}:  # it would take our requests
            pytest.skip("another ledger answers on this NATS: run this scenario on a NATS of its own")
        queues = await prepare(nc, prepared)
        senders = [asyncio.create_task(keep_sending(nc, queue, sent, stop)) for queue in queues.values()]
        began = time.monotonic()
        await asyncio.sleep(2.0)
        # Preconditions made to happen, each wait bounded: every type answered 200 before the
        # outage (a confirm among them, replayed below) and 503 during it.
        if left := await until_each_type(sent, 200, began, STEADY_WITHIN_S):
            raise AssertionError(f"before the outage, no 200 within {STEADY_WITHIN_S} s for {sorted(left)}")
        stopped = await asyncio.to_thread(servers[0].stop)  # fast shutdown: open transactions roll back
        assert stopped == 0, f"PostgreSQL did not shut down cleanly:\n{(pg_dir / 'data.log').read_text()[-2000:]}"
        stopped_at = time.monotonic()
        await asyncio.sleep(OUTAGE_S)
        if left := await until_each_type(sent, 503, stopped_at, stopped_at + OUTAGE_AT_MOST_S - time.monotonic()):
            raise AssertionError(f"in a {OUTAGE_AT_MOST_S:.0f} s outage, no 503 for {sorted(left)}")
        outage = time.monotonic() - stopped_at
        servers.append(await asyncio.to_thread(embedded.start_postgres, pgdata, port=port, durable=False))
        restarted_at = time.monotonic()
        await asyncio.sleep(3.0)
        # Watched until every type has succeeded again or the bound asserted below has passed,
        # so that a type slower than these 3 s is measured, not counted as never.
        await until_each_type(sent, 200, restarted_at, restarted_at + RESUME_WITHIN_S + 0.5 - time.monotonic())
        stop.set()
        await asyncio.wait_for(asyncio.gather(*senders), 2 * REQUEST_TIMEOUT_S)

        # A 503 could in principle follow a commit (connection lost before the answer): count
        # those, then retry every 503'd request with the same body; each must land once.
        failed = [s for s in sent if s.status == 503]
        db = await asyncpg.connect(plain(url), timeout=10)
        runs, resources, _ = await read_db(db)
        applied = sum(already_in(s, runs, resources) for s in failed)
        retries = [Sent(s.name, s.run, s.key, s.resource_id) for s in failed]
        for i in range(0, len(retries), 16):
            await asyncio.gather(*(ask(nc, r) for r in retries[i:i + 16]))
        # Every retry lands as a 200, a confirm too: one that had committed before its 503 is a
        # replay (statuses.is_replay), not a 409 saying "is confirmed".
        landed = [r for r in retries if r.status == 200]
        # A confirm answered before the outage, asked again after the restart: 200 with the row.
        before = next(s for s in sent if s.name == "confirm" and s.status == 200 and s.at < stopped_at)
        replay = Sent("confirm", before.run, before.key, before.resource_id)
        replay_reply = await ask(nc, replay)
        exp_runs, exp_resources, exp_log = expected(prepared + [s for s in sent if s.status == 200] + landed)
        runs, resources, log = await read_db(db)
        await db.close()
        await traffic.finish(nc)
    finally:
        stop.set()
        await asyncio.gather(*senders, return_exceptions=True)
        await nc.close()
        if traffic:
            traffic.stop()
        procs.stop_all()
        for server in servers:
            server.stop()
        shutil.rmtree(pg_dir, ignore_errors=True)

    other = [s for s in sent if s.status not in (200, 503)]
    resumed = max(min((s.at + s.took - restarted_at for s in sent  # each type's first success after the stop
                       if s.name == name and s.status == 200 and s.at > stopped_at), default=float("inf"))
                  for name in STEPS)
    got, want = Counter([*runs, *resources]) + log, Counter([*exp_runs, *exp_resources]) + exp_log
    lost, duplicated = sum((want - got).values()), sum((got - want).values())
    print(f"\npostgres stopped {outage:.1f} s: requests sent {len(sent)} (after {len(prepared)} preparing), "
          f"200 {len(sent) - len(failed) - len(other)}, 503 {len(failed)} (slowest "
          f"{max((s.took for s in failed), default=0):.3f} s), other {len(other)}; every request type succeeded "
          f"again {resumed:.2f} s after the restart; 503'd but applied {applied}, retried {len(retries)}, "
          f"landed {len(landed)}; rows in DB {len(runs)} runs + {len(resources)} resources vs expected "
          f"{len(exp_runs)} + {len(exp_resources)}; lost {lost}, duplicated {duplicated}; {traffic.line()}")

    assert not other, f"answers other than 200 and 503: {other[:5]}"
    assert all("unreachable" in s.error for s in failed), "a 503 should say why"
    assert max(s.took for s in failed) < PROMPT_S
    said = " ".join(s.error for s in sent + retries) + "".join(ledger.log() for ledger in procs.started)
    assert SECRET not in said, "the database password leaked into an answer or a log"
    assert resumed < RESUME_WITHIN_S
    assert len(landed) == len(retries), [r for r in retries if r not in landed][:5]
    assert replay.status == 200 and replay_reply["resource"]["status"] == "confirmed", replay_reply
    assert lost == 0 and duplicated == 0, f"missing {want - got}, extra {got - want}"
    assert (runs, resources) == (exp_runs, exp_resources), "a row's status differs from what the answers said"
    assert all(run in runs for run, _ in resources.values()), "a resource without its run"
    assert all(run in runs for _, run, _ in log), "a log entry without its run"
    traffic.check()
