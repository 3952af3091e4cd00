"""``shardbus up`` at scale: ``--replicas`` starts that many healthy processes per service
(every gateway on its own shard port, the web replicas on one shared port), ``--nats-cluster 3``
runs three clustered nats-server nodes with the streams replicated three ways, a bad spec is
refused clearly, and Ctrl-C leaves nothing running."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter

import nats
import psutil
import pytest

from shared import subjects
from shared.health import health_file_is_fresh
from tests.system.up_process import start_up, stop_up, up_env


def _services_running(proc: subprocess.Popen) -> Counter[str]:
    """How many ``shardbus run SERVICE`` processes ``shardbus up`` has, per service."""
    counts: Counter[str] = Counter()
    for child in psutil.Process(proc.pid).children():
        cmd = child.cmdline()
        if cmd[-3:-1] == ["shardbus", "run"]:
            counts[cmd[-1]] += 1
    return counts


def _nats_servers(proc: subprocess.Popen) -> list[psutil.Process]:
    return [c for c in psutil.Process(proc.pid).children() if c.name().startswith("nats-server")]


async def _frame_arrives(nats_url: str, shard_addr: str, token: str, shard: str) -> bytes:
    """Send one frame to the gateway at ``shard_addr`` as ``shard``; return what a NATS
    subscriber received."""
    nc = await nats.connect(nats_url.split(","), connect_timeout=5)
    try:
        sub = await nc.subscribe(subjects.frame(shard, "player.login"))
        await nc.flush()
        host, port = shard_addr.rsplit(":", 1)
        _reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 5)
        hello = {"t": 1, "kind": "server.hello", "shard": shard, "protocol": 7, "token": token}
        line = b'{"t":2,"kind":"player.login","name":"Dupre"}'
        writer.write(json.dumps(hello).encode() + b"\n" + line + b"\n")
        await writer.drain()
        msg = await sub.next_msg(timeout=5)
        writer.close()
        return msg.data
    finally:
        await nc.close()


async def _stream_info_once_stored(nats_url: str, stream: str, timeout: float = 10.0):
    """The stream's info once it holds a message: a live subscriber may see a frame a moment
    before the stream's replicas have stored it (fsync on every write, three nodes)."""
    nc = await nats.connect(nats_url.split(","), connect_timeout=5)
    try:
        deadline = time.monotonic() + timeout
        while (info := await nc.jetstream().stream_info(stream)).state.messages == 0:
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        return info
    finally:
        await nc.close()


@pytest.mark.parametrize("spec, message", [
    ("gateway=0", "positive whole number"),
    ("ledger=-1", "positive whole number"),
    ("cleanup=two", "positive whole number"),
    ("website=2", "unknown service 'website'"),
    ("gateway", "SERVICE=COUNT"),
    ("cleanup=2,cleanup=3", "named twice"),
])
def test_a_bad_replicas_spec_is_refused_with_a_clear_message(tmp_path, spec, message):
    done = subprocess.run([sys.executable, "-m", "shardbus", "up", "--state-dir", str(tmp_path / "s"),
                           "--replicas", spec], capture_output=True, text=True, timeout=30, env=up_env())
    assert done.returncode == 2
    assert message in done.stderr
    assert not (tmp_path / "s").exists()  # refused before anything started


def test_an_even_nats_cluster_is_refused(tmp_path):
    done = subprocess.run([sys.executable, "-m", "shardbus", "up", "--state-dir", str(tmp_path / "s"),
                           "--nats-cluster", "2"], capture_output=True, text=True, timeout=30, env=up_env())
    assert done.returncode == 2
    assert "1, 3 or 5" in done.stderr


@pytest.mark.timeout(240)
def test_replicas_start_that_many_healthy_processes_and_ctrl_c_leaves_none(state_dir):
    state = state_dir
    proc, found = start_up(state, "--replicas", "gateway=2,ledger=2,cleanup=3,installer=2,web=2")
    try:
        assert _services_running(proc) == {"gateway": 2, "ledger": 2, "cleanup": 3, "installer": 2, "web": 2}
        health = sorted(p.name for p in (state / "run").glob("*.health") if health_file_is_fresh(str(p)))
        assert health == ["cleanup-1.health", "cleanup-2.health", "cleanup-3.health", "gateway-1.health",
                          "gateway-2.health", "installer-1.health", "installer-2.health", "ledger-1.health",
                          "ledger-2.health", "web-1.health", "web-2.health"]
        assert len({p.name for p in (state / "logs").glob("*.log")}) == 11

        # The four lines a single stack prints are still there; every gateway has its own port.
        addrs = found["SHARD_ADDRS"].split(",")
        assert len(set(addrs)) == 2 and found["SHARD_ADDR"] == addrs[0]
        for i, addr in enumerate(addrs):
            data = asyncio.run(_frame_arrives(found["NATS_URL"], addr, found["SHARD_TOKEN"], f"rep{i}"))
            assert b"Dupre" in data
    finally:
        alive = stop_up(proc)
    assert proc.returncode == 0
    assert alive == [], f"left running: {alive}"


@pytest.mark.timeout(240)
def test_a_three_node_nats_cluster_carries_frames_on_a_stream_with_three_replicas(state_dir):
    proc, found = start_up(state_dir, "--nats-cluster", "3")
    try:
        urls = found["NATS_URL"].split(",")
        assert len(set(urls)) == 3
        assert len(set(found["NATS_WS_URL"].split(","))) == 3  # a WebSocket listener on every node
        assert len(_nats_servers(proc)) == 3

        data = asyncio.run(_frame_arrives(found["NATS_URL"], found["SHARD_ADDR"], found["SHARD_TOKEN"], "c3"))
        assert b"Dupre" in data

        info = asyncio.run(_stream_info_once_stored(found["NATS_URL"], "SHARD_FRAMES"))
        assert info.config.num_replicas == 3
        assert info.cluster is not None and info.cluster.leader
        assert len(info.cluster.replicas or []) == 2  # the leader plus two followers
        assert info.state.messages >= 1
    finally:
        alive = stop_up(proc)
    assert proc.returncode == 0
    assert alive == [], f"left running: {alive}"
