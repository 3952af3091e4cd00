"""``shardbus up``: the embedded default starts everything, prints what a shard and a website
need, refuses a second run on the same state, carries a frame, and Ctrl-C leaves nothing."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import nats
import psutil
import pytest

from shared import subjects

KEYS = ("NATS_URL", "DATABASE_URL", "SHARD_ADDR", "SHARD_TOKEN")


def _start_up(state_dir) -> tuple[subprocess.Popen, dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDBUS_")}
    proc = subprocess.Popen([sys.executable, "-m", "shardbus", "up", "--state-dir", str(state_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    found: dict[str, str] = {}
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    seen = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5).rstrip("\n")
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        seen.append(line)
        key, sep, value = line.partition("=")
        if sep and key in KEYS:
            found[key] = value
        if "is ready" in line:
            return proc, found
    proc.kill()
    raise AssertionError("shardbus up did not get ready:\n" + "\n".join(seen))


def _stop(proc: subprocess.Popen) -> list[psutil.Process]:
    family = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGINT)
    proc.wait(30)
    gone, alive = psutil.wait_procs(family, timeout=10)
    return alive


async def _send_frame(found: dict[str, str], shard: str) -> bytes:
    nc = await nats.connect(found["NATS_URL"], connect_timeout=5)
    try:
        sub = await nc.subscribe(subjects.frame(shard, "player.login"))
        await nc.flush()
        host, port = found["SHARD_ADDR"].rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        hello = {"t": 1, "kind": "server.hello", "shard": shard, "protocol": 7, "token": found["SHARD_TOKEN"]}
        line = b'{"t":2,"kind":"player.login","name":"Lord British"}'
        writer.write(json.dumps(hello).encode() + b"\n" + line + b"\n")
        await writer.drain()
        msg = await sub.next_msg(timeout=5)
        writer.close()
        assert msg.data == line
        return msg.data
    finally:
        await nc.close()


@pytest.fixture
def up_state_dir():
    """A state directory outside pytest's basetemp: a second pytest run side by side resets
    that tree's permissions, which PostgreSQL (running as another user) then cannot cross."""
    path = Path(tempfile.mkdtemp(prefix="shardbus-up-test-"))
    try:
        yield path / "state"
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.timeout(180)
def test_up_runs_everything_and_ctrl_c_leaves_no_process(up_state_dir):
    state = up_state_dir
    proc, found = _start_up(state)
    try:
        assert set(found) == set(KEYS)
        assert len(psutil.Process(proc.pid).children()) >= 6  # nats, postgres, four services

        second = subprocess.run([sys.executable, "-m", "shardbus", "up", "--state-dir", str(state)],
                                capture_output=True, text=True, timeout=30)
        assert second.returncode != 0
        assert "already running" in second.stderr

        asyncio.run(_send_frame(found, "uo1"))
    finally:
        alive = _stop(proc)
    assert proc.returncode == 0
    assert alive == [], f"left running: {alive}"

    # A restart on the same state directory keeps its data (the same shard token).
    proc, again = _start_up(state)
    try:
        assert again["SHARD_TOKEN"] == found["SHARD_TOKEN"]
    finally:
        assert _stop(proc) == []
