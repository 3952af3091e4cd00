"""A website host (run inside its own namespace by tests/hosts): sends the seed's ``item.catalog``
command to each shard, one at a time per shard, every ``--every`` seconds, through NATS (every
node listed, reconnecting as a service does), as a website does, and writes each outcome as one
JSON line to ``--out`` the moment it is known (so a stop loses none of them):
``{"shard", "sent"`` (seconds since the start), ``"at"`` (when, on the machine's monotonic clock,
which the test's processes share), ``"took"`` (seconds), ``"status"`` (the reply's
status, or null), ``"error"`` (why there was no reply: ``"timeout"``, ``"no responders"``, or
another exception's type)}. Runs until SIGTERM: the test stops it by its handle.

    python -m tests.hosts.website_host --nats nats://10.231.7.11:4222,… --shards h0,h1,h2 --out w.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from typing import IO

import nats
import nats.errors

from shared import subjects

VERB = "item.catalog"
"""A read every seed shard answers (the simulator from its world): 200 with the catalogue."""


def outcome_of(reply: bytes) -> tuple[int | None, str | None]:
    """The reply's status, or why it has none."""
    try:
        answer = json.loads(reply)
    except ValueError:
        return None, "not JSON"
    status = answer.get("status") if isinstance(answer, dict) else None
    return (status, None) if isinstance(status, int) else (None, "no status")


async def command_shard(nc: nats.NATS, shard: str, every_s: float, timeout_s: float, out: IO[str],
                        stop: asyncio.Event, started: float) -> None:
    subject = subjects.command(shard, VERB)
    while not stop.is_set():
        sent = time.monotonic()
        status: int | None = None
        error: str | None = None
        try:
            status, error = outcome_of((await nc.request(subject, b"{}", timeout=timeout_s)).data)
        except nats.errors.NoRespondersError:
            error = "no responders"
        except (TimeoutError, nats.errors.TimeoutError):
            error = "timeout"
        except Exception as exc:  # recorded: the checker judges it
            error = type(exc).__name__
        out.write(json.dumps({"shard": shard, "sent": round(sent - started, 3), "at": round(sent, 3),
                              "took": round(time.monotonic() - sent, 3), "status": status, "error": error}) + "\n")
        out.flush()
        try:
            await asyncio.wait_for(stop.wait(), every_s)
        except TimeoutError:
            pass


async def main(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    nc = await nats.connect(args.nats.split(","), name="hosts-website", max_reconnect_attempts=-1,
                            reconnect_time_wait=0.2, ping_interval=2, max_outstanding_pings=2)
    started = time.monotonic()
    try:
        with open(args.out, "a", encoding="utf-8") as out:
            await asyncio.gather(*(command_shard(nc, shard, args.every, args.timeout, out, stop, started)
                                   for shard in args.shards.split(",")))
    finally:
        await nc.close()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--nats", required=True, help="comma-separated NATS URLs")
    parser.add_argument("--shards", required=True, help="comma-separated shard names")
    parser.add_argument("--every", type=float, default=0.1, help="seconds between a shard's commands")
    parser.add_argument("--timeout", type=float, default=4.0, help="how long a command's reply is awaited")
    parser.add_argument("--out", required=True)
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
