"""A service whose NATS connection closes for good ends its process, so a supervisor (compose's
``restart: unless-stopped``, ``shardbus up``) restarts it; a normal stop still exits 0.

nats-py gives up on a connection for good on most server errors (``-ERR``): a publish over
``max_payload``, or an authorization the server revokes. Here the server revokes it: a real
nats-server whose config gives the service's user a password, which is changed and reloaded
(SIGHUP) while the service runs, as an operator rotating passwords would. The server closes
the connection with ``-ERR 'Authorization Violation'``; nats-py closes for good. Before, the
process lived on answering nothing (health and status silent), and nobody restarted it.
"""

from __future__ import annotations

import json
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from shardbus import embedded, registry
from shared.nats_connect import FATAL_CLOSE_EXIT_CODE
from tests.processes import ServiceProcess, ServiceProcesses

SERVICES = tuple(name for name in registry.NAMES if name != "web")  # _settings: no web token or port yet

FATAL_LINE = "NATS connection closed for good"

EXIT_WAIT_S = 25.0
"""Longest wait for the service to end (its orderly stop is bounded at 10 s, on 2 busy cores)."""


@dataclass
class AuthNats:
    """A nats-server (JetStream) with one user, ``svc``, whose password can be changed live."""

    server: embedded.NatsServer
    config: Path
    password: str

    @property
    def url(self) -> str:
        return f"nats://svc:{self.password}@127.0.0.1:{self.server.port}"

    def write(self, password: str) -> None:
        self.config.write_text(f'authorization {{ users: [ {{ user: svc, password: "{password}" }} ] }}\n')

    def rotate_password(self) -> None:
        """Change the password and reload: the server closes the connections using the old one."""
        self.write(f"p{secrets.token_hex(12)}")
        self.server.proc.send_signal(signal.SIGHUP)


@pytest.fixture
def auth_nats() -> Iterator[AuthNats]:
    state = Path(tempfile.mkdtemp(prefix="shardbus-fatal-close-"))
    nats = AuthNats(None, state / "auth.conf", f"p{secrets.token_hex(12)}")  # type: ignore[arg-type]
    nats.write(nats.password)
    nats.server = embedded.start_nats(state, extra_args=("-c", str(nats.config)))
    try:
        yield nats
    finally:
        nats.server.stop()
        shutil.rmtree(state, ignore_errors=True)


def _settings(service: str, request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    if service == "gateway":
        return {"shard_token": secrets.token_urlsafe(16), "shard_port": "0"}
    if service == "ledger":
        return {"database_url": request.getfixturevalue("database_url")}
    if service == "cleanup":
        return {"sweep_period_s": "600"}
    return {"modules_dir": str(tmp_path / "modules")}


def _wait_exit(handle: ServiceProcess, timeout: float = EXIT_WAIT_S) -> int | None:
    try:
        return handle.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def _fatal_lines(handle: ServiceProcess) -> list[dict]:
    lines = []
    for line in handle.log().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and FATAL_LINE in str(entry.get("msg", "")):
            lines.append(entry)
    return lines


@pytest.mark.parametrize("service", SERVICES)
def test_a_connection_closed_for_good_ends_the_service(service, auth_nats, request, tmp_path):
    services = ServiceProcesses(tmp_path, auth_nats.url)
    try:
        handle = services.start(service, **_settings(service, request, tmp_path))
        started = time.monotonic()
        auth_nats.rotate_password()
        code = _wait_exit(handle)
        assert code is not None, f"{service} still runs with its NATS connection closed:\n{handle.log()[-3000:]}"
        assert code == FATAL_CLOSE_EXIT_CODE, handle.log()[-3000:]
        assert time.monotonic() - started < EXIT_WAIT_S
        fatal = _fatal_lines(handle)
        assert len(fatal) == 1, handle.log()[-3000:]  # one clear line
        assert fatal[0]["level"] == "critical" and fatal[0]["service"] == service
        assert "Authorization" in fatal[0]["reason"], fatal[0]
        assert auth_nats.password not in handle.log()
    finally:
        services.stop_all()


@pytest.mark.parametrize("service", SERVICES)
def test_a_normal_stop_still_exits_0(service, auth_nats, request, tmp_path):
    services = ServiceProcesses(tmp_path, auth_nats.url)
    try:
        handle = services.start(service, **_settings(service, request, tmp_path))
        assert services.stop(handle) == 0, handle.log()[-3000:]
        assert _fatal_lines(handle) == []
    finally:
        services.stop_all()
