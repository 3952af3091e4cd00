"""Benchmark: the web door's route latency beside the same request over NATS, and its live
feed's throughput to 100 WebSocket clients.

From one run against one nats-server and real processes (``shardbus run gateway``, ``shardbus
run web``, ``shardbus shard-sim``):

1. routes: ``GET /shards/<shard>/items`` (the sidecar's item catalog: door → gateway → shard →
   back) over HTTP/1.1 keep-alive (aiohttp), beside the very same command as a NATS request
   (``shard.<shard>.cmd.item.catalog``: gateway → shard → back), in the same run, interleaved
   in ROUNDS rounds (at least 3), each round's door p50 over that round's NATS p50, the median
   of those ratios recorded. Once by one caller: the latency a request sees,
   ``route_p50_ratio`` (target <= 1.5); once by CALLERS
   concurrent callers: ``loaded_route_p50_ratio``, which on two cores shared by the client,
   nats-server, gateway, simulator and door measures CPU per request more than latency;
2. feed: frames/s delivered to 100 WebSocket clients of ``/ws`` beside 100 nats-py subscribers
   (bench/web_feed.py), interleaved in ROUNDS rounds, ``feed.feed_ratio`` the median of the
   rounds' feed/raw (target >= 0.8).

Run alone: ``python bench/web.py``; writes ``bench/results/web.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import aiohttp
import gateway as gateway_bench  # bench/gateway.py: its process and timing helpers
import nats
import web_feed  # bench/web_feed.py: the door's process, and the feed's phase

from shardbus import embedded
from shared import subjects

WEB_TOKEN = "bench-web-token-0000"
CALLERS = 16
"""Concurrent callers, HTTP and NATS alike."""

REQUESTS = 4000
"""Round trips measured per phase."""

ROUNDS = 5
"""Interleaved rounds (NATS, door, NATS, door …); the median of the rounds' ratios is kept."""


async def routes(nats_url: str, shard_port: int, web_port: int, rounds: int) -> dict[str, float]:
    shard = f"web{uuid.uuid4().hex[:8]}"
    sim = gateway_bench.start_shard_sim(shard_port, shard)
    nc = await nats.connect(nats_url)
    subject = subjects.command(shard, "item.catalog")
    try:
        await gateway_bench.until_answered(nc, subject)

        async def over_nats() -> None:
            data = (await nc.request(subject, b"{}", timeout=10)).data
            assert data.startswith(b'{"status":200,'), data[:200]

        connector = aiohttp.TCPConnector(limit=CALLERS)
        async with aiohttp.ClientSession(f"http://127.0.0.1:{web_port}", connector=connector,
                                         headers={"Authorization": f"Bearer {WEB_TOKEN}"}) as http:
            async def over_http() -> None:
                async with http.get(f"/shards/{shard}/items") as response:
                    body = await response.read()
                    assert response.status == 200, body[:200]

            figures: dict[str, float | list[float]] = {"callers": CALLERS}
            for callers, prefix, count in ((1, "", REQUESTS // 4), (CALLERS, "loaded_", REQUESTS)):
                gateway_bench.CALLERS = callers
                results: dict[str, list[tuple[float, float, float]]] = {"nats": [], "http": []}
                for _round in range(rounds):  # interleaved, so a noisy moment hits both
                    await gateway_bench.round_trips(over_nats, 200)
                    results["nats"].append(await gateway_bench.round_trips(over_nats, count))
                    await gateway_bench.round_trips(over_http, 200)
                    results["http"].append(await gateway_bench.round_trips(over_http, count))
                ratios = [h[1] / n[1] for h, n in zip(results["http"], results["nats"], strict=True)]
                med = {name: [statistics.median(r[i] for r in runs) for i in range(3)]
                       for name, runs in results.items()}
                figures.update({
                    f"{prefix}nats_per_s": round(med["nats"][0], 1),
                    f"{prefix}nats_p50_ms": round(med["nats"][1], 3),
                    f"{prefix}nats_p99_ms": round(med["nats"][2], 3),
                    f"{prefix}route_per_s": round(med["http"][0], 1),
                    f"{prefix}route_p50_ms": round(med["http"][1], 3),
                    f"{prefix}route_p99_ms": round(med["http"][2], 3),
                    f"{prefix}route_p50_ratio": round(statistics.median(ratios), 3),
                    f"{prefix}route_p50_ratios_each_round": [round(r, 3) for r in ratios],
                    f"{prefix}route_per_s_ratio": round(med["http"][0] / med["nats"][0], 3),
                })
    finally:
        embedded.stop_process(sim)
        await nc.close()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-feed", action="store_true", help="measure the routes only")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"interleaved rounds, at least 3 (default {ROUNDS})")
    args = parser.parse_args()
    if args.rounds < 3:
        parser.error("--rounds: at least 3 (the median of the rounds is recorded)")
    with tempfile.TemporaryDirectory(prefix="bench-web-") as tmp:
        workdir = Path(tmp)
        server = embedded.start_nats(workdir / "nats")
        procs: list[subprocess.Popen] = []
        try:
            gateway, shard_port = gateway_bench.start_gateway(workdir, server.url)
            procs.append(gateway)
            web_port = web_feed.free_port()
            procs.append(web_feed.start_door(workdir, server.url, web_port, WEB_TOKEN))
            results = asyncio.run(routes(server.url, shard_port, web_port, args.rounds))
            for prefix, label in (("", "1 caller"), ("loaded_", f"{CALLERS} callers")):
                print(f"NATS request, {label}:  p50 {results[prefix + 'nats_p50_ms']:.2f} ms  "
                      f"p99 {results[prefix + 'nats_p99_ms']:.2f} ms  {results[prefix + 'nats_per_s']:.0f}/s")
                print(f"door route, {label}:    p50 {results[prefix + 'route_p50_ms']:.2f} ms  "
                      f"p99 {results[prefix + 'route_p99_ms']:.2f} ms  {results[prefix + 'route_per_s']:.0f}/s  "
                      f"({results[prefix + 'route_p50_ratio']:.2f}x NATS p50)")
            if not args.no_feed:
                feed = asyncio.run(web_feed.feed_throughput(nats_url=server.url, web_port=web_port,
                                                            token=WEB_TOKEN, rounds=args.rounds))
                results["feed"] = feed
                print(f"feed:          {json.dumps(feed)}")
        finally:
            for proc in procs:
                embedded.stop_process(proc)
            server.stop()
    results["rounds"] = args.rounds
    results["targets_met"] = {"route_p50_ratio": results["route_p50_ratio"] <= 1.5}
    if "feed" in results:
        results["targets_met"]["feed_ratio"] = results["feed"]["feed_ratio"] >= 0.8
    out = ROOT / "bench" / "results" / "web.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"targets met: {results['targets_met']}\nwrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
