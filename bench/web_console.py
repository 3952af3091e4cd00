"""Benchmark: the operator console's runs page (``GET /console/runs``) with 100,000 runs in the
ledger.

One nats-server, one PostgreSQL, a real ``shardbus run ledger`` and a real ``shardbus run web``;
the runs are inserted straight into the ledger's table with SQL (shards uo1-uo8, created a minute
apart, about 1 in 500 with an incomplete cleanup; each scheduled to start when it was created and
to end 45 minutes later, except every tenth, which is not scheduled). A logged-in client then
asks each page kind in turn, one request at a time, and records the door's own time for it (its
``Server-Timing: app`` header: from the request's arrival to the page rendered, the ledger's
answers included) and the time the client saw; deep pages are reached once by following the
pages' "next page" links, then measured. The ledger's own reads (``ledger.runs``,
``ledger.leases.overdue``) are measured beside them.

Run alone: ``python bench/web_console.py [--runs 100000] [--requests 200]``; writes
``bench/results/web_console.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import html
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import asyncpg
import httpx
import ledger as ledger_bench  # bench/ledger.py: its ledger process
import nats
import web_feed  # bench/web_feed.py: a free port

from shardbus import embedded
from shared import subjects

WEB_TOKEN = "bench-console-website-0000"
OPERATOR_TOKEN = "bench-console-operator-0000"
WARMUP = 20

PAGES = {
    # name: (path, query, "next page" links followed to reach it)
    "first_page": ("/console/runs", {}, 0),
    "page_10": ("/console/runs", {}, 9),
    "page_100": ("/console/runs", {}, 99),
    "incomplete_only": ("/console/runs", {"cleanupStatus": "incomplete"}, 0),
    "status_running": ("/console/runs", {"status": "running"}, 0),
    "shard_uo3": ("/console/runs", {"shard": "uo3"}, 0),
    "one_day": ("/console/runs", {"from": "2026-02-01T00:00", "to": "2026-02-02T00:00"}, 0),
    "calendar_one_day": ("/console/calendar", {"start": "2026-02-01", "days": "1"}, 0),
}
"""The page kinds measured."""

DAY_MS = (1_769_904_000_000, 1_769_990_400_000)
"""2026-02-01 and 2026-02-02, 00:00 UTC, in epoch milliseconds (the one-day window)."""


async def fill(db_url: str, runs: int) -> None:
    conn = await asyncpg.connect(db_url.replace("postgresql+asyncpg://", "postgresql://", 1))
    try:
        await conn.execute("""
            INSERT INTO runs (run_id, shard, event, status, cleanup_status, created_at, updated_at, ended_at,
                              starts_at, ends_at)
            SELECT 'b' || g, 'uo' || (1 + g % 8), (ARRAY['invasion', 'festival', 'hunt'])[1 + g % 3],
                   (ARRAY['completed', 'completed', 'completed', 'cancelled', 'failed', 'running',
                          'scheduled'])[1 + g % 7],
                   CASE WHEN g % 500 = 0 THEN 'incomplete' ELSE 'complete' END,
                   timestamptz '2026-01-01 00:00:00+00' + g * interval '1 minute', now(), NULL,
                   CASE WHEN g % 10 <> 0 THEN 1767225600000 + g::bigint * 60000 END,
                   CASE WHEN g % 10 <> 0 THEN 1767225600000 + g::bigint * 60000 + 2700000 END
            FROM generate_series(1, $1) g""", runs)
        await conn.execute("ANALYZE runs")
    finally:
        await conn.close()


def start_door(workdir: Path, nats_url: str, port: int) -> subprocess.Popen:
    log_path = workdir / "web.log"
    env = {**os.environ, "SHARDBUS_NATS_URL": nats_url, "SHARDBUS_WEB_TOKEN": WEB_TOKEN,
           "SHARDBUS_WEB_OPERATOR_TOKEN": OPERATOR_TOKEN, "SHARDBUS_WEB_PORT": str(port),
           "SHARDBUS_LOG_LEVEL": "WARNING"}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "shardbus", "run", "web"], env=env, cwd=ROOT,
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            if proc.poll() is not None:
                break
        time.sleep(0.1)
    embedded.stop_process(proc)
    raise RuntimeError(f"web did not start:\n{log_path.read_text()[-2000:]}")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def measure(nats_url: str, port: int, requests: int) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, float]] = {}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        login = await http.post("/console/login", data={"token": OPERATOR_TOKEN})
        assert login.status_code == 303, login.text
        for name, (path, query, follow) in PAGES.items():
            url = path + ("?" + urlencode(query) if query else "")
            for _ in range(follow):
                link = re.search(r'<a rel="next" href="([^"]+)"', (await http.get(url)).text)
                assert link, f"{name}: fewer pages than {follow + 1}"
                url = html.unescape(link.group(1))
            server, client, rows = [], [], 0
            for i in range(WARMUP + requests):
                started = time.perf_counter()
                page = await http.get(url)
                elapsed = (time.perf_counter() - started) * 1000
                assert page.status_code == 200 and 'class="problem"' not in page.text, page.text[-2000:]
                if i >= WARMUP:
                    client.append(elapsed)
                    server.append(float(page.headers["server-timing"].split("dur=")[1]))
                rows = len(re.findall(r'<(?:tr|li) data-run=', page.text))
            results[name] = {"server_p50_ms": round(statistics.median(server), 2),
                             "server_p99_ms": round(_percentile(server, 0.99), 2),
                             "client_p50_ms": round(statistics.median(client), 2),
                             "client_p99_ms": round(_percentile(client, 0.99), 2), "rows_shown": rows}
    nc = await nats.connect(nats_url)
    try:  # the ledger's own reads behind the pages, for comparison
        day = {"startsFrom": DAY_MS[0], "startsBefore": DAY_MS[1]}
        for name, subject, body in (
                ("ledger_runs_incomplete_limit_50", subjects.LEDGER_RUNS, {"cleanupStatus": "incomplete", "limit": 50}),
                ("ledger_runs_newest_limit_50", subjects.LEDGER_RUNS, {"limit": 50}),
                ("ledger_runs_newest_limit_1000", subjects.LEDGER_RUNS, {"limit": 1000}),
                ("ledger_runs_shard_uo3_limit_50", subjects.LEDGER_RUNS, {"shard": "uo3", "limit": 50}),
                ("ledger_runs_one_day_limit_50", subjects.LEDGER_RUNS, {**day, "limit": 50}),
                ("ledger_runs_one_day_limit_1000", subjects.LEDGER_RUNS, {**day, "limit": 1000}),
                ("ledger_leases_overdue_limit_10", subjects.LEDGER_LEASES_OVERDUE, {"limit": 10})):
            times = []
            for i in range(WARMUP + requests):
                started = time.perf_counter()
                reply = json.loads((await nc.request(subject, json.dumps(body).encode(), timeout=30)).data)
                assert reply["status"] == 200, reply
                if i >= WARMUP:
                    times.append((time.perf_counter() - started) * 1000)
            results[name] = {"p50_ms": round(statistics.median(times), 2), "p99_ms": round(_percentile(times, 0.99), 2)}
    finally:
        await nc.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=100_000, help="runs in the ledger")
    parser.add_argument("--requests", type=int, default=200, help="requests measured per page kind")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-console-", dir="/tmp"))
    nats_server = embedded.start_nats(tmp / "nats")
    pg = embedded.start_postgres(tmp / "pg", durable=True)
    ledger = door = None
    try:
        pg.create_database("bench")
        db_url = pg.url("bench")
        subprocess.run([sys.executable, "-m", "shardbus", "migrate", "--database-url", db_url], cwd=ROOT,
                       check=True, capture_output=True)
        started = time.perf_counter()
        asyncio.run(fill(db_url, args.runs))
        fill_s = time.perf_counter() - started
        ledger = ledger_bench.start_ledger(tmp, nats_server.url, db_url)
        port = web_feed.free_port()
        door = start_door(tmp, nats_server.url, port)
        pages = asyncio.run(measure(nats_server.url, port, args.requests))
    finally:
        for proc in (door, ledger):
            if proc is not None:
                embedded.stop_process(proc)
        pg.stop()
        nats_server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    result = {"runs_in_ledger": args.runs, "requests_per_page_kind": args.requests, "fill_seconds": round(fill_s, 1),
              "pages": {name: pages[name] for name in PAGES},
              "ledger": {name: value for name, value in pages.items() if name not in PAGES}}
    out = ROOT / "bench" / "results" / "web_console.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
