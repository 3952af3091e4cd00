"""Every NATS subject shardbus uses: the public contract (SPEC section 1).

A subject is built here and nowhere else. ``<shard>`` is a shard id matching
:data:`SHARD_ID_PATTERN`. Each service owns its section below.
"""

from __future__ import annotations

import re

SHARD_ID_PATTERN = r"[a-z0-9_-]{1,32}"
"""What a shard id may look like; it becomes a subject token."""

_SHARD_ID = re.compile(rf"^{SHARD_ID_PATTERN}$")


def is_shard_id(value: object) -> bool:
    """True when ``value`` is a valid shard id."""
    return isinstance(value, str) and _SHARD_ID.match(value) is not None


# --- shard plane (owned by the gateway) ------------------------------------------------

FRAMES_STREAM = "SHARD_FRAMES"
"""The JetStream stream holding every frame every shard sent."""

FRAMES_WILDCARD = "shard.*.frame.>"
"""All frames of all shards (the stream's subject filter)."""

DEADLETTER_STREAM = "SHARD_DEADLETTER"
"""The JetStream stream holding lines the gateway could not publish as frames."""

DEADLETTER_WILDCARD = "shard.*.deadletter"
"""All dead letters of all shards."""

GATEWAY_STATUS = "gateway.status"
"""Request: every gateway replica answers with its connected shards and their last line."""


def frame(shard: str, kind: str) -> str:
    """Where a frame of ``kind`` from ``shard`` is published, verbatim."""
    return f"shard.{shard}.frame.{kind}"


def deadletter(shard: str) -> str:
    """Where a line from ``shard`` that could not be a frame is kept, with the reason."""
    return f"shard.{shard}.deadletter"


def command(shard: str, verb: str) -> str:
    """Request/reply: a command to ``shard``; the verb becomes the line's ``kind``."""
    return f"shard.{shard}.cmd.{verb}"


def command_wildcard(shard: str) -> str:
    """Every command to ``shard`` (what the replica holding it subscribes to)."""
    return f"shard.{shard}.cmd.>"


def board(shard: str, name: str) -> str:
    """Request: a whole board of ``shard`` (e.g. ``guilds``), in board order."""
    return f"shard.{shard}.board.{name}"


# --- health (every service) -------------------------------------------------------------

def health(service: str) -> str:
    """Request: any replica of ``service`` answers ``{"status": 200, ...}`` when it is up."""
    return f"{service}.health"


# --- ledger, cleanup, installer ---------------------------------------------------------
# Each service adds its subjects in a section of its own below.


def module_revert(module: str) -> str:
    """Request: the owning game module gives back a resource of a kind the shard plane
    does not know (see docs/contracts.md)."""
    return f"modules.{module}.revert"
