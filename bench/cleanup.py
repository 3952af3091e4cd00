"""Benchmark: the cleanup sweep giving back 10,000 and 100,000 resources (in 1,000 and
10,000 runs of 10 creatures each), with one cleanup replica, with two, and with two ledger
processes on one database; against the raw shard commands the sweep sends.

Everything is real: nats-server and PostgreSQL from the pip binaries, ``shardbus run``
processes for the ledger(s), the gateway and each cleanup replica, and the shard simulator
dialled into the gateway over TCP (in this process). Each replica sweeps once as it starts;
a sweep's time runs from the first replica's start of sweeping to the last one's end (both
taken from the ``cleanup.events.swept`` events).

``--rounds`` interleaved rounds (default 3; the machine is shared and its load drifts): each
round measures the raw baseline, then the sweeps (10k, 100k, 10k with two replicas, 10k with
two ledgers), then the raw baseline again, so raw and shardbus alternate within the round.
Every figure is the median over the rounds; each round's own figures are kept under
``rounds``.

The raw baseline (``raw_commands_per_s``, in resources given back per second) sends exactly
the commands the sweep sends to the shard since issue 27: one ``world.despawn {runId,
serials: [its 10 serials], idempotencyKey}`` per run (the batch key), CONCURRENCY in flight,
straight to the gateway and simulator, no ledger. ``sweep_vs_raw_ratio`` compares the sweep
with it. The old baseline — one command per resource, what the sweep sent before issue 27 —
is measured too (``raw_per_row_commands_per_s``, ``sweep_vs_per_row_raw_ratio``) so the
figures can be read against earlier results.

Figures: resources given back per second at 10k and 100k, the time ratio 100k / 10k (linear
cost: ≤ 11), the rate with two replicas and with two ledgers, the raw rates, and sweep / raw
(target ≥ 0.5, issue 15).

Run alone: ``python bench/cleanup.py`` (``--quick`` for a 1k/10k smoke run, ``--rounds N``);
writes ``bench/results/cleanup.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import asyncpg
import nats

from services.cleanup import giveback
from shardbus import embedded
from shared import subjects
from simulator.shard import ShardSimulator
from simulator.world import ShardWorld, WorldObject
from tests.processes import ServiceProcesses

PER_RUN = 10
"""Resources (creatures) per run."""

CONCURRENCY = 32
"""Give-back commands in flight: a replica's ``give_back_concurrency`` and the raw baseline's."""

TOKEN = "bench-cleanup-token-0001"
"""The shard token of the bench's gateway."""


async def ask(nc: nats.NATS, subject: str, payload: dict, timeout: float = 30.0) -> dict:
    reply = json.loads((await nc.request(subject, json.dumps(payload).encode(), timeout=timeout)).data)
    if not 200 <= reply.get("status", 0) < 300:
        raise RuntimeError(f"{subject} {payload} → {reply}")
    return reply


async def bounded(jobs, in_flight: int) -> None:
    """Await every coroutine in ``jobs``, ``in_flight`` at a time."""
    gate = asyncio.Semaphore(in_flight)

    async def one(job):
        async with gate:
            await job

    await asyncio.gather(*(one(job) for job in jobs))


def gateway_addr(gateway) -> tuple[str, int]:
    for line in gateway.log().splitlines():
        if '"listening for shards"' in line:
            host, port = json.loads(line)["addr"].rsplit(":", 1)
            return host, int(port)
    raise RuntimeError("the gateway did not say where it listens")


async def fresh_database(admin_url: str) -> str:
    name = f"bench_cleanup_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(admin_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return admin_url.rsplit("/", 1)[0] + "/" + name


async def populate(database: str, sim: ShardSimulator, prefix: str, total: int) -> None:
    """``total / PER_RUN`` cancelled runs whose cleanup is pending, each holding PER_RUN
    confirmed creatures, placed in the simulated world and in the ledger.

    Setup only, not measured: the rows go straight into the ledger's tables in two
    statements (recording 100,000 rows one request at a time would take the better part
    of ten minutes on this machine). The sweep itself touches the ledger only over NATS."""
    runs = total // PER_RUN
    for run in range(runs):
        for i in range(PER_RUN):
            ref = f"{prefix}-{run}-c{i}"
            sim.world.objects[ref] = WorldObject(ref, "creature", f"{prefix}-{run}")
    conn = await asyncpg.connect(database.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        async with conn.transaction():
            await conn.execute("""
                INSERT INTO runs (run_id, shard, event, status, cleanup_status, ended_at)
                SELECT $1 || '-' || n, $2, 'bench', 'cancelled', 'pending', now()
                FROM generate_series(0, $3 - 1) AS n""", prefix, sim.shard, runs)
            await conn.execute("""
                INSERT INTO resources (run_id, module, kind, ref, status, idempotency_key)
                SELECT $1 || '-' || n, 'bench', 'creature', $1 || '-' || n || '-c' || i, 'confirmed',
                       'rec:' || $1 || '-' || n || '-c' || i
                FROM generate_series(0, $2 - 1) AS n, generate_series(0, $3 - 1) AS i""", prefix, runs, PER_RUN)
        await conn.execute("ANALYZE runs; ANALYZE resources")
    finally:
        await conn.close()


async def sweep_seconds(nc: nats.NATS, procs: ServiceProcesses, replicas: int, total: int) -> float:
    """Start ``replicas`` cleanup processes (each sweeps as it starts); seconds from the first
    sweep's start to the end of the last sweep that gave something back."""
    events: list[dict] = []

    async def on_swept(msg) -> None:
        events.append(json.loads(msg.data))

    sub = await nc.subscribe(subjects.CLEANUP_SWEPT, cb=on_swept)
    settings = {"sweep_period_s": "3600", "reconcile_period_s": "3600",
                "give_back_concurrency": str(CONCURRENCY)}
    started = await asyncio.gather(*(asyncio.to_thread(procs.start, "cleanup", timeout=60, **settings)
                                     for _ in range(replicas)))
    async with asyncio.timeout(1800):
        while sum(e["claimed"] for e in events) < total or len(events) < replicas:
            await asyncio.sleep(0.05)
    await sub.unsubscribe()
    for proc in started:
        procs.stop(proc)
    working = [e for e in events if e["claimed"]]
    first = min(e["startedAt"] for e in working)
    last = max(e["startedAt"] + e["durationS"] for e in working)
    return last - first


async def scenario(nc, procs, admin_url: str, total: int, replicas: int, ledgers: int = 1) -> dict:
    """One measured sweep of ``total`` resources by ``replicas`` replicas, on a fresh ledger
    (``ledgers`` ledger processes sharing its requests)."""
    database = await fresh_database(admin_url)
    # The ledger migrates the fresh database as it starts; the setup then fills it.
    ledger_procs = [procs.start("ledger", database_url=database) for _ in range(ledgers)]
    gateway = procs.start("gateway", shard_token=TOKEN, shard_port="0")
    host, port = gateway_addr(gateway)
    sim = ShardSimulator(host, port, f"bench{uuid.uuid4().hex[:6]}", TOKEN, world=ShardWorld())
    await sim.connect()
    try:
        await asyncio.sleep(0.5)
        t0 = time.perf_counter()
        await populate(database, sim, f"b{total}x{replicas}", total)
        setup_s = time.perf_counter() - t0
        seconds = await sweep_seconds(nc, procs, replicas, total)
        executed, replayed = sim.executed["world.despawn"], sim.replayed["world.despawn"]
        left = sum(1 for obj in sim.world.objects.values() if obj.present)
        # A run's 10 creatures fit one claim, so one world.despawn per run carries them all.
        if executed != total // PER_RUN or left:
            raise RuntimeError(f"the simulator executed {executed} despawns for {total // PER_RUN} runs, "
                               f"{left} objects left")
        print(f"  {total:>7} resources, {replicas} replica(s), {ledgers} ledger(s): {seconds:7.2f} s sweep "
              f"({total / seconds:8.0f}/s), setup {setup_s:.1f} s, executed {executed}, replayed {replayed}",
              flush=True)
        return {"resources": total, "replicas": replicas, "ledgers": ledgers, "seconds": seconds,
                "per_s": total / seconds, "executed": executed, "replayed": replayed}
    finally:
        await sim.close()
        procs.stop(gateway)
        for ledger in ledger_procs:
            procs.stop(ledger)


async def raw_rate(nc, procs, total: int, batched: bool) -> float:
    """Resources given back per second by raw ``world.despawn`` commands straight to the gateway
    and simulator, CONCURRENCY in flight, no ledger: one per run carrying its PER_RUN serials
    under the batch key (``batched``: what the sweep sends), or one per resource under the row
    key (what the sweep sent before issue 27)."""
    gateway = procs.start("gateway", shard_token=TOKEN, shard_port="0")
    host, port = gateway_addr(gateway)
    sim = ShardSimulator(host, port, f"raw{uuid.uuid4().hex[:6]}", TOKEN, world=ShardWorld())
    await sim.connect()
    try:
        await asyncio.sleep(0.5)
        commands: list[tuple[str, list[str], str]] = []
        for run_index in range(total // PER_RUN):
            run = f"raw-{run_index}"
            ids = list(range(run_index * PER_RUN, (run_index + 1) * PER_RUN))
            refs = [f"raw-c{i}" for i in ids]
            for ref in refs:
                sim.world.objects[ref] = WorldObject(ref, "creature", run)
            if batched:
                commands.append((run, refs, giveback.batch_key(run, ids)))
            else:
                commands += [(run, [ref], giveback.idempotency_key(run, i)) for i, ref in zip(ids, refs, strict=True)]
        subject = subjects.command(sim.shard, "world.despawn")

        async def despawn(run: str, refs: list[str], key: str) -> None:
            reply = await ask(nc, subject, {"runId": run, "serials": refs, "idempotencyKey": key})
            if reply["body"].get("kind") != "world.despawn.ok" or reply["body"].get("removed") != refs:
                raise RuntimeError(f"raw despawn answered {reply}")

        started = time.perf_counter()
        await bounded((despawn(*command) for command in commands), CONCURRENCY)
        seconds = time.perf_counter() - started
        print(f"  raw ({'one per run' if batched else 'one per resource'}): {total} resources in "
              f"{len(commands)} despawns, {seconds:.2f} s ({total / seconds:.0f}/s)", flush=True)
        return total / seconds
    finally:
        await sim.close()
        procs.stop(gateway)


async def one_round(nc, procs, admin_url: str, small: int, large: int) -> dict:
    """One round: raw, the sweeps, raw again (so the machine's drift weighs on both sides)."""
    raw_before = await raw_rate(nc, procs, small, batched=True)
    per_row_before = await raw_rate(nc, procs, small, batched=False)
    one_small = await scenario(nc, procs, admin_url, small, 1)
    one_large = await scenario(nc, procs, admin_url, large, 1)
    two_small = await scenario(nc, procs, admin_url, small, 2)
    two_ledgers = await scenario(nc, procs, admin_url, small, 1, ledgers=2)
    per_row_after = await raw_rate(nc, procs, small, batched=False)
    raw_after = await raw_rate(nc, procs, small, batched=True)
    raw = (raw_before + raw_after) / 2
    per_row = (per_row_before + per_row_after) / 2
    return {
        "reverts_per_s_10k": round(one_small["per_s"], 1),
        "reverts_per_s_100k": round(one_large["per_s"], 1),
        "time_ratio_100k_vs_10k": round(one_large["seconds"] / one_small["seconds"], 2),
        "reverts_per_s_2_replicas": round(two_small["per_s"], 1),
        "reverts_per_s_2_ledgers": round(two_ledgers["per_s"], 1),
        "raw_commands_per_s": round(raw, 1),
        "sweep_vs_raw_ratio": round(one_small["per_s"] / raw, 3),
        "raw_per_row_commands_per_s": round(per_row, 1),
        "sweep_vs_per_row_raw_ratio": round(one_small["per_s"] / per_row, 3),
        "seconds": {"10k": round(one_small["seconds"], 3), "100k": round(one_large["seconds"], 3),
                    "10k_2_replicas": round(two_small["seconds"], 3),
                    "10k_2_ledgers": round(two_ledgers["seconds"], 3)},
        "raw_commands_per_s_before_after": [round(raw_before, 1), round(raw_after, 1)],
        "raw_per_row_commands_per_s_before_after": [round(per_row_before, 1), round(per_row_after, 1)],
        "despawns_executed": {"10k": one_small["executed"], "100k": one_large["executed"]},
    }


FIGURES = ("reverts_per_s_10k", "reverts_per_s_100k", "time_ratio_100k_vs_10k", "reverts_per_s_2_replicas",
           "reverts_per_s_2_ledgers", "raw_commands_per_s", "sweep_vs_raw_ratio", "raw_per_row_commands_per_s",
           "sweep_vs_per_row_raw_ratio")
"""The figures reported as medians over the rounds (each round's are kept beside them)."""


async def measure(nats_url: str, admin_url: str, workdir: Path, small: int, large: int, rounds: int) -> dict:
    procs = ServiceProcesses(workdir, nats_url)
    nc = await nats.connect(nats_url, max_reconnect_attempts=3)
    measured = []
    try:
        for index in range(rounds):
            print(f"round {index + 1} of {rounds}", flush=True)
            measured.append(await one_round(nc, procs, admin_url, small, large))
    finally:
        procs.stop_all()
        await nc.close()
    medians = {key: round(statistics.median(r[key] for r in measured), 3) for key in FIGURES}
    return {
        **medians,
        "resources_small": small,
        "resources_large": large,
        "resources_per_run": PER_RUN,
        "concurrency": CONCURRENCY,
        "rounds": measured,
        "targets": {"time_ratio_100k_vs_10k_max": 11, "sweep_vs_raw_ratio_min": 0.5},
        "notes": [
            "Every figure above 'rounds' is the median over the rounds; each round ran raw, then the "
            "sweeps (10k, 100k, 10k with two cleanup replicas, 10k with one replica and two ledger processes "
            "on one database), then raw again (raw = the mean of the two).",
            "Since issue 27 the sweep gives a run's world objects back in one world.despawn carrying all "
            "its serials (one per run and shard per claimed batch; 10 serials per command here). The fair raw "
            "baseline is therefore the same commands without the ledger: raw_commands_per_s is resources per "
            "second sent as one world.despawn per run of 10 under the batch key. sweep_vs_raw_ratio divides "
            "the 10k sweep's rate by it.",
            "raw_per_row_commands_per_s is the pre-issue-27 baseline (one world.despawn per resource, the "
            "commands the sweep used to send), kept so the figures compare with earlier results; "
            "sweep_vs_per_row_raw_ratio divides the 10k sweep's rate by it.",
            "time_ratio_100k_vs_10k is each round's 100k seconds / its 10k seconds (median over rounds).",
        ],
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,000 and 10,000 resources (a smoke run)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds, medians reported (default 3)")
    args = parser.parse_args()
    small, large = (1_000, 10_000) if args.quick else (10_000, 100_000)
    with tempfile.TemporaryDirectory(prefix="bench-cleanup-") as tmp:
        work = Path(tmp)
        nats_server = embedded.start_nats(work / "nats")
        pg = embedded.start_postgres(work / "pg" / "data", durable=False)
        try:
            print(f"cleanup sweep: {small} and {large} resources, {PER_RUN} per run, concurrency {CONCURRENCY}")
            result = asyncio.run(measure(nats_server.url, pg.url("postgres"), work, small, large, args.rounds))
        finally:
            pg.stop()
            nats_server.stop()
    for key in FIGURES:
        print(f"{key:>26}: {result[key]}")
    if not args.quick:
        out = ROOT / "bench" / "results" / "cleanup.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
