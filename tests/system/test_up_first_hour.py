"""The first hour with ``shardbus up``, with real commands in real directories:

- a second terminal in the same directory finds the stack: ``up`` writes the lines it printed
  (the web door's too: WEB_URL, WEB_WS_URL, WEB_TOKEN, WEB_OPERATOR_TOKEN, PROTOCOL, NATS_WS_URL)
  to ``.shardbus/env`` (mode 0600); ``shardbus status`` there reports on that stack (the web
  door counted) and says where its NATS address came from; an explicit ``SHARDBUS_NATS_URL``
  wins and is said to; ``shardbus shard-sim`` there finds the shard address and token; once the
  stack stops, ``status`` says so and exits 1 instead of asking whatever listens on 4222;
- the web door runs in the stack (``GET /health``, ``web.health`` over NATS) and no token reaches
  a log; the NATS WebSocket listener carries messages both ways (nats-py over ``ws://``);
- a slow step says what it waits for;
- ports: ``make up SHARD_PORT=… WEB_PORT=… REPLICAS=web=2`` and ``SHARDBUS_NATS_PORT`` are taken
  (two web replicas on one port), kept at the next start, a previous port now taken is replaced
  with a note, and a port asked for that is taken stops the start with one line naming it.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import nats
import psutil
import pytest

from shardbus import embedded, stack_env
from shardbus.stack import WAIT_NOTICE_VARIABLE
from shared.health import health_file_is_fresh
from tests.system.up_process import start_command, start_up, stop_up, up_env

ROOT = Path(__file__).resolve().parents[2]
PRINTED = ("NATS_URL", "NATS_WS_URL", "DATABASE_URL", "SHARD_ADDR", "SHARD_ADDRS", "SHARD_TOKEN", "WEB_URL",
           "WEB_WS_URL", "WEB_TOKEN", "WEB_OPERATOR_TOKEN", "CONSOLE_URL", "PROTOCOL", "METRICS_URLS")
"""Every line ``make up`` prints for a shard, a website and the operator."""

EVERY_SERVICE_ONCE = {"gateway": 1, "ledger": 1, "cleanup": 1, "installer": 1, "web": 1}


def shardbus(cwd: Path, *args: str, env: dict[str, str] | None = None,
             timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """A ``shardbus`` command typed in another terminal in ``cwd`` (no SHARDBUS_ variable set)."""
    return subprocess.run([sys.executable, "-m", "shardbus", *args], cwd=cwd, env={**up_env(), **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def port_of(url: str) -> int:
    return int(urlsplit(url if "://" in url else f"tcp://{url}").port)


def free_ports(count: int) -> list[int]:
    ports: set[int] = set()
    while len(ports) < count:
        ports.add(embedded.free_port())
    return sorted(ports)


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.load(reply)


async def _websocket_round_trip(ws_url: str, nats_url: str) -> dict:
    """A nats-py client on the WebSocket listener and one on the client port exchange messages;
    the WebSocket client also asks the web door for its health."""
    ws = await nats.connect(ws_url, connect_timeout=5, allow_reconnect=False, max_reconnect_attempts=1)
    tcp = await nats.connect(nats_url, connect_timeout=5, allow_reconnect=False, max_reconnect_attempts=1)
    try:
        assert ws.connected_url.scheme == "ws"
        heard_by_ws = await ws.subscribe("demo.to-browser")
        heard_by_tcp = await tcp.subscribe("demo.from-browser")
        await ws.flush()
        await tcp.flush()
        await tcp.publish("demo.to-browser", b"hello page")
        await ws.publish("demo.from-browser", b"hello server")
        assert (await heard_by_ws.next_msg(timeout=5)).data == b"hello page"
        assert (await heard_by_tcp.next_msg(timeout=5)).data == b"hello server"
        return json.loads((await ws.request("web.health", b"{}", timeout=10)).data)
    finally:
        await ws.close()
        await tcp.close()


def _status_json(project: Path, **env: str) -> dict:
    done = shardbus(project, "status", "--json", "--wait", "1", env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.timeout(240)
def test_a_second_terminal_in_the_same_directory_finds_the_stack(state_dir):
    project = state_dir.parent  # a project directory of its own; the stack keeps .shardbus in it
    env_file = project / ".shardbus" / "env"
    # Every step that takes over 0.2 s says what it waits for (2 s by default).
    proc, found = start_up(None, cwd=project, env={WAIT_NOTICE_VARIABLE: "0.2"})
    other_nats = None
    sim = None
    try:
        # What make up prints, the web door's lines among them.
        assert set(PRINTED) <= set(found)
        web_port = port_of(found["WEB_URL"])
        assert found["WEB_URL"] == f"http://127.0.0.1:{web_port}"
        assert found["WEB_WS_URL"] == f"ws://127.0.0.1:{web_port}/ws"
        assert found["CONSOLE_URL"] == f"http://127.0.0.1:{web_port}/console"
        assert re.fullmatch(r"ws://127\.0\.0\.1:\d+", found["NATS_WS_URL"])
        assert found["PROTOCOL"] == "7"
        assert len({found["SHARD_TOKEN"], found["WEB_TOKEN"], found["WEB_OPERATOR_TOKEN"]}) == 3
        assert all(len(found[k]) >= 24 for k in ("SHARD_TOKEN", "WEB_TOKEN", "WEB_OPERATOR_TOKEN"))

        # A slow step says what it waits for.
        said = found["_lines"]
        assert re.search(r"^waiting for PostgreSQL to create its data directory and accept connections "
                         r"\([\d.]+ s\)…$", said, re.M), said
        assert re.search(r"^waiting for .*web-1.* to report healthy .*\([\d.]+ s\)…$", said, re.M), said

        # The env file: what was printed, readable by its owner only.
        assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
        assert stack_env.parse(env_file.read_text()) == {k: found[k] for k in PRINTED}
        assert f"(also in {env_file}, mode 0600: every shardbus command run in {project} reads it)" in said

        # `shardbus status` in another terminal, in the same directory: that stack, and it says so.
        report = _status_json(project)
        assert report["nats"] == found["NATS_URL"]
        assert report["natsSource"].startswith(f"{env_file}, written by the shardbus up running there (pid ")
        assert {name: s["replicas"] for name, s in report["services"].items()} == EVERY_SERVICE_ONCE
        table = shardbus(project, "status")
        assert table.returncode == 0, table.stderr
        assert table.stdout.splitlines()[0] == f"NATS {found['NATS_URL']}  (from {report['natsSource']})"

        # An explicit SHARDBUS_NATS_URL wins, and the report says it won over the running stack.
        other_nats = embedded.start_nats(state_dir / "other-nats")
        elsewhere = _status_json(project, SHARDBUS_NATS_URL=other_nats.url)
        assert elsewhere["nats"] == other_nats.url
        assert elsewhere["natsSource"].startswith("SHARDBUS_NATS_URL, which wins over ")
        assert found["NATS_URL"] in elsewhere["natsSource"]
        assert all(s["replicas"] == 0 for s in elsewhere["services"].values())

        # The simulator finds the shard address and token by itself, and its shard is the door's default.
        sim = subprocess.Popen([sys.executable, "-m", "shardbus", "shard-sim"], cwd=project, env=up_env(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 20
        while not [s for s in _status_json(project)["shards"] if s.get("shard") == "uo1"]:
            assert sim.poll() is None, sim.stderr.read()
            assert time.monotonic() < deadline, "the simulator did not connect"
            time.sleep(0.3)

        # The web door: HTTP and NATS; the WebSocket listener carries messages both ways.
        assert get_json(f"{found['WEB_URL']}/health") == {"status": 200, "service": "web", "nats": True, "protocol": 7}
        health = asyncio.run(_websocket_round_trip(found["NATS_WS_URL"], found["NATS_URL"]))
        assert health["status"] == 200 and health["service"] == "web" and health["url"] == found["WEB_URL"]
        web_env = [psutil.Process(c.pid).environ() for c in psutil.Process(proc.pid).children()
                   if c.cmdline()[-2:] == ["run", "web"]]
        assert len(web_env) == 1 and web_env[0]["SHARDBUS_WEB_DEFAULT_SHARD"] == "uo1"
    finally:
        # Each step stops its own even when one before it fails: a simulator slow to leave on a
        # loaded machine once raised here and left the whole stack running after the suite.
        try:
            if sim is not None:
                embedded.stop_process(sim, signal.SIGINT, 15)
        finally:
            try:
                if other_nats is not None:
                    other_nats.stop()
            finally:
                alive = stop_up(proc)
    assert proc.returncode == 0
    assert alive == [], f"left running: {alive}"

    # No secret reached a log (services, NATS, PostgreSQL).
    logs = [p for p in (project / ".shardbus").rglob("*.log")]
    assert len(logs) >= 7
    leaked = [(p.name, key) for p in logs for key in ("SHARD_TOKEN", "WEB_TOKEN", "WEB_OPERATOR_TOKEN")
              if found[key] in p.read_text(errors="replace")]
    assert leaked == []

    # The stack stopped: status says so and fails, rather than report on whatever listens on 4222.
    stopped = shardbus(project, "status")
    assert stopped.returncode == 1
    assert stopped.stdout == ""
    assert f"the shardbus up of {project / '.shardbus'} is not running" in stopped.stderr
    assert found["NATS_URL"] in stopped.stderr


def _make_up(state: Path, *variables: str, env: dict[str, str]) -> tuple[subprocess.Popen, dict[str, str]]:
    """``make up VARIABLE=…`` in the repository, its state in ``state``, as typed in a terminal.
    ``-o`` the install stamp: never reinstall the virtualenv from a test."""
    return start_command(["make", "--no-print-directory", "-C", str(ROOT), "-o", ".venv/.installed-stamp", "up",
                          f"STATE_DIR={state}", *variables], env=env, new_session=True,
                         unset=("MAKEFLAGS", "MAKELEVEL", "MFLAGS"))  # when the suite runs under make


def _descendants_running(proc: subprocess.Popen, service: str) -> list[psutil.Process]:
    return [p for p in psutil.Process(proc.pid).children(recursive=True)
            if p.cmdline()[-3:] == ["shardbus", "run", service]]


@pytest.mark.timeout(300)
def test_ports_are_asked_for_kept_at_the_next_start_and_a_taken_one_is_named(state_dir):
    shard_port, web_port, nats_port = free_ports(3)
    proc, first = _make_up(state_dir, f"SHARD_PORT={shard_port}", f"WEB_PORT={web_port}", "REPLICAS=web=2",
                           env={"SHARDBUS_NATS_PORT": str(nats_port)})
    try:
        assert first["SHARD_ADDR"] == f"127.0.0.1:{shard_port}"
        assert first["WEB_URL"] == f"http://127.0.0.1:{web_port}"
        assert first["NATS_URL"] == f"nats://127.0.0.1:{nats_port}"
        # Two web replicas, both healthy, on the one port.
        assert len(_descendants_running(proc, "web")) == 2
        assert all(health_file_is_fresh(str(state_dir / "run" / f"web-{i}.health")) for i in (1, 2))
        for _ in range(4):
            assert get_json(f"{first['WEB_URL']}/health")["service"] == "web"

        # A port asked for that is taken: one line naming it, and nothing started.
        taken = shardbus(state_dir.parent, "up", "--state-dir", str(state_dir.parent / "second"),
                         env={"SHARDBUS_SHARD_PORT": str(shard_port)})
        assert taken.returncode == 1
        errors = [line for line in taken.stderr.splitlines() if line.strip()]
        assert len(errors) == 1, taken.stderr
        assert errors[0].startswith(f"error: port {shard_port} (SHARD_PORT, the shard listener) is taken")
        assert not (state_dir.parent / "second" / "nats").exists()
    finally:
        alive = stop_up(proc, group=True)
    assert alive == [], f"left running: {alive}"

    # The next start, asked for nothing, keeps every port, but the web door's, now taken by
    # someone else: it gets another one and says so.
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the door's closed connections may linger
    squatter.bind(("127.0.0.1", web_port))
    squatter.listen()
    try:
        proc, again = start_up(state_dir)
        try:
            for key in ("NATS_URL", "NATS_WS_URL", "DATABASE_URL", "SHARD_ADDR", "SHARD_TOKEN", "WEB_TOKEN"):
                assert again[key] == first[key], key
            assert port_of(again["WEB_URL"]) != web_port
            assert (f"note: the web door's previous port {web_port} is taken; using {port_of(again['WEB_URL'])} "
                    "this time") in again["_lines"]
            assert get_json(f"{again['WEB_URL']}/health")["service"] == "web"
        finally:
            assert stop_up(proc) == []
    finally:
        squatter.close()


@pytest.mark.parametrize("variable, value", [("SHARDBUS_SHARD_PORT", "abc"), ("SHARDBUS_WEB_PORT", "70000")])
def test_a_port_that_is_no_port_is_refused_before_anything_starts(tmp_path, variable, value):
    done = shardbus(tmp_path, "up", "--state-dir", str(tmp_path / "s"), env={variable: value})
    assert done.returncode == 2
    assert f"{variable}={value}: a port is a whole number" in done.stderr
    assert not (tmp_path / "s").exists()


def test_every_port_up_takes_has_its_flag():
    from shardbus.cli import build_parser
    from shardbus.stack import PORTS

    for key, (name, _what) in PORTS.items():
        args = build_parser().parse_args(["up", f"--{key.replace('_', '-')}-port", "2595"])
        assert getattr(args, f"{key}_port") == 2595, name
