"""Partitions on real hosts (docs/reliability.md, "Hosts"; issue 36): the leader of
``SHARD_FRAMES`` cut off from the other two nodes while the gateway, connected to it, keeps
publishing the frames of careful shards; then healed. The checker then holds every
acknowledged frame to ``SHARD_FRAMES``: present, once, in the shard's order; nothing given up
on; nothing left unacknowledged.

Needs root (``make test-hosts``); skipped with the reason elsewhere, failed instead when
``SHARDBUS_REQUIRE_HOSTS=1`` (so CI, which runs as root, cannot skip it by accident)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from nats.aio.client import Client

from shared import subjects
from tests.hosts import harness
from tests.hosts.checker import check
from tests.hosts.net import Hosts, why_not_available

REASON = why_not_available()
if REASON is not None:
    if os.environ.get("SHARDBUS_REQUIRE_HOSTS") == "1":
        pytest.fail(f"SHARDBUS_REQUIRE_HOSTS=1 but {REASON}", pytrace=False)
    pytest.skip(REASON, allow_module_level=True)

SHARDS, RATE, SECONDS = 3, 50.0, 30.0
"""Three shards at 50 frames/s each for 30 s: 4,500 frames, a partition in the middle."""

CUT_HELD_S = 10.0
"""How long the partition is held once the majority has elected a new leader."""


def progress(path: Path) -> dict[str, dict[str, int]]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def flowing(now: dict[str, dict[str, int]]) -> bool:
    """Every shard has had frames acknowledged (the stream takes them before the cut)."""
    return len(now) == SHARDS and all(v["acked"] >= 100 for v in now.values())


async def wait_for(what: str, condition: Callable[[], object], timeout: float) -> None:
    """Make the scenario's precondition happen: poll until ``condition()`` (sync or async) holds."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.2)


async def leader(nc: Client, stream: str = subjects.FRAMES_STREAM) -> str:
    try:
        return str((await harness.stream_info(nc, stream)).get("cluster", {}).get("leader", ""))
    except Exception:
        return ""


async def put_leader_on(nc: Client, node: harness.Node, stream: str) -> None:
    """Step the stream's leader down, preferring ``node``, until ``node`` leads it."""
    for _ in range(30):
        current = await leader(nc, stream)
        if current == node.name:
            return
        if current:
            try:
                await nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}",
                                 json.dumps({"placement": {"preferred": node.name}}).encode(), timeout=5)
            except Exception:
                pass
        await asyncio.sleep(1.0)
    raise TimeoutError(f"{node.name} never became the leader of {stream}")


async def stored_seqs(nc: Client, shard: str) -> list[int]:
    msgs = await harness.read_stream(nc, subjects.FRAMES_STREAM, f"shard.{shard}.frame.>")
    return [json.loads(m.data).get("seq", -1) for m in msgs if m.subject.endswith(".server.hello") is False]


async def dead_letter_seqs(nc: Client, shard: str) -> list[int]:
    msgs = await harness.read_stream(nc, subjects.DEADLETTER_STREAM, subjects.deadletter(shard))
    seqs = []
    for m in msgs:
        try:
            seqs.append(int(json.loads(m.data).get("seq", -1)))
        except (ValueError, AttributeError):
            seqs.append(-1)
    return seqs


async def test_the_frames_streams_leader_cut_off_from_its_peers_loses_and_repeats_nothing(tmp_path: Path) -> None:
    started_at = time.monotonic()
    processes = harness.Processes(tmp_path)
    with Hosts(tmp_path) as hosts:
        try:
            nats_hosts = [hosts.add(f"nats{i}") for i in (1, 2, 3)]
            gw_host, shard_host = hosts.add("gw"), hosts.add("shards")
            nodes = harness.start_cluster(processes, nats_hosts, tmp_path)
            gateway = harness.start_gateway(processes, gw_host, nodes, tmp_path, log_level="DEBUG")
            nc = await harness.connect(nodes)
            try:
                # Precondition: the gateway publishes to the frames stream's leader itself.
                await wait_for("the gateway connected to a node",
                               lambda: harness.connected_node(nodes, "shardbus-gateway") is not None, 30)
                gw_node = harness.connected_node(nodes, "shardbus-gateway")
                assert gw_node is not None
                await wait_for("the frames stream has a leader", lambda: leader(nc), 30)
                await put_leader_on(nc, gw_node, subjects.FRAMES_STREAM)

                out, prog = tmp_path / "history.json", tmp_path / "progress.json"
                shards = processes.start("shards", shard_host, [
                    sys.executable, "-m", "tests.hosts.shard_host", "--gateway",
                    f"{gw_host.address}:{harness.SHARD_PORT}", "--token", harness.TOKEN, "--shards", str(SHARDS),
                    "--rate", str(RATE), "--seconds", str(SECONDS), "--out", str(out), "--progress", str(prog)],
                    env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
                await wait_for("frames acknowledged on every shard", lambda: flowing(progress(prog)), 60)

                # The partition: the leader (and the gateway's node) loses its peers, not the gateway.
                old = gw_node
                peers = [n for n in nodes if n is not old]
                hosts.cut(old.host, [n.host for n in peers])
                try:
                    majority = await harness.connect(peers)
                    try:
                        await wait_for("the majority elected another leader",
                                       lambda: _other_leader(majority, old.name), 60)
                    finally:
                        await majority.close()
                    await asyncio.sleep(CUT_HELD_S)
                finally:
                    hosts.heal(old.host)

                await wait_for("the shard host finished (every frame acknowledged, or its drain ran out)",
                               lambda: shards.proc.poll() is not None, SECONDS + 180)
                history = json.loads(out.read_text())["shards"]
                stored = {shard: await stored_seqs(nc, shard) for shard in history}
                dead = {shard: await dead_letter_seqs(nc, shard) for shard in history}
            finally:
                await nc.close()
        finally:
            processes.stop_all()
    verdict = check(history, stored, dead)
    elapsed = time.monotonic() - started_at
    log = gateway.log()
    print(f"hosts, stream leader isolated: {verdict.summary()}; "
          f"{verdict.resent_deduplicated} acks repeated; resends answered 409 in process: "
          f"{log.count('duplicate message id is in process')}; {elapsed:.0f} s")
    assert hosts.leftovers() == []
    assert not verdict.violations, "\n".join(verdict.violations)
    assert verdict.sent >= SHARDS * RATE * SECONDS * 0.9


async def _other_leader(nc: Client, old: str) -> bool:
    now = await leader(nc)
    return bool(now) and now != old
