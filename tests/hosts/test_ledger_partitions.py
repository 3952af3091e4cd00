"""The ledger cut from PostgreSQL in the middle of a batch, on real hosts (docs/reliability.md,
"Hosts", "The ledger cut from PostgreSQL"; issue 36). PostgreSQL, two ledgers, two cleanups, the
3-node NATS cluster and a gateway each on a host of their own; the test process plays the
website (runs created, resources recorded, runs ended, each ledger request retried with the same
payload until answered 2xx) and the shard's world (a simulated shard dialled into the gateway,
answering the cleanups' give-backs and counting each by serial). Once a burst of requests is in
flight and a statement is in flight on ledger A (its pool gauge), ledger A's host is cut from
the PostgreSQL host, both ways, for ``CUT_HELD_S``, then healed. The checker
(``ledger_checker.py``) then holds the whole history to the promises.

Needs root (``make test-hosts``); skipped with the reason elsewhere, failed instead when
``SHARDBUS_REQUIRE_HOSTS=1``."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import nats
import nats.errors
import pytest
from nats.aio.client import Client

from shared import subjects
from simulator.shard import ShardSimulator
from simulator.world import ShardWorld
from tests.hosts import harness, ledger_world
from tests.hosts import ledger_checker as checker
from tests.hosts.net import Host, Hosts, why_not_available
from tests.hosts.scene import wait_for

REASON = why_not_available()
if REASON is not None and os.environ.get("SHARDBUS_REQUIRE_HOSTS") == "1":
    pytest.fail(f"SHARDBUS_REQUIRE_HOSTS=1 but {REASON}", pytrace=False)
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

SHARD = "lh1"
CREATURES, LEASES = 20, 2
"""Each run spawns 20 creatures (one ``world.spawn``) and leases 2 values: 22 resources, recorded
at once (a burst the ledgers coalesce into batches, docs/ledger.md, "Hot subjects and batches")."""

EVERY_S = 0.25
"""A run is started every 0.25 s, from before the cut until ``AFTER_HEAL_S`` after the heal."""

AFTER_HEAL_S = 4.0

CUT_HELD_S = float(os.environ.get("SHARDBUS_HOSTS_LEDGER_CUT_S") or 8.0)
"""Longer than a statement may go unanswered (5 s statement timeout + 1 s, docs/reliability.md,
"PostgreSQL"): the statement cut mid-flight is given up on while the cut holds."""

ATTEMPT_S = float(os.environ.get("SHARDBUS_HOSTS_LEDGER_ATTEMPT_S") or 12.0)
"""An attempt's timeout at the website: the longest the docs let a request take while the
database is unreachable is a pooled connection waited for (5 s) plus a statement (5 + 1 s),
"acquire + statement ≈ 11 s" (docs/reliability.md, "PostgreSQL")."""

GIVE_UP_S = 90.0
"""How long the website retries one request (503s, timeouts) before counting it unfinished."""

CLEANUP = {"sweep_period_s": "0.3", "claim_timeout_s": "3", "command_timeout_s": "2", "ledger_timeout_s": "2",
           "max_attempts": "20", "reconcile_period_s": "3600"}
"""As the loopback fault suite's cleanups (tests/faults/workload.py, ``RUN_LOAD_CLEANUP``):
short periods, so giving back resumes within seconds of the heal."""


@dataclass
class Window:
    """When the cut began and ended (monotonic), to tell which attempts overlapped it."""

    cut_at: float | None = None
    healed_at: float | None = None

    def overlaps(self, start: float, end: float) -> bool:
        return self.cut_at is not None and start <= (self.healed_at or float("inf")) and end >= self.cut_at


@dataclass
class Website:
    """Ledger requests (each attempt recorded, retried with the same payload after a 503 or no
    answer) and shard commands (an idempotency key of their own, retried while unanswered)."""

    nc: Client
    attempts: list[checker.Attempt] = field(default_factory=list)
    unfinished: list[str] = field(default_factory=list)
    in_flight: int = 0
    commands: int = 0

    async def ledger(self, subject: str, body: dict[str, Any]) -> dict[str, Any]:
        payload = json.dumps(body, sort_keys=True).encode()
        key = f"{subject} {payload.decode()}"
        deadline = time.monotonic() + GIVE_UP_S
        self.in_flight += 1
        try:
            while True:
                start, status, reply = time.monotonic(), None, {}
                try:
                    msg = await self.nc.request(subject, payload, timeout=ATTEMPT_S)
                    reply = json.loads(msg.data)
                    status = int(reply.get("status", 0))
                except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
                    pass
                self.attempts.append(checker.Attempt(subject, key, status, start, time.monotonic() - start, False))
                if status is not None and 200 <= status < 300:
                    return reply
                if (status is not None and status != 503) or time.monotonic() > deadline:
                    self.unfinished.append(f"{key[:120]} → {status}")
                    raise AssertionError(f"{subject} not answered 2xx: {status} {reply}")
                await asyncio.sleep(0.2)
        finally:
            self.in_flight -= 1

    async def command(self, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        """A command to the shard through the gateway (not cut: retried only while unanswered)."""
        body = {**body, "idempotencyKey": hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:24]}
        deadline = time.monotonic() + GIVE_UP_S
        self.commands += 1
        while True:
            try:
                msg = await self.nc.request(f"shard.{SHARD}.cmd.{verb}", json.dumps(body).encode(), timeout=5)
                reply: dict[str, Any] = json.loads(msg.data)
                if reply.get("status") == 200:
                    return reply
                if reply.get("status") not in (503, 504):
                    raise AssertionError(f"{verb} answered {reply}")
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
                pass
            assert time.monotonic() < deadline, f"{verb} unanswered for {GIVE_UP_S} s"
            await asyncio.sleep(0.2)


@dataclass
class Workload:
    """Runs on the shard, each created, populated, recorded and ended by the website."""

    web: Website
    recorded: dict[str, tuple[str, str]] = field(default_factory=dict)
    """ref → (run, kind) of every resource the ledger answered 2xx for."""
    started: list[str] = field(default_factory=list)
    ended: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    """Runs the website could not walk through (a request or command never answered 2xx/200)."""

    async def one_run(self, run: str) -> None:
        await self.web.ledger(subjects.LEDGER_RUN_CREATE, {"runId": run, "shard": SHARD, "event": "invasion"})
        await self.web.ledger(subjects.LEDGER_RUN_STATUS, {"runId": run, "status": "running"})
        spawned = await self.web.command("world.spawn", {"runId": run, "what": "creature", "count": CREATURES})
        rows = [("creature", serial, {}) for serial in spawned["body"]["serials"]]
        for lease in range(LEASES):
            target = f"{run}-t{lease}"  # one spawner per lease: Spawner.MaxCount is a targeted key
            applied = await self.web.command("lease.apply", {"runId": run, "key": "Spawner.MaxCount", "target": target,
                                                             "value": "25", "holdMs": 3_600_000})
            rows.append(("lease", f"Spawner.MaxCount@{target}",
                         {"key": "Spawner.MaxCount", "target": target, "expected": "25",
                          "baseline": applied["body"]["baseline"]}))

        async def record(kind: str, ref: str, revert: dict[str, Any]) -> None:
            await self.web.ledger(subjects.LEDGER_RESOURCE_RECORD, {
                "runId": run, "module": "arena", "kind": kind, "ref": ref,
                "idempotencyKey": f"{run}:arena:{kind}:{ref}", "revert": revert})
            self.recorded[ref] = (run, kind)

        await asyncio.gather(*(record(*row) for row in rows))
        await self.web.ledger(subjects.LEDGER_RUN_STATUS, {"runId": run, "status": "cancelled"})
        self.ended.append(run)

    async def produce(self, stop: asyncio.Event) -> None:
        """A run every ``EVERY_S`` until ``stop``; then until every run started has ended."""
        tasks = []
        while not stop.is_set():
            run = f"lh-{len(self.started)}"
            self.started.append(run)
            tasks.append(asyncio.create_task(self.one_run(run)))
            await asyncio.sleep(EVERY_S)
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        self.failed = [(run, repr(out)[:200]) for run, out in zip(self.started, outcomes, strict=True)
                       if isinstance(out, BaseException)]


class Tally:
    """What the shard's world gave back: despawns by serial, lease releases by ``key@target``
    (a replay from the shard's idempotency cache never reaches the world)."""

    def __init__(self, world: ShardWorld) -> None:
        self.despawned = world.despawned
        self.released: Counter[str] = Counter()
        inner = world._lease_release

        def counting(body: dict[str, Any]) -> dict[str, Any]:
            self.released[f"{body.get('key')}@{body.get('target')}"] += 1
            return inner(body)

        world._lease_release = counting  # type: ignore[method-assign]


BATCH_WAITING = """
    SELECT pid, left(regexp_replace(query, '\\s+', ' ', 'g'), 60) AS query FROM pg_stat_activity
    WHERE host(client_addr) = $1 AND wait_event_type = 'Lock'
      AND query ILIKE '%unnest%' AND query ILIKE '%INSERT INTO resources%'"""
"""Ledger A's batches of records (``ADD_RESOURCES``: one statement over ``unnest`` arrays,
docs/ledger.md, "Hot subjects and batches") waiting on a lock."""


async def cut_mid_batch(hosts: Hosts, ledger_host: Host, pg_host: Host, url: str, nc: Client, window: Window,
                        notes: dict[str, object]) -> None:
    """Made to happen, not hoped for: the test's own session takes ``resources`` in SHARE mode
    (inserts and updates wait, reads go on) until one of ledger A's batch statements is seen
    waiting on it (``pg_stat_activity``, at most 2 s, then released and tried again — below the
    5 s statement timeout); then ledger A's host drops every packet to and from the PostgreSQL
    host, the lock is released, and the batch runs and commits on the server while its answer
    cannot reach the ledger. Held ``CUT_HELD_S``; healed."""
    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"), timeout=10)
    try:
        for attempt in range(1, 21):
            tx = conn.transaction()
            await tx.start()
            await conn.execute("LOCK TABLE resources IN SHARE MODE")
            waiting: list[asyncpg.Record] = []
            deadline = time.monotonic() + 2.0
            while not waiting and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
                waiting = await conn.fetch(BATCH_WAITING, ledger_host.address)
            if not waiting:
                await tx.rollback()
                await asyncio.sleep(0.3)
                continue
            await asyncio.to_thread(hosts.cut, ledger_host, [pg_host])
            window.cut_at = time.monotonic()
            await tx.rollback()  # the lock released: the batch runs, commits, and answers into the cut
            notes["tries"] = attempt
            notes["batch statements of ledger A cut mid-flight"] = [r["query"] for r in waiting]
            try:
                ran = await _finished(conn, [r["pid"] for r in waiting], 5.0)
                notes["committed on the server during the cut"] = ran
                await asyncio.sleep(max(0.0, CUT_HELD_S - (time.monotonic() - window.cut_at)))
                notes["events committed and not yet published just before the heal"] = await _unpublished(conn, nc)
            finally:
                await asyncio.to_thread(hosts.heal, ledger_host)
                window.healed_at = time.monotonic()
            return
        raise AssertionError("in 20 tries no batch of ledger A waited on the lock")
    finally:
        await conn.close()


async def _unpublished(conn: asyncpg.Connection, nc: Client) -> int | str:
    """Run-log entries carrying an event less the messages in ``LEDGER_EVENTS`` (the relay's
    backlog, as far as the stream's leader knows)."""
    committed = int(await conn.fetchval("SELECT count(*) FROM run_log WHERE run IS NOT NULL"))
    try:
        info = await harness.stream_info(nc, subjects.LEDGER_EVENTS_STREAM)
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
        return repr(exc)
    return committed - int((info.get("state") or {}).get("messages") or 0)


async def _finished(conn: asyncpg.Connection, pids: list[int], timeout: float) -> bool:
    """Whether those backends' statements ended (the session idle, or gone) within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        busy = await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1::int[]) "
                                   "AND state = 'active'", pids)
        if busy == 0:
            return True
        await asyncio.sleep(0.05)
    return False


async def relay_on(url: str, ledgers: dict[str, Host]) -> str:
    """Which ledger's relay is at work: the address of the session holding an advisory lock
    (docs/ledger.md, "Update events"); "none" while no relay holds it."""
    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"), timeout=10)
    try:
        addresses = [str(r["client_addr"]) for r in await conn.fetch(
            "SELECT a.client_addr FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted")]
    finally:
        await conn.close()
    by_address = {host.address: name for name, host in ledgers.items()}
    return ", ".join(by_address.get(a, a) for a in addresses) or "none"


async def read_log(url: str) -> list[dict[str, Any]]:
    """Every run-log entry that carries an event (docs/ledger.md, "Update events")."""
    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"), timeout=10)
    try:
        return [dict(r) for r in await conn.fetch(
            "SELECT id, run_id, resource_id, kind FROM run_log WHERE run IS NOT NULL ORDER BY id")]
    finally:
        await conn.close()


def keep(workdir: Path, name: str) -> Path:
    """The run's logs, kept beyond pytest's rotation: ``SHARDBUS_HOSTS_OUT``, else ``.hosts-runs/``."""
    root = Path(os.environ.get("SHARDBUS_HOSTS_OUT") or Path(__file__).resolve().parents[2] / ".hosts-runs")
    target = root / f"{time.strftime('%Y%m%dT%H%M%S')}-{name.replace(' ', '-')}"
    target.mkdir(parents=True, exist_ok=True)
    for path in workdir.iterdir():
        if path.is_file() and path.suffix in {".log", ".json"}:
            shutil.copy2(path, target / path.name)
    return target


async def all_clean(nc: Client, runs: list[str]) -> bool:
    try:
        msg = await nc.request(subjects.LEDGER_RUNS, json.dumps({"cleanupStatus": "complete", "limit": 1000}).encode(),
                               timeout=5)
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
        return False
    return {r["runId"] for r in json.loads(msg.data).get("runs", [])} >= set(runs)


async def console(nc: Client, run: str) -> dict[str, Any]:
    for _ in range(10):
        try:
            msg = await nc.request(subjects.LEDGER_CONSOLE, json.dumps({"runId": run}).encode(), timeout=5)
            reply: dict[str, Any] = json.loads(msg.data)
            if reply.get("status") == 200:
                return reply
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
            pass
        await asyncio.sleep(0.5)
    raise TimeoutError(f"no console of {run}")


async def test_a_ledger_cut_from_postgresql_mid_batch_loses_and_repeats_nothing(tmp_path: Path) -> None:
    name = "ledger cut from postgresql"
    started_at = time.monotonic()
    processes = harness.Processes(tmp_path)
    notes: dict[str, object] = {}
    window = Window()
    verdict = checker.LedgerVerdict()
    pg_dir = Path(tempfile.mkdtemp(prefix="shardbus-hosts-pg-"))
    with Hosts(tmp_path) as hosts:
        try:
            nats_hosts = [hosts.add(f"nats{i}") for i in (1, 2, 3)]
            gw_host, pg_host = hosts.add("gw"), hosts.add("pg")
            ledger_hosts = [hosts.add("ledgera"), hosts.add("ledgerb")]
            cleanup_hosts = [hosts.add("cleanupa"), hosts.add("cleanupb")]
            nodes = harness.start_cluster(processes, nats_hosts, tmp_path)
            ledger_world.start_postgres(processes, pg_host, tmp_path, pg_dir, trusted=f"{hosts.net}.0/24")
            url = ledger_world.database_url(pg_host)
            notes["migrate"] = ledger_world.migrate(ledger_hosts[0], url, tmp_path)
            harness.start_gateway(processes, gw_host, nodes, tmp_path)
            # Ledger A first, and B only once A's relay holds the lock: the cut then also meets the
            # relay's own session (events committed and not yet published wait out the cut).
            named = {"ledger A": ledger_hosts[0], "ledger B": ledger_hosts[1]}
            ledgers = [ledger_world.start_ledger(processes, ledger_hosts[0], nodes, url, tmp_path)]
            await wait_for("ledger A's relay holds the lock", lambda: _relay_is(url, named, "ledger A"), 30)
            ledgers.append(ledger_world.start_ledger(processes, ledger_hosts[1], nodes, url, tmp_path))
            nc = await harness.connect(nodes)
            world = ShardWorld()
            tally = Tally(world)
            sim = ShardSimulator(gw_host.address, harness.SHARD_PORT, SHARD, harness.TOKEN, world=world)
            try:
                await sim.connect(timeout=10)
                # Cleanups started in threads: the shard, on this loop, keeps answering meanwhile.
                for host in cleanup_hosts:
                    await asyncio.to_thread(ledger_world.start_service, processes, "cleanup", host, nodes,
                                            tmp_path, **CLEANUP)
                web = Website(nc)
                await wait_for("the shard answers through the gateway",
                               lambda: _answers(nc), 30)
                work = Workload(web)
                stop = asyncio.Event()
                producing = asyncio.create_task(work.produce(stop))
                await wait_for("5 runs ended before the cut", lambda: len(work.ended) >= 5 or producing.done(), 60)
                notes["relay before the cut"] = await relay_on(url, named)
                before = ledgers[0].log().count('"database unreachable"')
                await cut_mid_batch(hosts, ledger_hosts[0], pg_host, url, nc, window, notes)
                notes["ledger A answered 503 (database unreachable)"] = (
                    ledgers[0].log().count('"database unreachable"') - before)
                await asyncio.sleep(AFTER_HEAL_S)
                stop.set()
                await asyncio.wait_for(producing, GIVE_UP_S + 30)
                notes["runs produced (s)"] = round(time.monotonic() - started_at, 1)
                cleaned_from = time.monotonic()
                try:
                    await wait_for("every run's cleanup complete", lambda: all_clean(nc, work.ended), 120, every=0.5)
                    notes["every cleanup complete within (s) of the last run ended"] = round(
                        time.monotonic() - cleaned_from, 1)
                except TimeoutError:
                    notes["every cleanup complete"] = "not within 120 s"
                notes["relay after"] = await relay_on(url, named)
                consoles = {run: await console(nc, run) for run in work.ended}
                log = await read_log(url)
                try:
                    await wait_for("the relay published every event", lambda: _published(nc, len(log)), 60, every=0.5)
                except TimeoutError:
                    notes["events published"] = "fewer than changes 60 s after"
                events = [json.loads(data) for _subject, data in
                          await harness.read_through_leader(nc, subjects.LEDGER_EVENTS_STREAM)]
                for attempt in web.attempts:
                    attempt.during_cut = window.overlaps(attempt.started, attempt.started + attempt.elapsed)
                (tmp_path / "attempts.json").write_text(json.dumps(
                    {"cut_at": window.cut_at, "healed_at": window.healed_at,
                     "attempts": [vars(a) for a in web.attempts]}))
                slow = sorted(a.elapsed for a in web.attempts if a.during_cut and a.status is not None)
                spanning = Counter(str(a.status) for a in web.attempts if window.cut_at is not None
                                   and a.started < window.cut_at < a.started + a.elapsed)
                notes["website attempts in flight at the cut, answered"] = dict(spanning)
                notes["answers during the cut slower than 5 s"] = sum(1 for e in slow if e > 5)
                checker.check_requests(verdict, web.attempts, web.unfinished)
                checker.check_give_backs(verdict, work.recorded, tally.despawned, tally.released)
                checker.check_runs(verdict, work.ended, consoles, work.failed)
                checker.check_events(verdict, log, events)
                notes["shard commands"] = web.commands
            finally:
                await sim.close()
                await nc.close()
        finally:
            processes.stop_all()
            shutil.rmtree(pg_dir, ignore_errors=True)
            kept = keep(tmp_path, name)
    elapsed = time.monotonic() - started_at
    shown = "".join(f"; {key} {value}" for key, value in notes.items() if key != "migrate")
    line = f"hosts, {name}: {verdict.summary()}{shown}; {elapsed:.0f} s"
    print(f"\n{line}")
    (kept / "summary.txt").write_text(line + "\n" + "\n".join(verdict.violations) + "\n")
    assert hosts.leftovers() == []
    assert not verdict.violations, "\n".join(verdict.violations)


async def _answers(nc: Client) -> bool:
    try:
        msg = await nc.request(f"shard.{SHARD}.cmd.lease.list", b"{}", timeout=2)
        return bool(json.loads(msg.data).get("status") == 200)
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
        return False


async def _published(nc: Client, changes: int) -> bool:
    try:
        info = await harness.stream_info(nc, subjects.LEDGER_EVENTS_STREAM)
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
        return False
    return int((info.get("state") or {}).get("messages") or 0) >= changes


async def _relay_is(url: str, ledgers: dict[str, Host], name: str) -> bool:
    return await relay_on(url, ledgers) == name
