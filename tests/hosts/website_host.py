"""A website host (run inside its own namespace by tests/hosts): sends the seed's ``item.catalog``
command to each shard, one at a time per shard, every ``--every`` seconds, through NATS (every
node listed, reconnecting as a service does), as a website does, and writes each outcome as one
JSON line to ``--out`` the moment it is known (so a stop loses none of them):
``{"shard", "sent"`` (seconds since the start), ``"at"`` (when, on the machine's monotonic clock,
which the test's processes share), ``"took"`` (seconds), ``"status"`` (the reply's
status, or null), ``"error"`` (why there was no reply: ``"timeout"``, ``"no responders"``,
``"connection lost"``, or another exception's type), ``"via"`` (``"nats"`` or ``"door"``)}. With
``--door`` each shard is also sent the same command through the web door's route
(``GET /shards/<shard>/items``, HTTPS, its token from ``SHARDBUS_HOSTS_DOOR_TOKEN``), as a website
that speaks HTTP does. Runs until SIGTERM: the test stops it by its handle.

    python -m tests.hosts.website_host --nats nats://10.231.7.11:4222,… --shards h0,h1,h2 --out w.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import signal
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import IO

import httpx
import nats
import nats.errors

from shared import subjects

DOOR_TOKEN_VARIABLE = "SHARDBUS_HOSTS_DOOR_TOKEN"
"""Where the door's token is (tests/hosts/door.py gives it): never the command line."""

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


async def through_nats(nc: nats.NATS, shard: str, timeout_s: float) -> tuple[int | None, str | None]:
    """One ``item.catalog`` on the command subject: (status, None) or (None, why no reply)."""
    try:
        return outcome_of((await nc.request(subject_of(shard), b"{}", timeout=timeout_s)).data)
    except nats.errors.NoRespondersError:
        return None, "no responders"
    except (TimeoutError, nats.errors.TimeoutError):
        return None, "timeout"
    except Exception as exc:  # recorded: the checker judges it
        return None, type(exc).__name__


async def through_door(door: httpx.AsyncClient, shard: str) -> tuple[int | None, str | None]:
    """One ``item.catalog`` through the door's route: (HTTP status, None) or (None, why no reply)."""
    try:
        return (await door.get(f"/shards/{shard}/items")).status_code, None
    except httpx.TimeoutException:
        return None, "timeout"
    except httpx.TransportError:
        return None, "connection lost"
    except Exception as exc:  # recorded: the checker judges it
        return None, type(exc).__name__


def subject_of(shard: str) -> str:
    return subjects.command(shard, VERB)


async def command_shard(send: Callable[[], Awaitable[tuple[int | None, str | None]]], shard: str, via: str,
                        every_s: float, out: IO[str], stop: asyncio.Event, started: float) -> None:
    while not stop.is_set():
        sent = time.monotonic()
        status, error = await send()
        out.write(json.dumps({"shard": shard, "sent": round(sent - started, 3), "at": round(sent, 3),
                              "took": round(time.monotonic() - sent, 3), "status": status, "error": error,
                              "via": via}) + "\n")
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
    door = (httpx.AsyncClient(base_url=args.door, verify=ssl.create_default_context(cafile=args.door_ca),
                              timeout=args.timeout,
                              headers={"Authorization": f"Bearer {os.environ[DOOR_TOKEN_VARIABLE]}"})
            if args.door else None)
    started = time.monotonic()
    try:
        with open(args.out, "a", encoding="utf-8") as out:
            loops = []
            for shard in args.shards.split(","):
                loops.append(command_shard(functools.partial(through_nats, nc, shard, args.timeout), shard, "nats",
                                           args.every, out, stop, started))
                if door is not None:
                    loops.append(command_shard(functools.partial(through_door, door, shard), shard, "door",
                                               args.every, out, stop, started))
            await asyncio.gather(*loops)
    finally:
        if door is not None:
            await door.aclose()
        await nc.close()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--nats", required=True, help="comma-separated NATS URLs")
    parser.add_argument("--shards", required=True, help="comma-separated shard names")
    parser.add_argument("--every", type=float, default=0.1, help="seconds between a shard's commands")
    parser.add_argument("--timeout", type=float, default=4.0, help="how long a command's reply is awaited")
    parser.add_argument("--door", default="", help="the web door's HTTPS URL (its token in the environment)")
    parser.add_argument("--door-ca", default=None, help="the CA file the door's certificate is checked against")
    parser.add_argument("--out", required=True)
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
