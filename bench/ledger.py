"""Benchmark: the ledger's guarded transitions over NATS, and its run console's latency.

From one run against one PostgreSQL (embedded, durable settings as deployed) and one
nats-server, with a real ``shardbus run ledger`` process:

1. reserve+confirm through the ledger over NATS with 1, 8, 32 and 128 concurrent clients, each
   pair two guarded transitions with their run-log entries and update events
   (``transitions_by_clients``; ``transitions_per_s`` is the figure at 32), with the CPU
   microseconds per transition of every process in the path (ledger, nats-server, PostgreSQL
   with its backends, the bench's own client), read from /proc through psutil;
2. the raw baseline in the same run at the same levels: asyncpg, one connection per client (at
   most 64), the same INSERT (reserve) and guarded ``UPDATE … WHERE status IN ('pending')``
   (confirm), without log or events (``raw_updates_per_s``), with its CPU per transition. Each
   level is ``--rounds`` rounds (default 3; this machine's speed wanders within a minute), each
   round a slice of the ledger and one of raw in turn (the first of the two alternating round
   to round), ``--seconds / --rounds`` each. Every round's figures are kept (``rounds``); a
   level's figures are their medians, and ``transition_ratio`` is the median of the rounds'
   ratios at 32 clients (target >= 1.0, issue 15);
3. what the update event costs, in the same run, straight through asyncpg with the ledger
   stopped: the reserve+confirm statements with their one run-log entry each, without and with
   the event's run and resource JSON on that entry (ADR 0009; ``event_cost_ratio``, the median
   of ``--rounds`` interleaved rounds), and how fast the relay then publishes the events left
   above its watermark into JetStream (``relay_events_per_s``, a ledger started on that backlog);
4. the run console's first page (run, 1,000 resources, counts, unresolved) over NATS in a
   database of 1,000,000 resources (generated set-based with ``generate_series``, once), the
   suite idle: in each of the ``--rounds`` rounds, p50/p99 over ``CONSOLE_READS`` requests
   after 20 unmeasured ones (``console_p99_ms`` is the median of the rounds' p99s; target
   <= 10 ms, issue 27), beside a render of the page alone through asyncpg, nothing kept
   (``console_sql_*``: what a read costs after the run changed).

Run alone: ``python bench/ledger.py [--rows N] [--seconds S] [--rounds R]``; writes
``bench/results/ledger.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import asyncpg
import nats
import psutil

from shardbus import embedded
from shared import subjects
from shared.health import health_file_is_fresh

CLIENTS = 32
"""Concurrent clients in the transition phases (ledger and raw alike)."""

CONSOLE_ROWS = 1000
"""Resources of the run whose console is read."""

CONSOLE_READS = 300
"""Console reads measured in each round (after 20 unmeasured warm-up reads)."""


def _plain(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


async def ledger_transitions(nats_url: str, seconds: float, clients: int = CLIENTS) -> tuple[float, int, int]:
    """reserve+confirm pairs by ``clients`` concurrent callers through the ledger for ``seconds``;
    transitions/s, errors and transitions made."""
    nc = await nats.connect(nats_url)
    run = f"bench-{os.getpid()}-{time.monotonic_ns()}"
    await nc.request(subjects.LEDGER_RUN_CREATE, json.dumps({"runId": run, "shard": "uo1", "event": "bench"}).encode(),
                     timeout=5)
    await nc.request(subjects.LEDGER_RUN_STATUS, json.dumps({"runId": run, "status": "running"}).encode(), timeout=5)
    done, errors = 0, 0
    stop = time.perf_counter() + seconds

    async def client(n: int) -> None:
        nonlocal done, errors
        i = 0
        while time.perf_counter() < stop:
            i += 1
            ref = f"{run}-{n}-{i}"
            body = {"runId": run, "module": "bench", "kind": "creature", "ref": ref, "idempotencyKey": f"L{ref}"}
            reply = json.loads((await nc.request(subjects.LEDGER_RESOURCE_RESERVE, json.dumps(body).encode(),
                                                 timeout=10)).data)
            if reply["status"] != 200:
                errors += 1
                first_error[:] = first_error or [reply]
                continue
            confirm = json.loads((await nc.request(subjects.LEDGER_RESOURCE_CONFIRM, json.dumps(
                {"resourceId": reply["resource"]["resourceId"]}).encode(), timeout=10)).data)
            if confirm["status"] == 200:
                done += 2
            else:
                errors += 1
                first_error[:] = first_error or [confirm]

    first_error: list[dict] = []
    started = time.perf_counter()
    await asyncio.gather(*(client(n) for n in range(clients)))
    elapsed = time.perf_counter() - started
    await nc.close()
    if first_error:
        print(f"ledger, {clients} clients: {errors} errors, the first: {first_error[0]}")
    return done / elapsed, errors, done


async def coalescer_stats(nats_url: str) -> dict[str, dict[str, int]]:
    """The ledger's coalescer counts (its health reply)."""
    nc = await nats.connect(nats_url)
    try:
        return json.loads((await nc.request(subjects.health("ledger"), b"", timeout=5)).data)["coalescers"]
    finally:
        await nc.close()


def batch_sizes(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, float]:
    """Requests per statement of reserve and confirm between two readings of the counts."""
    sizes = {}
    for name in ("reserve", "confirm"):
        requests = after[name]["requests"] - before[name]["requests"]
        statements = (after[name]["batches"] - before[name]["batches"]) + (after[name]["alone"] - before[name]["alone"])
        sizes[name] = round(requests / statements, 2) if statements else 0.0
    return sizes


async def raw_transitions(db_url: str, seconds: float, clients: int = CLIENTS) -> tuple[float, int]:
    """The same reserve (INSERT) + guarded confirm (UPDATE) straight through asyncpg."""
    return await _pairs_through_asyncpg(db_url, seconds, "raw", _RAW_RESERVE, _RAW_CONFIRM, clients)


_RAW_RESERVE = ("INSERT INTO resources (run_id, module, kind, ref, status, idempotency_key) "
                "VALUES ($1, 'raw', 'creature', $2, 'pending', $3) "
                "ON CONFLICT (idempotency_key) DO NOTHING RETURNING id")
_RAW_CONFIRM = ("UPDATE resources SET status = 'confirmed', updated_at = now() WHERE id = $1 AND status = ANY($2) "
                "RETURNING *")


RAW_CONNECTIONS_MAX = 64
"""The most connections the raw baseline opens (the server allows 100); more clients share them."""


async def _pairs_through_asyncpg(db_url: str, seconds: float, name: str, reserve: str, confirm: str,
                                 clients: int = CLIENTS) -> tuple[float, int]:
    """``clients`` callers (on at most RAW_CONNECTIONS_MAX connections) each running ``reserve``
    ($1 run, $2 ref, $3 key → id) then ``confirm`` ($1 id, $2 allowed) for ``seconds``;
    transitions/s and transitions made."""
    size = min(clients, RAW_CONNECTIONS_MAX)
    pool = await asyncpg.create_pool(_plain(db_url), min_size=size, max_size=size)
    run = f"{name}-{os.getpid()}-{time.monotonic_ns()}"
    await pool.execute("INSERT INTO runs (run_id, shard, event, status) VALUES ($1, 'uo1', 'bench', 'running')", run)
    done = 0
    stop = time.perf_counter() + seconds

    async def client(n: int) -> None:
        nonlocal done
        i = 0
        while time.perf_counter() < stop:
            async with pool.acquire() as conn:
                i += 1
                ref = f"{run}-{n}-{i}"
                rid = await conn.fetchval(reserve, run, ref, ref)
                if await conn.fetchval(confirm, rid, ["pending"]) is not None:
                    done += 2

    started = time.perf_counter()
    await asyncio.gather(*(client(n) for n in range(clients)))
    elapsed = time.perf_counter() - started
    await pool.close()
    return done / elapsed, done


_LOGGED_RESERVE = """
    WITH ins AS (
        INSERT INTO resources (run_id, module, kind, ref, status, idempotency_key)
        VALUES ($1, 'raw', 'creature', $2, 'pending', $3) ON CONFLICT (idempotency_key) DO NOTHING RETURNING *
    ), logged AS ({logged})
    SELECT id FROM ins"""
_LOGGED_CONFIRM = """
    WITH changed AS (
        UPDATE resources SET status = 'confirmed', updated_at = now() WHERE id = $1 AND status = ANY($2) RETURNING *
    ), logged AS ({logged})
    SELECT id FROM changed"""
_LOG_ONLY = """
        INSERT INTO run_log (run_id, resource_id, kind, detail)
        SELECT run_id, id, '{kind}', jsonb_build_object('status', status) FROM {source}"""
_LOG_WITH_EVENT = """
        INSERT INTO run_log (run_id, resource_id, kind, detail, run, resource)
        SELECT c.run_id, c.id, '{kind}', jsonb_build_object('status', c.status),
               json_build_object('runId', r.run_id, 'status', r.status), row_to_json(c)
        FROM {source} c JOIN runs r ON r.run_id = c.run_id"""


async def logged_transitions(db_url: str, seconds: float, event: bool) -> float:
    """reserve+confirm as the ledger's statements write them, each with its one run-log entry,
    without or with the update event's run and resource JSON on that entry (ADR 0009: the log is
    the event source); transitions/s through asyncpg."""
    log = _LOG_WITH_EVENT if event else _LOG_ONLY
    reserve = _LOGGED_RESERVE.format(logged=log.format(kind="resource.recorded", source="ins"))
    confirm = _LOGGED_CONFIRM.format(logged=log.format(kind="resource.confirmed", source="changed"))
    return (await _pairs_through_asyncpg(db_url, seconds, f"logged{int(event)}", reserve, confirm))[0]


_ABOVE_WATERMARK = "SELECT count(*) FROM run_log WHERE id > (SELECT relayed_through FROM ledger_relay)"


async def events_waiting(db_url: str) -> int:
    """Update events in the run log the relay has not yet moved its watermark past."""
    conn = await asyncpg.connect(_plain(db_url))
    try:
        return await conn.fetchval(_ABOVE_WATERMARK + " AND run IS NOT NULL")
    finally:
        await conn.close()


async def drain_time(db_url: str, timeout: float = 300.0) -> float:
    """Seconds until the relay's watermark is past every run-log entry (a relay at work)."""
    conn = await asyncpg.connect(_plain(db_url))
    started = time.perf_counter()
    try:
        while await conn.fetchval(_ABOVE_WATERMARK) and time.perf_counter() - started < timeout:
            await asyncio.sleep(0.02)
        return time.perf_counter() - started
    finally:
        await conn.close()


async def fill(db_url: str, rows: int) -> str:
    """``rows`` resources over runs of 1,000 each, set-based; the id of one such run."""
    conn = await asyncpg.connect(_plain(db_url))
    try:
        runs = max(1, rows // CONSOLE_ROWS)
        await conn.execute("""
            INSERT INTO runs (run_id, shard, event, status, cleanup_status)
            SELECT 'fill-' || g, 'uo1', 'invasion', 'completed', 'complete' FROM generate_series(1, $1) g""", runs)
        await conn.execute("""
            INSERT INTO resources (run_id, module, kind, ref, status, revert, idempotency_key, attempts)
            SELECT 'fill-' || (1 + g / $2::int), 'world', 'creature', 'serial-' || g,
                   (ARRAY['reverted', 'expired', 'reverted', 'drifted', 'orphaned'])[1 + g % 5],
                   jsonb_build_object('serial', g, 'what', 'creature'), 'fill-' || g, g % 3
            FROM generate_series(0, $1::int * $2::int - 1) g""", runs, CONSOLE_ROWS)
        await conn.execute("ANALYZE")
        return f"fill-{runs // 2 + 1}"
    finally:
        await conn.close()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def console_latency(nats_url: str, db_url: str, run_id: str) -> dict[str, float]:
    """Console reads over NATS (pages the ledger keeps, the run unchanged), and the page's
    render alone (nothing kept: the cost of the first read after a change), one after another."""
    from services.ledger import console
    from services.ledger.console_cache import cache_of
    from services.ledger.database.store import Database

    nc = await nats.connect(nats_url)
    body = json.dumps({"runId": run_id}).encode()
    over_nats = []
    for i in range(CONSOLE_READS + 20):
        started = time.perf_counter()
        data = (await nc.request(subjects.LEDGER_CONSOLE, body, timeout=10)).data
        if i >= 20:  # until the reply's bytes are here, as for the SQL alone (parsing is the caller's)
            over_nats.append((time.perf_counter() - started) * 1000)
    reply = json.loads(data)
    assert reply["status"] == 200 and len(reply["resources"]) == CONSOLE_ROWS, reply.get("error")
    await nc.close()
    engine = Database(db_url, pool_size=1)
    await engine.open()
    cache_of(engine).capacity = 0  # every read renders
    sql_only = []
    for i in range(CONSOLE_READS + 20):
        started = time.perf_counter()
        await console.console(engine, run_id)
        if i >= 20:
            sql_only.append((time.perf_counter() - started) * 1000)
    await engine.close()
    return {"console_p50_ms": round(statistics.median(over_nats), 2),
            "console_p99_ms": round(_percentile(over_nats, 0.99), 2),
            "console_sql_p50_ms": round(statistics.median(sql_only), 2),
            "console_sql_p99_ms": round(_percentile(sql_only, 0.99), 2),
            "console_bytes": len(json.dumps(reply))}


CLIENT_LEVELS = (1, 8, 32, 128)
"""Concurrent callers of the transition sweep (ledger and raw alike); the ratio at 32 is the figure."""


def _cpu_s(proc: psutil.Process, with_children: bool) -> float:
    """CPU seconds ``proc`` has used; with its children (PostgreSQL's backends), the live ones and
    those it has reaped."""
    times = proc.cpu_times()
    total = times.user + times.system
    if with_children:
        total += times.children_user + times.children_system
        for child in proc.children(recursive=True):
            try:
                child_times = child.cpu_times()
                total += child_times.user + child_times.system
            except psutil.NoSuchProcess:
                pass
    return total


ROUNDS = 3
"""Rounds of each transition level and of the console read (``--rounds``)."""


def _median(values: list[float], digits: int = 3) -> float:
    return round(statistics.median(values), digits)


def console_rounds(rounds: list[dict[str, float]]) -> dict[str, Any]:
    """The console's figures: each the median of the rounds', and every round's."""
    return {**{key: _median([r[key] for r in rounds], 2) for key in rounds[0] if key != "console_bytes"},
            "console_bytes": rounds[0]["console_bytes"], "console_rounds": rounds}


class Tally:
    """Transitions, seconds and CPU seconds per process summed over a phase's slices."""

    def __init__(self) -> None:
        self.ops, self.seconds, self.errors = 0, 0.0, 0
        self.used: dict[str, float] = {}

    def add(self, cpu: CpuMeter, ops: int, seconds: float, errors: int) -> None:
        self.ops, self.seconds, self.errors = self.ops + ops, self.seconds + seconds, self.errors + errors
        for name, used in cpu.used.items():
            self.used[name] = self.used.get(name, 0.0) + used

    def rate(self) -> float:
        return self.ops / self.seconds if self.seconds else 0.0

    def per_op_us(self) -> dict[str, float]:
        per = {name: round(used * 1e6 / max(self.ops, 1), 1) for name, used in self.used.items()}
        per["total"] = round(sum(per.values()), 1)
        return per


class CpuMeter:
    """CPU seconds of each process in a path, read before and after a phase."""

    def __init__(self, **procs: tuple[int, bool]) -> None:
        self.procs = {name: (psutil.Process(pid), children) for name, (pid, children) in procs.items()}
        self.start: dict[str, float] = {}

    def __enter__(self) -> CpuMeter:
        self.start = {name: _cpu_s(proc, children) for name, (proc, children) in self.procs.items()}
        return self

    def __exit__(self, *exc: object) -> None:
        self.used = {name: _cpu_s(proc, children) - self.start[name]
                     for name, (proc, children) in self.procs.items()}

    def per_op_us(self, ops: int) -> dict[str, float]:
        """CPU microseconds per operation of each process, and their total."""
        per = {name: round(used * 1e6 / max(ops, 1), 1) for name, used in self.used.items()}
        per["total"] = round(sum(per.values()), 1)
        return per


def start_ledger(tmp: Path, nats_url: str, db_url: str) -> subprocess.Popen:
    health = tmp / "ledger.health"
    env = {**os.environ, "SHARDBUS_NATS_URL": nats_url, "SHARDBUS_DATABASE_URL": db_url,
           "SHARDBUS_HEALTH_FILE": str(health), "SHARDBUS_LOG_LEVEL": "WARNING",
           "SHARDBUS_DB_POOL_SIZE": os.environ.get("SHARDBUS_DB_POOL_SIZE", "10")}
    with open(tmp / "ledger.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "shardbus", "run", "ledger"], env=env, cwd=ROOT,
                                stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not health_file_is_fresh(str(health)):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"ledger did not start: {(tmp / 'ledger.log').read_text()[-2000:]}")
        time.sleep(0.1)
    return proc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="resources in the database for the console read")
    parser.add_argument("--seconds", type=float, default=8.0, help="duration of each transition phase")
    parser.add_argument("--clients", default=",".join(map(str, CLIENT_LEVELS)),
                        help="client levels of the transition phases, comma-separated (must hold 32 for a full run)")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help="rounds of each transition level (ledger and raw in turn) and of the console read (>= 3)")
    parser.add_argument("--only", choices=("all", "transitions"), default="all",
                        help="transitions: the ledger and raw transition phases only, printed, no JSON written")
    args = parser.parse_args()
    if args.rounds < 3:
        parser.error("--rounds: at least 3 (a median of fewer says little on this machine)")
    levels = [int(n) for n in args.clients.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="bench-ledger-", dir="/tmp"))
    nats_server = embedded.start_nats(tmp / "nats")
    pg = embedded.start_postgres(tmp / "pg", durable=True)
    ledger = None
    try:
        pg.create_database("bench")
        db_url = pg.url("bench")
        subprocess.run([sys.executable, "-m", "shardbus", "migrate", "--database-url", db_url], cwd=ROOT,
                       check=True, capture_output=True)
        ledger = start_ledger(tmp, nats_server.url, db_url)
        sweep: dict[int, dict] = {}
        lag_s = 0.0
        ledger_procs = {"ledger": (ledger.pid, True), "nats_server": (nats_server.proc.pid, False),
                        "postgres": (pg.proc.pid, True), "bench_client": (os.getpid(), False)}
        raw_procs = {"postgres": (pg.proc.pid, True), "bench_client": (os.getpid(), False)}
        for clients in levels:
            # Rounds of a ledger slice and a raw slice in turn, the first of the two alternating,
            # so that both meet the machine as it is (its speed wanders by half within a minute
            # here): each round's ratio is kept, the level's figures are the rounds' medians.
            mine, raw_tally = Tally(), Tally()
            rounds: list[dict[str, Any]] = []
            counted = asyncio.run(coalescer_stats(nats_server.url))
            for n in range(args.rounds):
                figures: dict[str, Any] = {"first": "ledger" if n % 2 == 0 else "raw"}
                for side in ("ledger", "raw") if n % 2 == 0 else ("raw", "ledger"):
                    if side == "ledger":
                        with CpuMeter(**ledger_procs) as cpu:
                            rate, errors, done = asyncio.run(
                                ledger_transitions(nats_server.url, args.seconds / args.rounds, clients))
                        mine.add(cpu, done, done / rate if rate else 0.0, errors)
                        figures["transitions_per_s"] = round(rate, 1)
                        lag_s = max(lag_s, asyncio.run(drain_time(db_url)))  # events still to publish after the slice
                    else:
                        with CpuMeter(**raw_procs) as cpu:
                            rate, done = asyncio.run(raw_transitions(db_url, args.seconds / args.rounds, clients))
                        raw_tally.add(cpu, done, done / rate if rate else 0.0, 0)
                        figures["raw_updates_per_s"] = round(rate, 1)
                figures["ratio"] = round(figures["transitions_per_s"] / figures["raw_updates_per_s"], 3)
                rounds.append(figures)
            sizes = batch_sizes(counted, asyncio.run(coalescer_stats(nats_server.url)))
            sweep[clients] = {"transitions_per_s": _median([r["transitions_per_s"] for r in rounds], 1),
                              "errors": mine.errors,
                              "requests_per_statement": sizes,
                              "cpu_us_per_transition": mine.per_op_us(),
                              "raw_updates_per_s": _median([r["raw_updates_per_s"] for r in rounds], 1),
                              "raw_cpu_us_per_transition": raw_tally.per_op_us(),
                              "ratio": _median([r["ratio"] for r in rounds]),
                              "rounds": rounds}
            level = sweep[clients]
            print(f"{clients:3d} clients: ledger {level['transitions_per_s']:8.0f}/s "
                  f"cpu µs {level['cpu_us_per_transition']}\n             raw    {level['raw_updates_per_s']:8.0f}/s "
                  f"cpu µs {level['raw_cpu_us_per_transition']}  ratio {level['ratio']} "
                  f"(rounds {[r['ratio'] for r in rounds]})  requests per statement {sizes}", flush=True)
        errors = sum(level["errors"] for level in sweep.values())
        embedded.stop_process(ledger)
        ledger = None
        if args.only == "transitions":
            return 0
        transitions, raw = sweep[CLIENTS]["transitions_per_s"], sweep[CLIENTS]["raw_updates_per_s"]
        log_only, log_with_event = [], []
        for n in range(args.rounds):  # interleaved, the first of the two alternating
            for event in (False, True) if n % 2 == 0 else (True, False):
                rate = asyncio.run(logged_transitions(db_url, args.seconds / args.rounds, event=event))
                (log_with_event if event else log_only).append(rate)
        backlog = asyncio.run(events_waiting(db_url))
        ledger = start_ledger(tmp, nats_server.url, db_url)  # its relay finds the backlog
        relay_s = asyncio.run(drain_time(db_url))
        started = time.perf_counter()
        run_id = asyncio.run(fill(db_url, args.rows))
        fill_s = time.perf_counter() - started
        console = console_rounds([asyncio.run(console_latency(nats_server.url, db_url, run_id))
                                  for _ in range(args.rounds)])
    finally:
        if ledger is not None:
            embedded.stop_process(ledger)
        pg.stop()
        nats_server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    result = {
        "transitions_per_s": round(transitions, 1),
        "raw_updates_per_s": round(raw, 1),
        "transition_ratio": sweep[CLIENTS]["ratio"],
        "transition_errors": errors,
        "transitions_by_clients": {str(clients): level for clients, level in sweep.items()},
        "relay_lag_after_load_s": round(lag_s, 3),
        "logged_transitions_per_s_without_event": _median(log_only, 1),
        "logged_transitions_per_s_with_event": _median(log_with_event, 1),
        "event_cost_ratio": _median([e / p for e, p in zip(log_with_event, log_only, strict=True)]),
        "relay_backlog_events": backlog,
        "relay_events_per_s": round(backlog / relay_s, 1) if relay_s else None,
        **console,
        "clients": CLIENTS,
        "seconds_per_phase": args.seconds,
        "rounds": args.rounds,
        "console_reads_per_round": CONSOLE_READS,
        "resources_in_database": args.rows,
        "console_resources": CONSOLE_ROWS,
        "fill_seconds": round(fill_s, 1),
        "targets": {"transition_ratio": ">= 1.0 at 32 clients, the median of the rounds (issue 15)",
                    "console_p99_ms": "<= 10 at 1,000,000 rows, the median of the rounds' p99 (issues 15, 27)"},
    }
    out = ROOT / "bench" / "results" / "ledger.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
