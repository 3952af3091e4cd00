"""``shardbus up``: the embedded default starts everything, prints what a shard and a website
need, refuses a second run on the same state, carries a frame, and Ctrl-C leaves nothing."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import nats
import psutil
import pytest

from shared import subjects
from tests.system.up_process import start_up, stop_up

KEYS = ("NATS_URL", "DATABASE_URL", "SHARD_ADDR", "SHARD_TOKEN")


async def _send_frame(found: dict[str, str], shard: str) -> bytes:
    nc = await nats.connect(found["NATS_URL"], connect_timeout=5)
    try:
        sub = await nc.subscribe(subjects.frame(shard, "player.login"))
        await nc.flush()
        host, port = found["SHARD_ADDR"].rsplit(":", 1)
        _reader, writer = await asyncio.open_connection(host, int(port))
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


@pytest.mark.timeout(180)
def test_up_runs_everything_and_ctrl_c_leaves_no_process(state_dir):
    state = state_dir
    proc, found = start_up(state)
    try:
        assert set(KEYS) <= set(found)
        assert len(psutil.Process(proc.pid).children()) >= 6  # nats, postgres, four services

        second = subprocess.run([sys.executable, "-m", "shardbus", "up", "--state-dir", str(state)],
                                capture_output=True, text=True, timeout=30)
        assert second.returncode != 0
        assert "already running" in second.stderr

        asyncio.run(_send_frame(found, "uo1"))
    finally:
        alive = stop_up(proc)
    assert proc.returncode == 0
    assert alive == [], f"left running: {alive}"

    # A restart on the same state directory keeps its data (the same shard token).
    proc, again = start_up(state)
    try:
        assert again["SHARD_TOKEN"] == found["SHARD_TOKEN"]
    finally:
        assert stop_up(proc) == []


def test_the_help_says_what_shardbus_is_in_plain_words():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "shardbus", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    assert "``" not in done.stdout and "The bridge between game shards" in done.stdout
