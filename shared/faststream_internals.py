"""The one place shardbus goes beneath FastStream's public API: a service's health beat, its
metrics and its bounded stop need the broker's nats-py connection, which FastStream keeps in
``NatsBroker._connection`` (None until it connects).

FastStream is pinned exactly in pyproject.toml. :func:`incompatibilities` says what a release
lacks; ``tests/shared/test_library_fences.py`` fails on any."""

from __future__ import annotations

import importlib.metadata
from typing import Any

from faststream.nats import NatsBroker
from nats.aio.client import Client

PINNED = "0.7.8"
"""The FastStream release this file was checked against (pyproject.toml pins the same)."""


def connection_of(broker: NatsBroker) -> Client | None:
    """The broker's nats-py connection, None before it connects."""
    nc: Client | None = broker._connection
    return nc


def incompatibilities(broker: type[Any] = NatsBroker, installed: str | None = None) -> list[str]:
    """What this file uses that the installed FastStream lacks (empty: all there)."""
    found = []
    version = installed if installed is not None else importlib.metadata.version("faststream")
    if version != PINNED:
        found.append(f"faststream {version} is installed; this file was checked against {PINNED}")
    if not hasattr(broker(), "_connection"):
        found.append("NatsBroker()._connection is missing")
    return found
