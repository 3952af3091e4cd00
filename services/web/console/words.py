"""What the console says of each status, and its colour (shared/status_words.py, the same table
the ledger renders from; the seed's words where it quotes them). Green is
resolved, amber wants a person, red did not happen as planned; a colour is never the only
signal: every badge carries its word, and a mark (✓ ! ✗ …) that survives greyscale. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.status_words import CLEANUP_COLOUR, CLEANUP_WORD, RESOURCE_COLOUR, RESOURCE_WORD, RUN_COLOUR

MARK = {"green": "✓", "amber": "!", "red": "✗", "blue": "●", "grey": "…"}
"""The mark that goes with each colour."""


@dataclass(frozen=True)
class Badge:
    """One status as shown: ``word`` (what it means), ``colour``, and the raw ``code``."""

    code: str
    word: str
    colour: str

    @property
    def mark(self) -> str:
        return MARK.get(self.colour, "•")


RESOURCE = {status: (word, RESOURCE_COLOUR[status]) for status, word in RESOURCE_WORD.items()}
"""For a count by status (the ledger sends word and colour on every row itself)."""

RUN = {status: (status, colour) for status, colour in RUN_COLOUR.items()}

CLEANUP = {status: (word, CLEANUP_COLOUR[status]) for status, word in CLEANUP_WORD.items()}

MODULE_STATE = {
    "pending": ("pending", "grey"),
    "installed": ("installed", "green"),
    "upgraded": ("upgraded", "green"),
    "unchanged": ("unchanged", "green"),
    "refused": ("refused", "amber"),
    "failed": ("failed", "red"),
}

LOG = {
    "run.created": "run created",
    "run.status": "status changed",
    "resource.recorded": "recorded",
    "resource.confirmed": "confirmed by the shard",
    "resource.failed": "its creation failed",
    "resource.orphaned": "gone (reconcile)",
    "resource.expired": "ended by the game on time",
    "cleanup.claimed": "claimed for giving back",
    "cleanup.reverted": "given back",
    "cleanup.drifted": "someone else moved it",
    "cleanup.failed": "giving back failed",
    "cleanup.away": "the shard was away: tried again later, no attempt spent",
    "cleanup.swept": "swept",
    "cleanup.settled": "settled",
    "cleanup.retried": "cleanup retried",
}
"""What each run-log kind (the ledger's update event types) means, in words."""


def _badge(table: dict[str, tuple[str, str]], code: Any) -> Badge:
    text = code if isinstance(code, str) else "unknown"
    word, colour = table.get(text, (text, "grey"))
    return Badge(text, word, colour)


def run_badge(status: Any) -> Badge:
    return _badge(RUN, status)


def cleanup_badge(status: Any) -> Badge:
    return _badge(CLEANUP, status)


def module_badge(state: Any) -> Badge:
    return _badge(MODULE_STATE, state)


def resource_badge(row: dict[str, Any]) -> Badge:
    """A row's badge: the ledger's own word and colour when it sent them."""
    fallback = _badge(RESOURCE, row.get("status"))
    word, colour = row.get("word"), row.get("colour")
    return Badge(fallback.code, word if isinstance(word, str) and word else fallback.word,
                 colour if colour in MARK else fallback.colour)


def log_word(kind: Any) -> str:
    return LOG.get(kind, str(kind)) if isinstance(kind, str) else "?"
