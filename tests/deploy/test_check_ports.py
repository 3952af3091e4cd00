"""deploy/check-ports.py, the line an operator gets before `compose up` when a host port of
compose.yaml is taken (docs/operations.md, "Compose for real"): it names the port, the service
and the variable that moves it; a free port passes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardbus import embedded
from tests.deploy.conftest import ROOT

FREE = {"NATS_PORT": "", "NATS_WS_PORT": "", "SHARD_PORTS": "127.0.0.1:", "WEB_PORTS": "127.0.0.1:"}


def _check(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "deploy" / "check-ports.py"),
                           "--env-file", str(tmp_path / "no.env")],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=60)


@pytest.fixture
def held() -> Iterator[int]:
    """A port this test listens on (as the machine's own NATS holds 4222)."""
    with socket.socket() as listener:
        listener.bind(("0.0.0.0", embedded.free_port("0.0.0.0")))
        listener.listen()
        yield int(listener.getsockname()[1])


def test_a_taken_port_is_named_with_its_variable(held, tmp_path):
    free = {name: str(embedded.free_port("0.0.0.0")) for name in ("NATS_PORT", "NATS_WS_PORT")}
    done = _check({**FREE, **free, "NATS_PORT": str(held)}, tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip() == (f"port {held} of nats (NATS_PORT) is taken on this machine: "
                                   "set NATS_PORT to a free port (compose.yaml; default 4222)")


def test_free_ports_pass(tmp_path):
    free = {name: str(embedded.free_port("0.0.0.0")) for name in ("NATS_PORT", "NATS_WS_PORT")}
    done = _check({**FREE, **free}, tmp_path)
    assert (done.returncode, done.stdout.strip()) == (0, "compose.yaml's host ports: 2 checked, none taken")
