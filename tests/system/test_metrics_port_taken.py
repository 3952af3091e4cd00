"""A service whose metrics port is already taken says so and exits 1, for every service.

Before, the ledger read the bind's bare ``OSError`` as a database outage: it logged "the database
is unreachable" and exited 75 (try again), which sent an operator, and a failed CI run, after
PostgreSQL. The port had been taken by an outgoing connection of another test between
``shardbus up`` choosing it and the ledger listening on it (see ``embedded.free_port``)."""

from __future__ import annotations

import json
import secrets
import socket
from collections.abc import Iterator

import pytest

from shardbus import registry

TAKEN_WORDS = "cannot serve metrics on 127.0.0.1:{port}"


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def _settings(service: str, request: pytest.FixtureRequest, tmp_path) -> dict[str, str]:
    return {
        "gateway": {"shard_token": secrets.token_urlsafe(16), "shard_port": "0"},
        "ledger": {"database_url": request.getfixturevalue("database_url")},
        "cleanup": {"sweep_period_s": "600"},
        "installer": {"modules_dir": str(tmp_path / "modules")},
        "web": {"web_token": secrets.token_urlsafe(16), "web_port": "0"},
    }[service]


@pytest.mark.parametrize("service", registry.NAMES)
def test_a_taken_metrics_port_is_named_and_exits_1(service, taken_port, services, request, tmp_path):
    with pytest.raises(RuntimeError, match=f"{service} exited with 1") as failed:
        services.start(service, metrics_host="127.0.0.1", metrics_port=str(taken_port),
                       **_settings(service, request, tmp_path))
    log = services.started[-1].log()
    errors = [entry for line in log.splitlines() if line.startswith("{")
              for entry in [json.loads(line)] if entry.get("level") == "error"]
    assert [e["msg"].split(" (")[0] for e in errors] == [TAKEN_WORDS.format(port=taken_port)], failed.value
    assert "unreachable" not in log
