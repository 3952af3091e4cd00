"""What two services agree on, written once: each subject's request, reply and limits, the ids
that become subject tokens, and the ledger's status vocabulary. The service that owns a subject
validates its requests with these models and every client builds its requests and reads its
replies with the same ones; ``tests/contracts`` checks both sides of every subject.

``shared.contracts`` imports no service. The ids that become subject tokens are in :mod:`.ids`,
the ledger's status vocabulary in :mod:`.ledger_statuses`; one module per owner holds its
subjects (:mod:`.ledger`, :mod:`.cleanup`, :mod:`.installer`, :mod:`.gateway`), and :mod:`.registry` lists
them all (ADR 4)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pydantic import BaseModel

_SUBJECT = re.compile(r"([A-Za-z0-9_-]+|\{[a-z]+\})(\.([A-Za-z0-9_-]+|\{[a-z]+\}))*")
"""A subject's tokens, each literal or a ``{name}`` placeholder."""


@dataclass(frozen=True)
class Contract:
    """One request/reply subject: who answers it, what it takes and what it answers.

    ``subject`` is the subject itself, or a pattern whose ``{name}`` tokens stand for ids (e.g.
    ``ledger.expired.{module}``, ``shard.{shard}.cmd.{verb}``); ``queue`` is the owner's queue
    group (``None``: every replica answers, or only one subscribes)."""

    subject: str
    owner: str
    request: type[BaseModel]
    reply: type[BaseModel]
    queue: str | None = None

    def __post_init__(self) -> None:
        if _SUBJECT.fullmatch(self.subject) is None:
            raise ValueError(f"not a subject or a subject pattern: {self.subject!r}")
        if not self.owner:
            raise ValueError(f"contract {self.subject!r} names no owner")
