"""Fixtures of the shared-mechanism tests: a nats-server of the test's own, to stop or freeze."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardbus import embedded


@pytest.fixture
def own_nats(tmp_path: Path) -> Iterator[embedded.NatsServer]:
    """A nats-server this test may stop or freeze (SIGSTOP); thawed and stopped after it."""
    server = embedded.start_nats(tmp_path / "nats")
    try:
        yield server
    finally:
        if server.proc.poll() is None:
            server.proc.send_signal(signal.SIGCONT)
        server.stop()
