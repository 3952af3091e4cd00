"""The fault suite N times in a row (issue 29, item 2), every output kept.

``python bench/fault_runs.py --runs 5`` runs ``make test-faults`` (each scenario beside 200
background shards at 20 frames/s, tests/faults/shard_traffic.py) RUNS times from this checkout,
writes each run's whole output to ``bench/results/faults/run-N.txt`` and a summary of all of them
to ``bench/results/faults/summary.json``: per run its exit code, time and pytest's closing line,
per scenario line the background frames sent, stored, lost and duplicated.
``--summarize`` rewrites the summary from the outputs already there."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "faults"

BACKGROUND = re.compile(r"background: (\d+) shards sent (\d+) frames in ([\d.]+) s \((\d+)/s\), stored (\d+), "
                        r"lost (\d+), duplicated (\d+), unacknowledged (\d+)")
CLOSING = re.compile(r"=+ (.*(?:passed|failed).*) in ([\d.]+)s")


def summarize() -> dict:
    runs = []
    for path in sorted(OUT.glob("run-*.txt"), key=lambda p: int(p.stem.split("-")[1])):
        text = path.read_text(errors="replace")
        scenarios = []
        for line in text.splitlines():
            if (found := BACKGROUND.search(line)) is None:
                continue
            shards, sent, seconds, rate, stored, lost, duplicated, unacked = found.groups()
            scenarios.append({"scenario": line[:found.start()].split(":")[0].strip(), "shards": int(shards),
                              "sent": int(sent), "seconds": float(seconds), "frames_per_s": int(rate),
                              "stored": int(stored), "lost": int(lost), "duplicated": int(duplicated),
                              "unacknowledged": int(unacked)})
        closing = CLOSING.search(text)
        runs.append({"run": path.name, "result": closing.group(1) if closing else "no closing line",
                     "pytest_s": float(closing.group(2)) if closing else None, "scenarios": scenarios})
    totals = {key: sum(s[key] for r in runs for s in r["scenarios"]) for key in ("sent", "lost", "duplicated")}
    return {"runs": runs, "background_totals": totals,
            "all_passed": all("failed" not in r["result"] and "passed" in r["result"] for r in runs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--summarize", action="store_true", help="only rewrite summary.json")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    if not args.summarize:
        for n in range(1, args.runs + 1):
            started = time.monotonic()
            done = subprocess.run(["make", "test-faults", "PYTEST_ADDOPTS=-s -p no:cacheprovider"], cwd=ROOT,
                                  capture_output=True, text=True, timeout=1800)
            (OUT / f"run-{n}.txt").write_text(done.stdout + done.stderr)
            print(f"run {n}: exit {done.returncode} in {time.monotonic() - started:.0f} s", flush=True)
    (OUT / "summary.json").write_text(json.dumps(summarize(), indent=1) + "\n")


if __name__ == "__main__":
    main()
