"""Benchmark: the gateway's ingest rate, its frame latency, and its command round trips.

From one run against one nats-server (JetStream, file store) and a real ``shardbus run
gateway`` process, each figure beside a raw baseline measured in the same run:

1. ingest: frames/s from one shard connection until a JetStream subscriber has received all
   of them (``ingest_frames_per_s``), beside nats-py publishing the same lines straight to
   JetStream with message ids and a window of acknowledgements, no gateway
   (``raw_publish_per_s``); the ratio is the figure (target >= 0.9, issue 15);
2. latency: p50/p99 shard → subscriber at a steady 1,000 frames/s (target p99 <= 5 ms);
3. commands: round trips/s and p50/p99 through the gateway and the shard simulator
   (``shardbus shard-sim``, its own process) with 64 concurrent callers, beside raw NATS
   request/reply to an echo responder in its own process (target ``command_p50_ratio`` <= 2.3);
4. many shards: 1,000 shard connections (``bench/shard_load.py``, a process of its own) at 20
   frames/s each on one fresh gateway process: frame p50/p99 shard → subscriber (targets p50
   <= 3 ms, p99 <= 10 ms) and the gateway's resident memory grown per shard (<= 40 KB);
5. the same on two gateways on a 3-node NATS cluster (streams replicated 3 times), frames
   numbered with the seed's ``seq``, 20 shards reconnecting to the other gateway halfway:
   every frame they sent is read back from JetStream (none missing, none twice).

Phases 1-4 run ``--rounds`` times (default 3), each round raw first, then the gateway; the
median of each figure is recorded, with every round's value beside the ratios.
``BENCH_PROFILE=<file>`` (with py-spy installed) records the gateway mid-load in phase 4 and
during the commands of phase 3 (collapsed stacks, as docs/performance.md quotes them).

Run alone: ``python bench/gateway.py [--frames N] [--shards N] [--only shards|ingest|commands]
[--rounds N] [--no-cluster] [--out FILE]``; writes ``bench/results/gateway.json`` (or ``--out``;
a partial run is merged into what that file holds).
``--sync always`` runs the same phases on a nats-server that fsyncs every JetStream write
before acknowledging it (the durable setting ``shardbus up`` ships) and writes
``bench/results/gateway-sync-always.json`` instead, so the two can be compared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import nats
import psutil

from shardbus import embedded
from shared import subjects

TOKEN = "bench-token-0000"
"""The shard token of the benchmark's gateway."""

CALLERS = 64
"""Concurrent command callers (gateway and raw alike)."""

COMMANDS = 5000
"""Command round trips measured per phase."""

LATENCY_FRAMES = 3000
"""Frames sent at 1,000 frames/s for the latency phase (3 s)."""

PAD = "x" * 60
"""Filler so a frame is about 120 bytes, like a small game event."""


def frame_line(kind: str, i: int) -> bytes:
    return b'{"t":%d,"kind":"%s","i":%d,"pad":"%s"}' % (int(time.time() * 1000), kind.encode(), i, PAD.encode())


def start_gateway(workdir: Path, nats_url: str, name: str = "gateway",
                  js_replicas: int = 1) -> tuple[subprocess.Popen, int]:
    """A real gateway process on a free port (its log ``<name>.log``); returns it and its shard port."""
    log_path = workdir / f"{name}.log"
    env = {**os.environ, "SHARDBUS_NATS_URL": nats_url, "SHARDBUS_SHARD_TOKEN": TOKEN,
           "SHARDBUS_SHARD_PORT": "0", "SHARDBUS_LOG_LEVEL": "INFO",
           "SHARDBUS_JETSTREAM_REPLICAS": str(js_replicas)}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "shardbus", "run", "gateway"], env=env, cwd=ROOT,
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for line in log_path.read_text(errors="replace").splitlines():
            if '"listening for shards"' in line:
                return proc, int(json.loads(line)["addr"].rsplit(":", 1)[1])
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    embedded.stop_process(proc)
    raise RuntimeError(f"gateway did not start:\n{log_path.read_text()[-2000:]}")


async def count_stored(nc: nats.NATS, subject: str, expect: int) -> tuple[asyncio.Event, list[int]]:
    """A JetStream (ordered consumer) subscriber that sets the event once ``expect`` arrived."""
    done, seen = asyncio.Event(), [0]

    async def on_msg(msg) -> None:
        seen[0] += 1
        if seen[0] >= expect:
            done.set()

    await nc.jetstream().subscribe(subject, ordered_consumer=True, cb=on_msg)
    return done, seen


async def dial(port: int, shard: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    hello = {"t": 1, "kind": "server.hello", "shard": shard, "protocol": 7, "token": TOKEN}
    writer.write(json.dumps(hello).encode() + b"\n")
    await writer.drain()
    return reader, writer


async def ingest(nats_url: str, port: int, frames: int, gateway_log: Path | None = None) -> tuple[float, int]:
    """Frames/s from one shard connection, written as fast as TCP takes them (1,000 lines a
    write: past the gateway's buffer, so it pauses the shard), until a JetStream subscriber
    holds them all; and how often the gateway paused the shard (``readsPaused`` of its log's
    "shard disconnected", -1 without a log). The link must end only when the shard closes it."""
    nc = await nats.connect(nats_url)
    shard = f"ing{uuid.uuid4().hex[:8]}"
    done, seen = await count_stored(nc, subjects.frame(shard, "bench.frame"), frames)
    lines = [frame_line("bench.frame", i) + b"\n" for i in range(frames)]
    _reader, writer = await dial(port, shard)
    started = time.perf_counter()
    try:
        for i in range(0, frames, 1000):
            writer.write(b"".join(lines[i:i + 1000]))
            await writer.drain()
        await asyncio.wait_for(done.wait(), 300)
    except (ConnectionError, TimeoutError) as exc:
        raise RuntimeError(f"ingest: {seen[0]} of {frames} frames stored; the link: "
                           f"{link_end(gateway_log, shard)}") from exc
    elapsed = time.perf_counter() - started
    writer.close()
    await nc.close()
    ended = {}
    for _ in range(100):  # the gateway logs the link's end once it sees the close
        if gateway_log is None or (ended := link_end(gateway_log, shard)):
            break
        await asyncio.sleep(0.05)
    if ended and ended.get("reason") != "the shard closed the connection":
        raise RuntimeError(f"ingest: the gateway ended the link: {ended}")
    return frames / elapsed, int(ended.get("readsPaused", -1)) if ended else -1


def link_end(gateway_log: Path | None, shard: str) -> dict:
    """The gateway's "shard disconnected" record of ``shard`` (empty when not logged yet)."""
    if gateway_log is None or not gateway_log.exists():
        return {}
    for line in gateway_log.read_text(errors="replace").splitlines():
        if '"shard disconnected"' in line and shard in line:
            record = json.loads(line)
            if record.get("shard") == shard:
                return record
    return {}


async def raw_publish(nats_url: str, frames: int) -> float:
    """The same lines published by nats-py to JetStream directly (message ids, windowed acks)."""
    nc = await nats.connect(nats_url)
    sub_nc = await nats.connect(nats_url)
    shard = f"raw{uuid.uuid4().hex[:8]}"
    subject = subjects.frame(shard, "bench.frame")
    done, _ = await count_stored(sub_nc, subject, frames)
    js = nc.jetstream(publish_async_max_pending=256)
    lines = [frame_line("bench.frame", i) for i in range(frames)]
    started = time.perf_counter()
    for i, line in enumerate(lines):
        await js.publish_async(subject, line, headers={"Nats-Msg-Id": f"{shard}.{i}"})
    await asyncio.wait_for(done.wait(), 300)
    elapsed = time.perf_counter() - started
    await nc.close()
    await sub_nc.close()
    return frames / elapsed


async def latency_at_1k(nats_url: str, port: int) -> tuple[float, float]:
    """p50/p99 ms from the shard writing a frame to a live subscriber receiving it."""
    nc = await nats.connect(nats_url)
    shard = f"lat{uuid.uuid4().hex[:8]}"
    sent: dict[int, int] = {}
    latencies: list[float] = []
    done = asyncio.Event()

    async def on_msg(msg) -> None:
        i = json.loads(msg.data)["i"]
        latencies.append((time.perf_counter_ns() - sent[i]) / 1e6)
        if len(latencies) >= LATENCY_FRAMES:
            done.set()

    await nc.subscribe(subjects.frame(shard, "bench.lat"), cb=on_msg)
    await nc.flush()
    _reader, writer = await dial(port, shard)
    await asyncio.sleep(0.5)
    started = time.perf_counter()
    for i in range(LATENCY_FRAMES):
        delay = started + i / 1000 - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        sent[i] = time.perf_counter_ns()
        writer.write(frame_line("bench.lat", i) + b"\n")
    await asyncio.wait_for(done.wait(), 60)
    writer.close()
    await nc.close()
    q = statistics.quantiles(latencies, n=100)
    return statistics.median(latencies), q[98]


async def round_trips(request, count: int) -> tuple[float, float, float]:
    """``count`` requests by CALLERS concurrent callers: per second, p50 ms, p99 ms."""
    times: list[float] = []
    remaining = [count]

    async def caller() -> None:
        while remaining[0] > 0:
            remaining[0] -= 1
            t0 = time.perf_counter()
            await request()
            times.append((time.perf_counter() - t0) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(CALLERS)))
    elapsed = time.perf_counter() - started
    q = statistics.quantiles(times, n=100)
    return count / elapsed, statistics.median(times), q[98]


ECHO_RESPONDER = """
import asyncio, sys, nats
async def main():
    nc = await nats.connect(sys.argv[1])
    async def echo(msg):
        await msg.respond(msg.data)
    await nc.subscribe(sys.argv[2], cb=echo)
    await nc.flush()
    print("ready", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""
"""The raw baseline's responder: a process of its own, as the shard simulator is."""


def start_shard_sim(port: int, shard: str) -> subprocess.Popen:
    """``shardbus shard-sim`` dialling the gateway's ``port`` as ``shard``, in its own process."""
    return subprocess.Popen([sys.executable, "-m", "shardbus", "shard-sim", "--addr", f"127.0.0.1:{port}",
                             "--shard", shard], cwd=ROOT, env={**os.environ, "SHARDBUS_SHARD_TOKEN": TOKEN},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)


async def until_answered(nc: nats.NATS, subject: str) -> None:
    """Ask ``subject`` until somebody answers (the shard has said hello), for at most 30 s."""
    async with asyncio.timeout(30):
        while True:
            try:
                await nc.request(subject, b"{}", timeout=2)
                return
            except nats.errors.NoRespondersError:
                await asyncio.sleep(0.1)


async def commands(nats_url: str, port: int, gateway_pid: int | None = None,
                   nats_pid: int | None = None) -> tuple[float, float, float, dict[str, float]]:
    """Round trips/s, p50 ms, p99 ms, and the CPU µs per command of each process on the path
    (gateway, nats-server, the shard simulator, the bench's client): CPU time is steadier than
    latency on a busy machine, and says which process bounds the round trip."""
    nc = await nats.connect(nats_url)
    shard = f"cmd{uuid.uuid4().hex[:8]}"
    sim = start_shard_sim(port, shard)
    subject = subjects.command(shard, "item.catalog")
    pids = {"gateway": gateway_pid, "nats_server": nats_pid, "shard_sim": sim.pid, "client": os.getpid()}
    try:
        await until_answered(nc, subject)
        return await _command_rounds(nc, subject, pids)
    finally:
        embedded.stop_process(sim)
        await nc.close()


def cpu_split(pids: dict[str, int | None]) -> dict[str, float]:
    return {name: cpu_s([pid]) for name, pid in pids.items() if pid}


async def _command_rounds(nc: nats.NATS, subject: str,
                          pids: dict[str, int | None]) -> tuple[float, float, float, dict[str, float]]:
    gateway_pid = pids.get("gateway")

    async def request() -> None:
        # Checked without parsing the whole reply: the raw baseline parses nothing either,
        # and on two cores the caller's json.loads competes with the gateway for a core.
        data = (await nc.request(subject, b"{}", timeout=10)).data
        assert data.startswith(b'{"status":200,'), data[:200]

    await round_trips(request, 500)  # warm-up
    before = cpu_split(pids)
    spy = await _profile(gateway_pid, 2) if gateway_pid and os.environ.get("BENCH_PROFILE") else None
    count = COMMANDS if spy is None else COMMANDS * 4
    rps, p50, p99 = await round_trips(request, count)
    if spy is not None:
        await spy.wait()
    after = cpu_split(pids)
    return rps, p50, p99, {name: round((after[name] - before[name]) * 1e6 / count, 1) for name in before}


async def raw_requests(nats_url: str, nats_pid: int | None = None) -> tuple[float, float, float, dict[str, float]]:
    nc = await nats.connect(nats_url)
    subject = f"bench.echo.{uuid.uuid4().hex[:8]}"
    responder = subprocess.Popen([sys.executable, "-c", ECHO_RESPONDER, nats_url, subject],
                                 stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    await asyncio.to_thread(responder.stdout.readline)
    await asyncio.sleep(0.1)

    async def request() -> None:
        await nc.request(subject, b"{}", timeout=10)

    pids = {"nats_server": nats_pid, "responder": responder.pid, "client": os.getpid()}
    try:
        await round_trips(request, 500)
        before = cpu_split(pids)
        rps, p50, p99 = await round_trips(request, COMMANDS)
        after = cpu_split(pids)
        return rps, p50, p99, {name: round((after[name] - before[name]) * 1e6 / COMMANDS, 1) for name in before}
    finally:
        embedded.stop_process(responder)
        await nc.close()


SAMPLE_EVERY = 10
"""One frame in ten of each shard carries its send time (``bench.sample``): the latency is read
from those, so the bench's own subscriber costs a tenth of the load."""


MOVED_SHARDS = 20
"""Shards that reconnect to the other gateway halfway through the cluster run."""


def median_of_rounds(each: list[dict[str, float]]) -> dict:
    """Each figure's median over the rounds; each ratio's value in every round beside it."""
    merged: dict = {}
    for key in each[0]:
        values = [r[key] for r in each if key in r]
        merged[key] = values[0] if len(set(values)) == 1 else round(statistics.median(values), 3)
        if key.endswith("_ratio") or key.endswith("_p50_ms") or key == "ingest_reads_paused":
            merged[f"{key}_each_round"] = values
    merged["rounds"] = len(each)
    return merged


def shards_rounds(key: str, runs: list[dict]) -> dict:
    """The one-gateway many-shards runs: medians of p50, p99 and RSS per shard, and each run."""
    out: dict = {"shards_rounds": len(runs)}
    for name in ("frame_p50_ms", "frame_p99_ms", "rss_kb_per_shard"):
        values = [run[name] for run in runs]
        out[f"{key}_{name}"] = round(statistics.median(values), 3)
        out[f"{key}_{name}_each_round"] = values
    out[f"{key}_runs"] = runs
    return out


def rss_kb(procs: list[subprocess.Popen]) -> float:
    """The resident memory of ``procs``, added up, in KB."""
    return sum(psutil.Process(proc.pid).memory_info().rss for proc in procs) / 1024


def cpu_s(pids: list[int]) -> float:
    """CPU seconds (user and system) the processes ``pids`` have used."""
    total = 0.0
    for pid in pids:
        times = psutil.Process(pid).cpu_times()
        total += times.user + times.system
    return total


async def _profile(pid: int, seconds: float):
    """py-spy on the first gateway for ``seconds`` mid-load (``BENCH_PROFILE=<file>``: collapsed
    stacks, for docs/performance.md's profiles); py-spy must be installed."""
    return await asyncio.create_subprocess_exec(
        "py-spy", "record", "--rate", "200", "--duration", str(max(1, int(seconds))), "--format", "raw",
        "--nonblocking", "--output", os.environ["BENCH_PROFILE"], "--pid", str(pid),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)


async def many_shards(nats_url: str, gateways: list[tuple[subprocess.Popen, int]], shards: int, rate: float,
                      seconds: float, nats_pid: int, move: int = 0) -> dict[str, float]:
    """``shards`` connections (``bench/shard_load.py``, its own process) spread over ``gateways``,
    ``rate`` frames/s each for ``seconds``: frame p50/p99 shard → live subscriber, and what the
    gateway processes' resident memory grew by per shard (read mid-load)."""
    nc = await nats.connect(servers=nats_url.split(","))
    latencies: list[float] = []
    flowing: set[bytes] = set()

    async def on_sample(msg) -> None:
        data = msg.data
        j = data.index(b'"ns":') + 5
        latencies.append((time.monotonic_ns() - int(data[j:data.index(b",", j)])) / 1e6)
        flowing.add(msg.subject.split(".", 2)[1].encode())

    await nc.subscribe(subjects.frame("*", "bench.sample"), cb=on_sample)
    await nc.flush()
    procs = [proc for proc, _ in gateways]
    before = rss_kb(procs)
    load = await asyncio.create_subprocess_exec(
        sys.executable, str(ROOT / "bench" / "shard_load.py"), "--ports", ",".join(str(p) for _, p in gateways),
        "--shards", str(shards), "--rate", str(rate), "--seconds", str(seconds),
        "--sample-every", str(SAMPLE_EVERY), "--prefix", f"m{uuid.uuid4().hex[:6]}", "--token", TOKEN,
        *(("--seq", "--move", str(move)) if move else ()),
        stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL)
    pids = {"gateway": [proc.pid for proc in procs], "nats_server": [nats_pid], "bench": [os.getpid()]}
    try:
        connected = await asyncio.wait_for(load.stdout.readline(), 120)
        assert connected.startswith(b"connected"), connected
        await asyncio.sleep(1.0)  # the load's first second is quiet
        cpu_before = {name: cpu_s(p) for name, p in pids.items()}
        spy = await _profile(procs[0].pid, seconds / 2) if os.environ.get("BENCH_PROFILE") else None
        await asyncio.sleep(seconds / 2)
        during = rss_kb(procs)
        if spy is not None:
            await spy.wait()
        summary = json.loads(await asyncio.wait_for(load.stdout.readline(), seconds + 120))
        cpu_used = {name: round(cpu_s(p) - cpu_before[name], 2) for name, p in pids.items() }
        cpu_used["load"] = summary["cpu_s"]
        await asyncio.wait_for(load.wait(), 30)
    finally:
        if load.returncode is None:
            load.kill()
            await load.wait()
    # Every sample on its way arrives (frames are never dropped, only late): up to a minute.
    ended = time.monotonic()
    while len(latencies) < summary["samples"] and time.monotonic() - ended < 60:
        await asyncio.sleep(0.05)
    drain_s = time.monotonic() - ended
    moved = await read_back_moved(nc, summary.get("moved", {}))
    await nc.close()
    q = statistics.quantiles(latencies, n=100)
    return {"shards": shards, "replicas": len(gateways), "frames_per_s_per_shard": rate,
            "frames_sent": summary["sent"], "frames_per_s": round(summary["sent"] / seconds, 1),
            "samples_sent": summary["samples"], "samples_received": len(latencies),
            "shards_flowing": len(flowing), "connections_closed": summary["closed"],
            "load_late_ticks": summary["late_ticks"], "drain_after_load_s": round(drain_s, 2),
            "cpu_s_during_load": cpu_used,
            "frame_p50_ms": round(statistics.median(latencies), 3), "frame_p99_ms": round(q[98], 3),
            "rss_kb_before": round(before), "rss_kb_during": round(during),
            "rss_kb_per_shard": round((during - before) / shards, 1), **moved}


async def read_back_moved(nc: nats.NATS, moved: dict[str, list[int]]) -> dict[str, int]:
    """Every frame of the shards that reconnected to the other gateway, read back from
    JetStream by ``seq``: how many were sent, stored, missing and stored twice."""
    if not moved:
        return {}
    js = nc.jetstream()
    sent = stored = missing = twice = 0
    for shard, (_before, total) in moved.items():
        sub = await js.subscribe(subjects.frame(shard, ">"), ordered_consumer=True)
        seen: list[int] = []
        try:
            while len(seen) < total:
                msg = await sub.next_msg(timeout=5)
                body = json.loads(msg.data)
                if "seq" in body:
                    seen.append(body["seq"])
        except nats.errors.TimeoutError:
            pass
        finally:
            await sub.unsubscribe()
        sent += total
        stored += len(set(seen))
        missing += len(set(range(1, total + 1)) - set(seen))
        twice += len(seen) - len(set(seen))
    return {"moved_shards": len(moved), "moved_frames_sent": sent, "moved_frames_stored": stored,
            "moved_frames_missing": missing, "moved_frames_twice": twice}


async def shards_phase(workdir: Path, nats_url: str, shards: int, rate: float, seconds: float,
                       replicas: int, nats_pid: int, move: int = 0, js_replicas: int = 1) -> dict[str, float]:
    """The many-shards run on ``replicas`` fresh gateway processes, stopped after it."""
    gateways: list[tuple[subprocess.Popen, int]] = []
    try:
        for n in range(replicas):
            gateways.append(start_gateway(workdir, nats_url, f"gateway-many-{replicas}-{n}-{uuid.uuid4().hex[:4]}",
                                          js_replicas))
        result = await many_shards(nats_url, gateways, shards, rate, seconds, nats_pid, move)
    finally:
        for proc, _ in gateways:
            embedded.stop_process(proc)
    if move:
        print(f"moved shards: {result.get('moved_shards')}, frames sent {result.get('moved_frames_sent')}, "
              f"stored {result.get('moved_frames_stored')}, missing {result.get('moved_frames_missing')}, "
              f"twice {result.get('moved_frames_twice')}")
    print(f"{shards} shards x {rate:g} f/s on {replicas} gateway(s): p50 {result['frame_p50_ms']:.2f} ms  "
          f"p99 {result['frame_p99_ms']:.2f} ms  {result['rss_kb_per_shard']:.1f} KB/shard  "
          f"samples {result['samples_received']}/{result['samples_sent']} (drained {result['drain_after_load_s']} s "
          f"after)  flowing {result['shards_flowing']}  cpu s {result['cpu_s_during_load']}")
    return result


async def measure(nats_url: str, port: int, frames: int, only: str = "all",
                  gateway_pid: int | None = None, nats_pid: int | None = None,
                  gateway_log: Path | None = None) -> dict[str, float]:
    """The single-shard phases: ``only`` "all" (ingest, latency, commands), "ingest" or "commands"."""
    results: dict[str, float] = {}
    if only in ("all", "ingest"):
        raw_rate = await raw_publish(nats_url, frames)
        print(f"raw JetStream publish:  {raw_rate:10.0f} frames/s")
        ingest_rate, paused = await ingest(nats_url, port, frames, gateway_log)
        print(f"gateway ingest:         {ingest_rate:10.0f} frames/s  ({ingest_rate / raw_rate:.2f} of raw)"
              f"  shard paused {paused} times")
        results.update({
            "frames": frames,
            "ingest_reads_paused": paused,
            "ingest_frames_per_s": round(ingest_rate, 1),
            "raw_publish_per_s": round(raw_rate, 1),
            "ingest_ratio": round(ingest_rate / raw_rate, 3),
        })
    if only == "all":
        p50, p99 = await latency_at_1k(nats_url, port)
        print(f"latency at 1,000 f/s:   p50 {p50:.2f} ms  p99 {p99:.2f} ms")
        results.update({"latency_p50_ms_at_1k": round(p50, 3), "latency_p99_ms_at_1k": round(p99, 3)})
    if only in ("all", "commands"):
        raw_rps, raw_p50, raw_p99, raw_cpu = await raw_requests(nats_url, nats_pid)
        print(f"raw request/reply:      {raw_rps:10.0f} /s  p50 {raw_p50:.2f} ms  p99 {raw_p99:.2f} ms"
              f"  CPU us/request {raw_cpu}")
        cmd_rps, cmd_p50, cmd_p99, cmd_cpu = await commands(nats_url, port, gateway_pid, nats_pid)
        cmd_cpu_us = cmd_cpu.get("gateway", 0.0)
        print(f"gateway commands:       {cmd_rps:10.0f} /s  p50 {cmd_p50:.2f} ms  p99 {cmd_p99:.2f} ms"
              f"  ({cmd_p50 / raw_p50:.2f}x raw p50)  CPU us/command {cmd_cpu}")
        results.update({
            "command_round_trips_per_s": round(cmd_rps, 1),
            "command_p50_ms": round(cmd_p50, 3),
            "command_p99_ms": round(cmd_p99, 3),
            "raw_request_per_s": round(raw_rps, 1),
            "raw_request_p50_ms": round(raw_p50, 3),
            "raw_request_p99_ms": round(raw_p99, 3),
            "command_p50_ratio": round(cmd_p50 / raw_p50, 3),
            "command_gateway_cpu_us": round(cmd_cpu_us, 1),
            "command_cpu_us_total": round(sum(cmd_cpu.values()), 1),
            "raw_request_cpu_us_total": round(sum(raw_cpu.values()), 1),
        })
        for name, us in cmd_cpu.items():
            results[f"command_cpu_us_{name}"] = us
        for name, us in raw_cpu.items():
            results[f"raw_request_cpu_us_{name}"] = us
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=200_000, help="frames in the ingest phase")
    parser.add_argument("--shards", type=int, default=1000, help="shard connections in the many-shards phase")
    parser.add_argument("--shard-rate", type=float, default=20.0, help="frames/s of each of those shards")
    parser.add_argument("--shard-seconds", type=float, default=10.0, help="how long they send")
    parser.add_argument("--only", choices=("all", "shards", "ingest", "commands"), default="all",
                        help="'shards': only the many-shards phase; 'ingest': only the ingest phase; "
                        "'commands': only the command phase (each merged into the results file)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="interleaved rounds of each phase (raw, then the gateway); medians recorded")
    parser.add_argument("--no-cluster", dest="cluster", action="store_false",
                        help="skip the two-gateway run on a 3-node NATS cluster")
    parser.add_argument("--out", type=Path, default=None,
                        help="results file (default bench/results/gateway.json, or "
                        "gateway-sync-always.json with --sync always)")
    parser.add_argument("--sync", choices=("default", "always"), default="default",
                        help="JetStream fsync: 'default' (periodic, every 2 min) or 'always' (every "
                        "write, before its acknowledgement: what shardbus up runs)")
    args = parser.parse_args()
    print(f"JetStream sync: {args.sync}")
    name = "gateway.json" if args.sync == "default" else "gateway-sync-always.json"
    out = args.out.resolve() if args.out else ROOT / "bench" / "results" / name
    results: dict = json.loads(out.read_text()) if args.only != "all" and out.exists() else {}
    rounds = args.rounds
    findings: dict[str, str] = {}
    """Phases that died, and how: written into the results (a bench that dies is a finding)."""
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp:
        workdir = Path(tmp)
        server = embedded.start_nats(workdir / "nats", durable=args.sync == "always")
        gateway = None
        try:
            if args.only != "shards":
                # Rounds interleaved: each measures raw, then the gateway, so a slow minute of the
                # machine falls on both; the ratios' median is the figure.
                gateway, port = start_gateway(workdir, server.url)
                try:
                    each = [asyncio.run(measure(server.url, port, args.frames, args.only, gateway.pid,
                                                server.proc.pid, workdir / "gateway.log"))
                            for _ in range(rounds)]
                    results.update(median_of_rounds(each))
                except Exception as exc:  # a bench that dies is a finding: recorded
                    findings["single_shard"] = f"{type(exc).__name__}: {exc}"
                embedded.stop_process(gateway)
                gateway = None
            if args.only in ("all", "shards"):
                key = f"shards_{args.shards}"
                try:
                    runs = [asyncio.run(shards_phase(workdir, server.url, args.shards, args.shard_rate,
                                                     args.shard_seconds, 1, server.proc.pid)) for _ in range(rounds)]
                    results.update(shards_rounds(key, runs))
                except Exception as exc:  # recorded, as above
                    findings[key] = f"{type(exc).__name__}: {exc}"
        finally:
            if gateway is not None:
                embedded.stop_process(gateway)
            server.stop()
        if args.only in ("all", "shards") and args.cluster:
            # Two gateways on a 3-node cluster (streams replicated 3 times), a few shards moving
            # from one to the other halfway: nothing they sent may be missing or stored twice.
            cluster = embedded.start_nats_cluster(workdir / "cluster", 3, durable=args.sync == "always")
            key = f"shards_{args.shards}_replicas2_cluster3"
            try:
                pids = [node.proc.pid for node in cluster.nodes]
                many = asyncio.run(shards_phase(workdir, cluster.url, args.shards, args.shard_rate,
                                                args.shard_seconds, 2, pids[0], move=MOVED_SHARDS, js_replicas=3))
                for name in ("frame_p50_ms", "frame_p99_ms", "rss_kb_per_shard"):
                    results[f"{key}_{name}"] = many[name]
                results[f"{key}_run"] = many
            except Exception as exc:  # recorded, as above
                findings[key] = f"{type(exc).__name__}: {exc}"
            finally:
                cluster.stop()
    shards_key = f"shards_{args.shards}"
    # Issue 26's targets, for the figures this file holds (--only shards without an earlier run: those).
    limits = {"ingest_ratio": (1.0, "min"), "latency_p99_ms_at_1k": (5.0, "max"), "command_p50_ratio": (2.3, "max"),
              f"{shards_key}_frame_p99_ms": (10.0, "max"), f"{shards_key}_frame_p50_ms": (3.0, "max"),
              f"{shards_key}_rss_kb_per_shard": (40.0, "max")}
    targets = {key: results[key] >= limit if kind == "min" else results[key] <= limit
               for key, (limit, kind) in limits.items() if key in results}
    results["targets_met"] = targets
    results["sync"] = args.sync
    results["phases_failed"] = findings
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"targets met: {targets}\nwrote {out}")
    for phase, why in findings.items():
        print(f"PHASE FAILED: {phase}: {why}", file=sys.stderr)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
