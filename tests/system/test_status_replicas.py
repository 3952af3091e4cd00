"""``shardbus status`` names a stream replica that is behind its leader (docs/operations.md,
"Replicas behind"): on a real 3-node cluster, a follower of an R3 stream is paused (SIGSTOP)
while messages are stored by the other two, and status shows it behind, by how much, in JSON
and in its table; resumed, it catches up and status shows nothing behind.

A replica left behind is what a partition can leave after it heals (docs/reliability.md,
"The gateway cut from its node"): a reader placed there sees a short history."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

from shardbus import embedded, status
from tests.streams import publish_when_led

STREAM, MESSAGES = "REPLICAS_TEST", 200


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[embedded.NatsCluster]:
    running = embedded.start_nats_cluster(tmp_path / "cluster", 3, durable=False)
    try:
        yield running
    finally:
        for node in running.nodes:  # a node left paused by a failed test must still stop
            os.kill(node.proc.pid, signal.SIGCONT) if node.proc.poll() is None else None
        running.stop()


def meta_leader(node: embedded.NatsServer) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{node.monitor_port}/jsz", timeout=5) as answer:
        return str(json.load(answer).get("meta_cluster", {}).get("leader", ""))


async def wait_for(what: str, check: Callable[[], Awaitable[Any]], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while (result := await check()) is None or result is False:
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.3)
    return result


def stream_row(report: dict[str, Any]) -> dict[str, Any] | None:
    return next((row for row in report["streams"] if row["name"] == STREAM), None)


async def test_status_names_a_paused_replica_behind_its_leader_until_it_catches_up(cluster):
    nc = await nats.connect(cluster.url.split(","))
    js = nc.jetstream()
    await js.add_stream(name=STREAM, subjects=["replicas.test"], num_replicas=3)
    await publish_when_led(js, "replicas.test", b"first")  # elected and reachable: made to happen
    info = await js.stream_info(STREAM)
    # The follower to pause leads neither the stream nor the cluster's metadata, so the two
    # others keep storing and status keeps its answers while it sleeps.
    async def meta() -> str | None:
        return meta_leader(cluster.nodes[0]) or None

    leaders = {info.cluster.leader, await wait_for("the cluster's metadata leader known", meta)}
    paused = next(node for node in cluster.nodes if node.name not in leaders)
    others = ",".join(node.url for node in cluster.nodes if node is not paused)
    await nc.close()  # it may be connected to the node about to sleep
    nc = await nats.connect(others.split(","))
    js = nc.jetstream()
    os.kill(paused.proc.pid, signal.SIGSTOP)
    try:
        for n in range(MESSAGES):
            await js.publish("replicas.test", f"{n}".encode(), timeout=10)

        async def behind() -> dict[str, Any] | None:
            row = stream_row(await status.gather(others))
            return next((r for r in row["behind"] if r["name"] == paused.name), None) if row else None

        lagging = await wait_for(f"{paused.name} reported behind", behind)
        report = await status.gather(others)
        table = status.render(report)
    finally:
        os.kill(paused.proc.pid, signal.SIGCONT)
    assert lagging["lag"] > 0 or not lagging["current"], lagging
    row = stream_row(report)
    assert row is not None and row["leader"] == info.cluster.leader
    assert {r["name"] for r in row["replicas"]} == {node.name for node in cluster.nodes} - {row["leader"]}
    assert "REPLICAS BEHIND THEIR LEADER" in table
    assert any(line.split()[:2] == [STREAM, paused.name] for line in table.splitlines()), table

    async def caught_up() -> dict[str, Any] | None:
        row = stream_row(await status.gather(cluster.url))
        return row if row and not row["behind"] and len(row["replicas"]) == 2 else None

    row = await wait_for(f"{paused.name} caught up", caught_up)
    assert all(r["current"] and r["lag"] == 0 for r in row["replicas"]), row
    assert "REPLICAS BEHIND" not in status.render(await status.gather(cluster.url))
    await nc.close()


async def test_a_single_server_stream_has_no_replicas_and_nothing_behind(tmp_path):
    server = embedded.start_nats(tmp_path / "nats")
    try:
        nc = await nats.connect(server.url)
        await nc.jetstream().add_stream(name=STREAM, subjects=["replicas.test"])
        await nc.close()
        row = stream_row(await status.gather(server.url))
    finally:
        server.stop()
    assert row is not None and row["replicas"] == [] and row["behind"] == []
