"""Durability settings: the embedded nats-server of ``shardbus up`` (one node or a cluster)
fsyncs every JetStream write before acknowledging it (``sync_interval: always``), proven by
asking the running server (``/varz``), while test servers keep JetStream's fast default; the
compose cluster nodes ship the same setting."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from shardbus import embedded

ROOT = Path(__file__).resolve().parents[2]


def _jetstream_config(monitor_port: int) -> dict:
    """The JetStream configuration the running server reports on its monitoring port."""
    with urllib.request.urlopen(f"http://127.0.0.1:{monitor_port}/varz", timeout=5) as reply:
        return json.load(reply)["jetstream"]["config"]


@pytest.mark.parametrize("durable", [True, False])
def test_start_nats_fsyncs_every_write_only_when_durable(tmp_path, durable):
    monitor = embedded.free_port()
    server = embedded.start_nats(tmp_path / "nats", durable=durable, extra_args=("-m", str(monitor)))
    try:
        config = _jetstream_config(monitor)
    finally:
        server.stop()
    assert config.get("sync_always", False) is durable


def test_every_node_of_a_durable_cluster_fsyncs_every_write(tmp_path):
    cluster = embedded.start_nats_cluster(tmp_path / "cluster", 3, durable=True)
    try:
        configs = [_jetstream_config(node.monitor_port) for node in cluster.nodes]
        names = sorted(node.name for node in cluster.nodes)
    finally:
        cluster.stop()
    assert names == ["n1", "n2", "n3"]
    assert [c.get("sync_always") for c in configs] == [True, True, True]
    assert len({c["store_dir"] for c in configs}) == 3  # a store per node


@pytest.mark.timeout(120)
def test_shardbus_up_runs_nats_with_the_durable_config(state_dir):
    """``up`` starts nats-server from the config it generated, and that config says always.
    (The setting itself is proven on a running server by the tests above.)"""
    state = state_dir
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDBUS_")}
    proc = subprocess.Popen([sys.executable, "-m", "shardbus", "up", "--state-dir", str(state)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline = time.monotonic() + 60
        for line in proc.stdout:
            if "is ready" in line or time.monotonic() > deadline:
                break
        nats_procs = [c for c in psutil.Process(proc.pid).children() if c.name().startswith("nats-server")]
        assert len(nats_procs) == 1
        cmdline = nats_procs[0].cmdline()
        config_path = Path(cmdline[cmdline.index("-c") + 1])
        assert config_path == state / "nats" / "nats.conf"
        assert re.search(r"\bsync_interval:\s*always\b", config_path.read_text())
    finally:
        family = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        psutil.wait_procs(family, timeout=10)
        for leftover in family:
            if leftover.is_running():
                leftover.kill()


def test_the_compose_cluster_nodes_ship_sync_always():
    text = (ROOT / "deploy" / "nats" / "cluster-node.conf").read_text()
    block = re.search(r"^jetstream \{(.*?)^\}", text, re.S | re.M)
    assert block and re.search(r"^\s*sync_interval:\s*always\s*$", block.group(1), re.M)
