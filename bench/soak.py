"""Soak: the whole embedded system under a steady, mixed load for N minutes, then an exact
account of what arrived, what was answered, what was given back, and how much memory each
process holds at the end compared with its start.

The system is started the way ``shardbus up`` starts it (``shardbus.stack.Stack``: a real
nats-server with JetStream fsyncing every write, a real PostgreSQL, both from the pip
packages, the migrations, and the four services as ``shardbus run`` child processes). The
shard simulator (``simulator.shard.ShardSimulator``, in this process) dials the gateway and,
for the whole soak:

* sends 500 sequenced frames/s (numbered ``i``; the gateway acknowledges each once stored;
  ``sequenced=True``, the optional acknowledgement of docs/gateway.md, "Frames");
* receives 20 ``item.catalog`` commands/s sent by this process through NATS (the command
  plane, ``shard.<shard>.cmd.item.catalog``), each round trip timed;
* every 5 s takes part in an event run: the run is created in the ledger, 5 creatures are
  spawned and a lease (``Spawner.MaxCount`` for a target of the run's own) is applied through the
  command plane, all 6 are recorded in the ledger, the run is completed, and the cleanup
  service (its own period, 30 s by default) gives them back.

The raw baseline runs beside it for the whole soak, on the same nats-server at the same
rate: request/reply to an echo responder in its own process (as ``bench/gateway.py``
measures it), so command latency can be read against what bare NATS did at the same time.

RSS of every process is sampled after a 10 s warm-up (the start), every 30 s, and when the
load stops (the end). At the end: every frame is read back from JetStream by number
(frames lost = sent − stored), commands failed are counted, each run's console must say its
cleanup is complete, and each resource must have been executed on the shard exactly once.

Run: ``python bench/soak.py --minutes 10`` (``make soak``); a run of 10 minutes or more
writes ``bench/results/soak.json`` (a shorter one, e.g. ``make bench``'s default minute,
writes only with ``--out FILE``). Exit status 1 when anything was lost, failed, executed twice,
not given back, or a service died.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import nats
import nats.errors
from nats.js.api import AckPolicy, ConsumerConfig

from shardbus import embedded
from shardbus.stack import Stack
from shared import subjects
from simulator.shard import ShardSimulator
from simulator.world import ShardWorld

sys.path.insert(0, str(ROOT / "bench"))
import gateway as gateway_bench  # bench/gateway.py: its raw baseline's responder

try:
    import psutil
except ImportError:  # /proc is read directly then
    psutil = None

FRAMES_PER_S = 500
"""Sequenced frames the shard sends per second."""

COMMANDS_PER_S = 20
"""``item.catalog`` commands (and raw echo requests) sent per second."""

RUN_EVERY_S = 5.0
"""A new event run this often."""

CREATURES_PER_RUN = 5
"""Creatures each run spawns (plus one lease)."""

LEASE_KEY = "Spawner.MaxCount"
"""The lease each run takes: the simulator's targeted key, one target per run."""

WARMUP_S = 10.0
"""Load before the start RSS sample is taken (and before latencies count)."""

SAMPLE_EVERY_S = 30.0
"""RSS and progress sample period."""

COMMAND_TIMEOUT_S = 5.0
"""A command or raw request not answered within this counts as failed."""

GIVE_BACK_WAIT_S = 120.0
"""After the load stops, how long the last runs may take to be given back (4× the default sweep period)."""

RESULTS = ROOT / "bench" / "results" / "soak.json"
"""Where the recorded run's figures go."""

RECORDED_MINUTES = 10
"""Runs at least this long write RESULTS by default (the figure docs/performance.md records)."""

KIND = "soak.tick"
"""The kind of every counted frame."""

PAD = "x" * 60
"""Filler so a frame is about 120 bytes, like the other benchmarks'."""

ECHO_RESPONDER = gateway_bench.ECHO_RESPONDER
"""The raw baseline's responder: a process of its own (bench/gateway.py's)."""


# --- what the shard executed ----------------------------------------------------------------

class CountingWorld(ShardWorld):
    """A shard world that counts each give-back it carries out, per resource (a replay from
    the simulator's idempotency cache never reaches the world, so it is not counted)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.give_backs: Counter[tuple[str, str]] = Counter()

    def execute(self, verb: str, body: dict[str, Any]) -> dict[str, Any] | None:
        if verb == "world.despawn":
            for serial in body.get("serials") or []:
                self.give_backs[(str(body.get("runId")), str(serial))] += 1
        elif verb == "lease.release":
            # A release names no run (docs/contracts.md, "Gateway command plane"): each run leases
            # the target named after itself.
            target = str(body.get("target") or "")
            self.give_backs[(target, f"{body.get('key')}@{target}")] += 1
        return super().execute(verb, body)


# --- memory ---------------------------------------------------------------------------------

def _proc_status(pid: int) -> dict[str, int]:
    """VmRSS and RssAnon of ``pid`` in kB, from /proc (empty when it is gone)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                name, _, value = line.partition(":")
                if name in ("VmRSS", "RssAnon"):
                    out[name] = int(value.split()[0])
    except (OSError, ValueError):
        pass
    return out


def _children(pid: int) -> list[int]:
    if psutil is not None:
        try:
            return [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            return []
    found = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as kids:
                found += [int(k) for k in kids.read().split()]
    except OSError:
        pass
    return found + [grandchild for child in found for grandchild in _children(child)]


def rss_sample(watched: dict[str, int]) -> dict[str, float]:
    """MB of resident memory per watched process. ``postgres`` is the postmaster;
    ``postgres-backends`` is the private (anonymous) memory of all its child processes
    summed, since their RSS counts the shared buffers again in each of them."""
    sample: dict[str, float] = {}
    for name, pid in watched.items():
        if psutil is not None:
            try:
                sample[name] = round(psutil.Process(pid).memory_info().rss / 2**20, 1)
            except psutil.Error:
                pass
        else:
            kb = _proc_status(pid).get("VmRSS")
            if kb is not None:
                sample[name] = round(kb / 1024, 1)
        if name == "postgres":
            kids = _children(pid)
            sample["postgres-backends"] = round(sum(_proc_status(k).get("RssAnon", 0) for k in kids) / 1024, 1)
            sample["postgres-backend-count"] = len(kids)
    return sample


# --- the load -------------------------------------------------------------------------------

@dataclass
class Timed:
    """Round trips of one kind: (moment, ms) of each answered one, and failures."""

    sent: int = 0
    failed: int = 0
    times: list[tuple[float, float]] = field(default_factory=list)
    failures: Counter[str] = field(default_factory=Counter)

    def after(self, moment: float) -> list[float]:
        return [ms for at, ms in self.times if at >= moment]


def percentiles(values: list[float]) -> tuple[float, float]:
    """p50, p99 (NaN for fewer than two values)."""
    if len(values) < 2:
        return float("nan"), float("nan")
    return statistics.median(values), statistics.quantiles(values, n=100)[98]


@dataclass
class RunRecord:
    """One event run and what it holds on the shard."""

    run_id: str
    resources: list[tuple[str, str]] = field(default_factory=list)  # (runId, ref as the world counts it)
    refs: list[str] = field(default_factory=list)
    lease_target: str = ""
    lease_baseline: str = ""
    ended: bool = False
    error: str = ""


async def ask(nc: nats.NATS, subject: str, payload: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    """One request that must succeed (2xx); its reply."""
    reply = json.loads((await nc.request(subject, json.dumps(payload).encode(), timeout=timeout)).data)
    if not 200 <= reply.get("status", 0) < 300:
        raise RuntimeError(f"{subject} {payload} → {reply}")
    return reply


class Soak:
    """The load, its tallies, and the checks at the end."""

    def __init__(self, stack: Stack, minutes: float) -> None:
        self.stack, self.minutes = stack, minutes
        self.shard = f"soak{uuid.uuid4().hex[:6]}"
        self.world = CountingWorld()
        host, port = stack.shard_addr.rsplit(":", 1)
        self.sim = ShardSimulator(host, int(port), self.shard, stack.shard_token, world=self.world, sequenced=True)
        self.frames_sent = 0
        self.commands = Timed()
        self.raw = Timed()
        self.runs: list[RunRecord] = []
        self.samples: list[dict[str, Any]] = []
        self.stop = asyncio.Event()
        self.started = 0.0
        self.warm_at = 0.0
        self.echo: subprocess.Popen | None = None
        self.tasks: set[asyncio.Task[Any]] = set()

    def watched(self) -> dict[str, int]:
        assert self.stack.nats and self.stack.postgres
        pids = {"nats-server": self.stack.nats.proc.pid, "postgres": self.stack.postgres.proc.pid}
        pids.update({child.name: child.proc.pid for child in self.stack.children if child.proc})
        pids["driver"] = os.getpid()  # this process: the simulator and the callers (not the system)
        return pids

    def dead_services(self) -> list[str]:
        return [f"{c.name} (exit {c.proc.returncode})" for c in self.stack.children
                if c.proc and c.proc.poll() is not None]

    def spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # frames

    async def send_frames(self) -> None:
        """FRAMES_PER_S numbered frames, on schedule (catching up in bursts if a turn is late)."""
        while not self.stop.is_set():
            due = int((time.monotonic() - self.started) * FRAMES_PER_S)
            while self.frames_sent < due:
                try:
                    await self.sim.send(KIND, i=self.frames_sent, pad=PAD)
                except ConnectionError:  # kept unacknowledged; resent on the next hello
                    pass
                self.frames_sent += 1
            await asyncio.sleep(0.01)

    # commands and the raw baseline

    async def one_request(self, nc: nats.NATS, subject: str, tally: Timed, check: bool) -> None:
        tally.sent += 1
        t0 = time.perf_counter()
        try:
            reply = await nc.request(subject, b"{}", timeout=COMMAND_TIMEOUT_S)
            ms = (time.perf_counter() - t0) * 1000
            if check:
                status = json.loads(reply.data).get("status")
                if status != 200:
                    tally.failed += 1
                    tally.failures[f"status {status}"] += 1
                    return
            tally.times.append((time.monotonic(), ms))
        except Exception as exc:  # timeout, no responders: counted
            tally.failed += 1
            tally.failures[type(exc).__name__] += 1

    async def keep_requesting(self, nc: nats.NATS, subject: str, tally: Timed, check: bool) -> None:
        """COMMANDS_PER_S requests on a fixed schedule, each in its own task (a slow answer
        does not slow the rate)."""
        n = 0
        while not self.stop.is_set():
            self.spawn(self.one_request(nc, subject, tally, check))
            n += 1
            pause = self.started + n / COMMANDS_PER_S - time.monotonic()
            if pause > 0:
                await asyncio.sleep(pause)

    # event runs

    async def command(self, nc: nats.NATS, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        reply = await ask(nc, subjects.command(self.shard, verb), body)
        return reply["body"]

    async def one_run(self, nc: nats.NATS, run: RunRecord) -> None:
        """Create the run, take resources from the shard, record them, complete the run."""
        try:
            await ask(nc, subjects.LEDGER_RUN_CREATE, {"runId": run.run_id, "shard": self.shard, "event": "soak"})
            await ask(nc, subjects.LEDGER_RUN_STATUS, {"runId": run.run_id, "status": "running"})
            spawned = await self.command(nc, "world.spawn", {"runId": run.run_id, "what": "creature",
                                                             "count": CREATURES_PER_RUN})
            run.refs = list(spawned["serials"])
            run.lease_target = run.run_id
            leased = await self.command(nc, "lease.apply", {"runId": run.run_id, "key": LEASE_KEY,
                                                            "target": run.lease_target, "value": "25",
                                                            "holdMs": 3_600_000})
            run.lease_baseline = leased["baseline"]
            for ref in run.refs:
                await ask(nc, subjects.LEDGER_RESOURCE_RECORD, {
                    "runId": run.run_id, "module": "soak", "kind": "creature", "ref": ref,
                    "idempotencyKey": f"{run.run_id}:creature:{ref}"})
                run.resources.append((run.run_id, ref))
            lease_ref = f"{LEASE_KEY}@{run.lease_target}"
            await ask(nc, subjects.LEDGER_RESOURCE_RECORD, {
                "runId": run.run_id, "module": "soak", "kind": "lease", "ref": lease_ref,
                "idempotencyKey": f"{run.run_id}:lease:{lease_ref}",
                "revert": {"key": LEASE_KEY, "target": run.lease_target, "expected": "25",
                           "baseline": run.lease_baseline}})
            run.resources.append((run.run_id, lease_ref))
            await ask(nc, subjects.LEDGER_RUN_STATUS, {"runId": run.run_id, "status": "completed"})
            run.ended = True
        except Exception as exc:  # reported, not fatal to the soak
            run.error = f"{type(exc).__name__}: {exc}"

    async def keep_running_events(self, nc: nats.NATS) -> None:
        n = 0
        while not self.stop.is_set():
            run = RunRecord(f"soak-{self.shard}-{n}")
            self.runs.append(run)
            self.spawn(self.one_run(nc, run))
            n += 1
            pause = self.started + n * RUN_EVERY_S - time.monotonic()
            if pause > 0:
                try:
                    await asyncio.wait_for(self.stop.wait(), pause)
                except TimeoutError:
                    pass

    # sampling

    def sample(self, label: str) -> dict[str, Any]:
        elapsed = time.monotonic() - self.started
        window = [ms for at, ms in self.commands.times if at >= time.monotonic() - SAMPLE_EVERY_S]
        raw_window = [ms for at, ms in self.raw.times if at >= time.monotonic() - SAMPLE_EVERY_S]
        c50, c99 = percentiles(window)
        r50, r99 = percentiles(raw_window)
        entry = {"label": label, "t_s": round(elapsed, 1), "rss_mb": rss_sample(self.watched()),
                 "frames_sent": self.frames_sent, "frames_unacked": len(self.sim.unacked),
                 "commands_failed": self.commands.failed, "command_p50_ms": round(c50, 2),
                 "command_p99_ms": round(c99, 2), "raw_p50_ms": round(r50, 2), "raw_p99_ms": round(r99, 2),
                 "runs": len(self.runs), "load_1m": round(os.getloadavg()[0], 2)}
        self.samples.append(entry)
        rss = entry["rss_mb"]
        print(f"[{elapsed:6.0f} s] {label:<6} frames {self.frames_sent} (unacked {len(self.sim.unacked)}), "
              f"commands p50 {c50:.1f} p99 {c99:.1f} ms (raw {r50:.1f}/{r99:.1f}), failed {self.commands.failed}, "
              f"runs {len(self.runs)}, load {entry['load_1m']}; RSS "
              + " ".join(f"{k}={v}" for k, v in rss.items() if k != "postgres-backend-count"), flush=True)
        return entry

    async def keep_sampling(self, end: float) -> None:
        await asyncio.sleep(WARMUP_S)
        self.warm_at = time.monotonic()
        self.sample("start")
        while True:
            next_at = min(time.monotonic() + SAMPLE_EVERY_S, end)
            if next_at >= end:
                await asyncio.sleep(max(0.0, end - time.monotonic()))
                return
            await asyncio.sleep(next_at - time.monotonic())
            self.sample("during")
            if dead := self.dead_services():
                raise RuntimeError(f"a service died during the soak: {', '.join(dead)}")

    # the end

    async def wait_given_back(self, nc: nats.NATS) -> dict[str, str]:
        """Each ended run's cleanup status, waiting (bounded) until every one is complete."""
        statuses: dict[str, str] = {}
        deadline = time.monotonic() + GIVE_BACK_WAIT_S
        ended = [run for run in self.runs if run.ended]
        while True:
            for run in ended:
                if statuses.get(run.run_id) == "complete":
                    continue
                try:
                    console = await ask(nc, subjects.LEDGER_CONSOLE, {"runId": run.run_id})
                    statuses[run.run_id] = console["run"]["cleanupStatus"]
                except Exception as exc:
                    statuses[run.run_id] = f"unknown ({type(exc).__name__})"
            if all(statuses.get(run.run_id) == "complete" for run in ended) or time.monotonic() > deadline:
                return statuses
            await asyncio.sleep(2.0)

    async def count_stored(self, nc: nats.NATS, expect: int) -> tuple[int, int, list[int]]:
        """Read back every counted frame JetStream holds for the shard, by number:
        (distinct stored, duplicates, first missing numbers)."""
        js = nc.jetstream()
        sub = await js.pull_subscribe(subjects.frame(self.shard, KIND), stream=subjects.FRAMES_STREAM,
                                      config=ConsumerConfig(ack_policy=AckPolicy.NONE))
        seen = bytearray(expect)
        stored = duplicates = beyond = 0
        try:
            async with asyncio.timeout(max(120.0, expect / 1000)):
                while True:
                    try:
                        msgs = await sub.fetch(1000, timeout=2.0)
                    except (nats.errors.TimeoutError, TimeoutError):  # nothing more within 2 s
                        break
                    for msg in msgs:
                        i = json.loads(msg.data)["i"]
                        if i >= expect:
                            beyond += 1
                        elif seen[i]:
                            duplicates += 1
                        else:
                            seen[i] = 1
                            stored += 1
        except TimeoutError:  # the whole read-back ran out of time: what is unread counts as lost
            print("reading the frames back took too long; unread frames count as lost", flush=True)
        finally:
            try:
                await sub.unsubscribe()
            except Exception:
                pass
        missing = [i for i in range(expect) if not seen[i]][:20]
        return stored, duplicates + beyond, missing

    async def run(self) -> dict[str, Any]:
        nats_url = self.stack.nats.url
        cmd_nc = await nats.connect(nats_url, name="soak-commands")
        raw_nc = await nats.connect(nats_url, name="soak-raw")
        run_nc = await nats.connect(nats_url, name="soak-runs")
        echo_subject = f"soak.echo.{uuid.uuid4().hex[:8]}"
        try:
            self.echo = subprocess.Popen([sys.executable, "-c", ECHO_RESPONDER, nats_url, echo_subject],
                                         stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                         preexec_fn=embedded._die_with_parent)
            async with asyncio.timeout(30):
                await asyncio.to_thread(self.echo.stdout.readline)
            await self.sim.connect()
            # The command subscription is in place once a command is answered.
            async with asyncio.timeout(30):
                while True:
                    try:
                        await ask(cmd_nc, subjects.command(self.shard, "item.catalog"), {}, timeout=1.0)
                        break
                    except Exception:
                        await asyncio.sleep(0.1)
            print(f"shard {self.shard} connected to {self.stack.shard_addr}; load for "
                  f"{WARMUP_S:.0f} s warm-up + {self.minutes:g} min", flush=True)
            self.started = time.monotonic()
            end = self.started + WARMUP_S + self.minutes * 60
            load = [asyncio.create_task(self.send_frames()),
                    asyncio.create_task(self.keep_requesting(
                        cmd_nc, subjects.command(self.shard, "item.catalog"), self.commands, True)),
                    asyncio.create_task(self.keep_requesting(raw_nc, echo_subject, self.raw, False)),
                    asyncio.create_task(self.keep_running_events(run_nc))]
            try:
                await self.keep_sampling(end)
                end_sample = self.sample("end")
                for task in load:  # a load task that failed is an error, not a quiet stop
                    if task.done() and task.exception():
                        raise task.exception()
            finally:
                self.stop.set()
                await asyncio.wait(load, timeout=10)
                for task in load:
                    task.cancel()
            loaded_s = time.monotonic() - self.started
            # In-flight requests and runs finish (each is bounded by its own timeouts).
            if self.tasks:
                await asyncio.wait(list(self.tasks), timeout=60)
            print("load stopped; waiting for the last acknowledgements and give-backs …", flush=True)
            try:
                await self.sim.wait_acked(timeout=60)
            except TimeoutError:
                pass
            frames_acknowledged = self.frames_sent - len(self.sim.unacked)
            statuses = await self.wait_given_back(run_nc)
            stored, duplicated, missing = await self.count_stored(run_nc, self.frames_sent)
            stream = await run_nc.jetstream().stream_info(subjects.FRAMES_STREAM)
            return self.report(loaded_s, frames_acknowledged, stored, duplicated, missing, statuses,
                               end_sample, {"messages": stream.state.messages, "bytes": stream.state.bytes})
        finally:
            for task in list(self.tasks):
                task.cancel()
            await self.sim.close()
            for client in (cmd_nc, raw_nc, run_nc):
                try:
                    await client.close()
                except Exception:
                    pass
            if self.echo is not None:
                embedded.stop_process(self.echo)

    def report(self, loaded_s: float, acknowledged: int, stored: int, duplicated: int, missing: list[int],
               statuses: dict[str, str], end_sample: dict[str, Any], stream: dict[str, int]) -> dict[str, Any]:
        start_rss = self.samples[0]["rss_mb"]
        end_rss = end_sample["rss_mb"]
        system = [name for name in start_rss if name not in ("driver", "postgres-backend-count")]
        growth = {name: round((end_rss[name] - start_rss[name]) / start_rss[name] * 100, 1)
                  for name in system if name in end_rss and start_rss[name] > 0}
        # The backends' sum changes with the number of pooled connections: shown, not in the max.
        processes = {name: pct for name, pct in growth.items() if name != "postgres-backends"}
        # Growth that is still going on: MB per minute over the second half of the samples
        # (start-up caches fill in the first minutes; a leak keeps climbing).
        half = self.samples[len(self.samples) // 2:]
        if end_sample is not half[-1]:
            half = [*half, end_sample]
        span_min = (half[-1]["t_s"] - half[0]["t_s"]) / 60
        slope = {name: round((half[-1]["rss_mb"].get(name, 0) - half[0]["rss_mb"].get(name, 0)) / span_min, 2)
                 for name in [*system, "driver"]} if span_min > 0 else {}
        c50, c99 = percentiles(self.commands.after(self.warm_at))
        r50, r99 = percentiles(self.raw.after(self.warm_at))
        expected = {key for run in self.runs if run.ended for key in run.resources}
        executed = self.world.give_backs
        ended = [run for run in self.runs if run.ended]
        lease_left = [run.run_id for run in ended
                      if self.world.value(LEASE_KEY, run.lease_target) != run.lease_baseline]
        objects_left = sum(1 for run in ended for ref in run.refs
                           if ref in self.world.objects and self.world.objects[ref].present)
        return {
            "minutes": self.minutes,
            "warmup_s": WARMUP_S,
            "loaded_s": round(loaded_s, 1),
            "frames_per_s_target": FRAMES_PER_S,
            "frames_sent": self.frames_sent,
            "frames_acknowledged": acknowledged,
            "frames_stored": stored,
            "frames_lost": self.frames_sent - stored,
            "frames_duplicated": duplicated,
            "frames_missing_first": missing,
            "frames_stream": stream,
            "commands_per_s_target": COMMANDS_PER_S,
            "commands_sent": self.commands.sent,
            "commands_failed": self.commands.failed,
            "command_failures": dict(self.commands.failures),
            "command_p50_ms": round(c50, 3),
            "command_p99_ms": round(c99, 3),
            "raw_requests_sent": self.raw.sent,
            "raw_requests_failed": self.raw.failed,
            "raw_request_p50_ms": round(r50, 3),
            "raw_request_p99_ms": round(r99, 3),
            "command_p50_ratio": round(c50 / r50, 3) if r50 else None,
            "runs_created": len(self.runs),
            "runs_ended": len(ended),
            "run_errors": [f"{run.run_id}: {run.error}" for run in self.runs if run.error][:10],
            "runs_given_back": sum(1 for run in ended if statuses.get(run.run_id) == "complete"),
            "runs_not_given_back": {rid: s for rid, s in statuses.items() if s != "complete"},
            "resources_recorded": len(expected),
            "resources_executed_once": sum(1 for key in expected if executed[key] == 1),
            "resources_executed_twice": sum(1 for key in expected if executed[key] > 1),
            "resources_never_executed": sum(1 for key in expected if executed[key] == 0),
            "give_backs_replayed": dict(self.sim.replayed),
            "world_objects_left": objects_left,
            "world_leases_not_restored": len(lease_left),
            "rss_mb_start": start_rss,
            "rss_mb_end": end_rss,
            "rss_growth_pct": growth,
            "rss_growth_pct_max": max(processes.values(), default=0.0),
            "rss_growth_pct_max_process": max(processes, key=processes.get) if processes else None,
            "rss_mb_per_min_second_half": slope,
            "rss_second_half_from_s": half[0]["t_s"],
            "samples": self.samples,
            "services_died": self.dead_services(),
            "log_warnings": log_warnings(self.stack),
            "load_average_end": [round(x, 2) for x in os.getloadavg()],
            "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        }


def log_warnings(stack: Stack) -> dict[str, dict[str, int]]:
    """Per service log, how often each warning or error message was logged."""
    out: dict[str, dict[str, int]] = {}
    for child in stack.children:
        seen: Counter[str] = Counter()
        try:
            lines = child.log_path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:
                seen["(not JSON) " + line[:80]] += 1
                continue
            if entry.get("level") in ("warning", "error", "critical"):
                seen[f"{entry['level']}: {entry.get('msg', '')}"] += 1
        if seen:
            out[child.name] = dict(seen.most_common(10))
    return out


def problems(result: dict[str, Any]) -> list[str]:
    found = []
    for key in ("frames_lost", "frames_duplicated", "commands_failed", "resources_executed_twice",
                "resources_never_executed", "world_objects_left", "world_leases_not_restored"):
        if result[key]:
            found.append(f"{key} = {result[key]}")
    if result["runs_given_back"] != result["runs_created"]:
        found.append(f"runs given back {result['runs_given_back']} of {result['runs_created']} created")
    if result["frames_acknowledged"] != result["frames_sent"]:
        found.append(f"frames acknowledged {result['frames_acknowledged']} of {result['frames_sent']} sent")
    if result["services_died"]:
        found.append(f"services died: {result['services_died']}")
    return found


def print_summary(r: dict[str, Any]) -> None:
    print(f"\nsoak, {r['minutes']:g} min (+{r['warmup_s']:.0f} s warm-up), load average at the end "
          f"{r['load_average_end']}")
    print(f"  frames:   sent {r['frames_sent']}, acknowledged {r['frames_acknowledged']}, stored "
          f"{r['frames_stored']}, lost {r['frames_lost']}, duplicated {r['frames_duplicated']}")
    print(f"  commands: sent {r['commands_sent']}, failed {r['commands_failed']}, p50 {r['command_p50_ms']:.2f} ms, "
          f"p99 {r['command_p99_ms']:.2f} ms; raw request/reply p50 {r['raw_request_p50_ms']:.2f} ms, p99 "
          f"{r['raw_request_p99_ms']:.2f} ms ({r['raw_requests_failed']} failed); p50 ratio {r['command_p50_ratio']}")
    print(f"  runs:     created {r['runs_created']}, ended {r['runs_ended']}, given back {r['runs_given_back']}; "
          f"resources {r['resources_recorded']}: executed once {r['resources_executed_once']}, twice "
          f"{r['resources_executed_twice']}, never {r['resources_never_executed']}; replays {r['give_backs_replayed']}")
    print("  RSS MB (start → end, growth):")
    for name, start in r["rss_mb_start"].items():
        if name == "postgres-backend-count":
            continue
        end = r["rss_mb_end"].get(name)
        growth = r["rss_growth_pct"].get(name)
        print(f"    {name:<18} {start:8.1f} → {end:8.1f}" + (f"  ({growth:+.1f} %)" if growth is not None else ""))
    print(f"  RSS growth max: {r['rss_growth_pct_max']} % ({r['rss_growth_pct_max_process']}; "
          "postgres-backends aside, their number changes)")
    print(f"  RSS MB/min since {r['rss_second_half_from_s']:.0f} s: {r['rss_mb_per_min_second_half']}")
    if r["log_warnings"]:
        print(f"  warnings logged: {json.dumps(r['log_warnings'])}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=1.0,
                        help="minutes of load after the 10 s warm-up (default 1: `make bench` runs every "
                        "bench/*.py; the recorded figure is `make soak`, 10 minutes)")
    parser.add_argument("--state-dir", default="",
                        help="keep the stack's data and logs here (default: a temporary directory, removed)")
    parser.add_argument("--out", default="",
                        help=f"where to write the figures (default {RESULTS.relative_to(ROOT)} for a run of "
                        f"{RECORDED_MINUTES} minutes or more; a shorter run writes nothing unless given --out)")
    args = parser.parse_args()

    def on_sigterm(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    state_dir = Path(args.state_dir or tempfile.mkdtemp(prefix="bench-soak-")).resolve()
    stack = Stack(state_dir)
    stack.acquire()
    result: dict[str, Any] | None = None
    interrupted = False
    try:
        print(f"starting the embedded stack in {state_dir} …", flush=True)
        stack.start()
        print(f"ready: NATS {stack.nats.url}, shards at {stack.shard_addr}", flush=True)
        result = asyncio.run(Soak(stack, args.minutes).run())
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted; stopping everything …", file=sys.stderr, flush=True)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stack.stop()
        # Data and logs go with a clean or interrupted run; after an error or a problem they
        # are kept to read (and always with --state-dir).
        failed = result is None or bool(problems(result))
        if args.state_dir or (failed and not interrupted):
            print(f"data and logs kept in {state_dir}", flush=True)
        else:
            shutil.rmtree(state_dir, ignore_errors=True)
    if result is None:
        return 1
    print_summary(result)
    # `make bench` runs this for its default minute: that must not replace the recorded run.
    out = Path(args.out) if args.out else RESULTS if args.minutes >= RECORDED_MINUTES else None
    if out is None:
        print(f"{RESULTS.relative_to(ROOT)} not written: a run shorter than {RECORDED_MINUTES} minutes "
              "(--out FILE writes it elsewhere)")
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    found = problems(result)
    print("problems: " + ("; ".join(found) if found else "none"))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
