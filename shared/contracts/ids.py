"""Every id that becomes a NATS subject token, a database key or a directory name: its
pattern, once. Match with ``re.fullmatch`` (``$`` would also match before a trailing newline)."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field

SHARD_ID_PATTERN = r"[a-z0-9_-]{1,32}"
"""A shard id; it becomes a subject token (``shard.<shard>.…``)."""

LEDGER_ID_PATTERN = r"[A-Za-z0-9_-]{1,64}"
"""A run id or a module name in the ledger (and in cleanup, the web door): each becomes a
subject token (``ledger.events.run.<runId>``, ``ledger.expired.<module>``)."""

REQUEST_ID_PATTERN = LEDGER_ID_PATTERN
"""An install's ``requestId``; it becomes a subject token (``installer.progress.<requestId>``)."""

MODULE_ID_PATTERN = r"[a-z0-9][a-z0-9_-]{0,63}"
"""An installed module's id: it names the module's directory and its NATS subjects."""

RUN_ID_MAX = 64
"""The longest run id (the ledger's column and :data:`LEDGER_ID_PATTERN`)."""

_SHARD_ID = re.compile(SHARD_ID_PATTERN)
_LEDGER_ID = re.compile(LEDGER_ID_PATTERN)
_MODULE_ID = re.compile(MODULE_ID_PATTERN)


def is_shard_id(value: object) -> bool:
    """True when ``value`` is a whole, valid shard id."""
    return isinstance(value, str) and _SHARD_ID.fullmatch(value) is not None


def is_ledger_id(value: object) -> bool:
    """True when ``value`` is a whole, valid run id or ledger module name."""
    return isinstance(value, str) and _LEDGER_ID.fullmatch(value) is not None


def is_module_id(value: object) -> bool:
    """True when ``value`` is a whole, valid installed module id."""
    return isinstance(value, str) and _MODULE_ID.fullmatch(value) is not None


# pydantic anchors ``pattern`` with search semantics: ^…$ (and ``$`` admits no newline there,
# pydantic-core's regex being Rust's), so each field pattern is anchored at both ends.
ShardId = Annotated[str, Field(pattern=f"^{SHARD_ID_PATTERN}$")]
RunId = Annotated[str, Field(pattern=f"^{LEDGER_ID_PATTERN}$",
                             description="A run id: letters, digits, _ and -, at most 64.")]
ModuleName = Annotated[str, Field(pattern=f"^{LEDGER_ID_PATTERN}$",
                                  description="A module name: letters, digits, _ and -, at most 64.")]
RequestId = Annotated[str, Field(pattern=f"^{REQUEST_ID_PATTERN}$")]
ModuleId = Annotated[str, Field(pattern=f"^{MODULE_ID_PATTERN}$")]
