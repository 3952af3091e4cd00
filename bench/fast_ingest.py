"""Benchmark: what fast-ingest batches cost the gateway's ingest (ADR 0015).

Runs ``bench/gateway.py --only ingest --rounds 1`` with ``SHARDBUS_FAST_INGEST`` on, then off,
``--runs`` times interleaved (so a slow minute of the machine falls on both), each with its own
raw JetStream baseline in the same run, and records every run's figures and the medians in
``bench/results/gateway-fast-ingest.json``. ``--sync always`` runs them on a nats-server that
fsyncs every write (what ``shardbus up`` ships).

Run alone: ``python bench/fast_ingest.py [--runs N] [--frames N] [--sync default|always]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KEYS = ("ingest_frames_per_s", "raw_publish_per_s", "ingest_ratio")


def one_run(fast_ingest: bool, frames: int, sync: str) -> dict:
    """One ingest run of ``bench/gateway.py``; its figures, or how it died (a finding)."""
    with tempfile.TemporaryDirectory(prefix="bench-fast-ingest-") as tmp:
        out = Path(tmp) / "run.json"
        env = {**os.environ, "SHARDBUS_FAST_INGEST": "true" if fast_ingest else "false"}
        done = subprocess.run([sys.executable, str(ROOT / "bench" / "gateway.py"), "--only", "ingest",
                               "--rounds", "1", "--frames", str(frames), "--sync", sync, "--out", str(out)],
                              env=env, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0 or not out.exists():
            return {"died": f"exit {done.returncode}: {done.stderr[-500:]}"}
        figures = json.loads(out.read_text())
        if figures.get("phases_failed"):
            return {"died": json.dumps(figures["phases_failed"])}
        return {key: figures[key] for key in KEYS if key in figures}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="interleaved runs of each setting (median recorded)")
    parser.add_argument("--frames", type=int, default=100_000, help="frames a run")
    parser.add_argument("--sync", choices=("default", "always"), default="default")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gateway-fast-ingest.json")
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {"batches": [], "plain": []}
    for _ in range(args.runs):
        for name, on in (("batches", True), ("plain", False)):
            runs[name].append(one_run(on, args.frames, args.sync))
            print(name, runs[name][-1], flush=True)
    results: dict = {"frames": args.frames, "sync": args.sync, "runs": runs}
    for name, each in runs.items():
        for key in KEYS:
            values = [run[key] for run in each if key in run]
            if values:
                results[f"{name}_{key}_median"] = round(statistics.median(values), 3)
    if "batches_ingest_frames_per_s_median" in results and "plain_ingest_frames_per_s_median" in results:
        results["batches_over_plain"] = round(results["batches_ingest_frames_per_s_median"]
                                              / results["plain_ingest_frames_per_s_median"], 3)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
