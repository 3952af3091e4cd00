"""Fixtures of the system tests."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """A state directory for ``shardbus up``, outside pytest's basetemp: a concurrent pytest
    run resets /tmp/pytest-of-<user> to 0700, and PostgreSQL (its own system user) then
    cannot reach its data directory."""
    path = Path(tempfile.mkdtemp(prefix="shardbus-up-test-"))
    try:
        yield path / "state"
    finally:
        shutil.rmtree(path, ignore_errors=True)
