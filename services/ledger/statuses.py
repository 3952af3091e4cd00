"""The ledger's state machine as data: every status, which are resolved, and which
transition may start from which statuses. The store turns each entry into one guarded
``UPDATE … WHERE status = ANY(allowed)``; nothing else decides whether a change is allowed."""

from __future__ import annotations

from dataclasses import dataclass

# --- runs ------------------------------------------------------------------------------

RUN_STATUSES = ("scheduled", "running", "completed", "cancelled", "failed", "missed")
"""Every status an event run may have."""

RUN_TERMINAL = ("completed", "cancelled", "failed", "missed")
"""Run statuses after which the run does nothing more (its cleanup may begin)."""

RUN_STATUS_FROM: dict[str, tuple[str, ...]] = {
    "running": ("scheduled",),
    "completed": ("running",),
    "failed": ("running",),
    "cancelled": ("scheduled", "running"),
    "missed": ("scheduled",),
}
"""For each target run status, the statuses a run may move to it from."""

CLEANUP_STATUSES = ("pending", "complete", "incomplete")
"""A run's cleanup status; ``incomplete`` wants a person (manual retry)."""


# --- resources -------------------------------------------------------------------------

RESOURCE_STATUSES = ("pending", "confirmed", "reverting", "reverted", "orphaned", "drifted", "expired")
"""Every status a resource row may have."""

LIVE = ("pending", "confirmed")
"""Statuses that hold a target (module, kind, ref): at most one such row per target."""

RESOLVED = ("reverted", "expired")
"""Statuses that need nothing more (green on the console)."""

UNRESOLVED = ("pending", "confirmed", "reverting", "orphaned", "drifted")
"""Statuses that still count against a run's cleanup (``unresolved`` on the console)."""

REVERTABLE = ("pending", "confirmed", "orphaned")
"""Statuses a sweep may claim for a give-back (and fall back to after a transient failure)."""

WANTS_A_PERSON = ("orphaned", "drifted")
"""Statuses that want a person to look (amber, with ``reverting``, on the console)."""


EXPIRED_ERROR = "the game ended it at its deadline"
"""The ``lastError`` an expiry writes (S000:176)."""


@dataclass(frozen=True)
class Transition:
    """One resource transition: from which statuses, to which, and the run-log kind it writes."""

    name: str
    allowed: tuple[str, ...]
    to: str
    log_kind: str


CONFIRM = Transition("confirm", ("pending",), "confirmed", "resource.confirmed")
"""The shard acted on a reservation: the thing is out there."""

FAIL = Transition("fail", ("pending",), "reverted", "resource.failed")
"""The shard did not create what was reserved: nothing is out there, the target is free."""

EXPIRE = Transition("expire", ("pending", "confirmed", "orphaned"), "expired", "resource.expired")
"""The owning module reports the game ended it at its deadline (never a ``reverting`` row)."""

ORPHAN = Transition("orphan", ("confirmed",), "orphaned", "resource.orphaned")
"""A reconcile found the shard no longer lists it."""

CLAIM = Transition("claim", REVERTABLE, "reverting", "cleanup.claimed")
"""A sweep takes the row for a give-back (stale ``reverting`` claims are re-taken separately)."""

REVERTED = Transition("reverted", ("reverting",), "reverted", "cleanup.reverted")
"""The give-back succeeded (removed, or already gone)."""

DRIFTED = Transition("drifted", ("reverting",), "drifted", "cleanup.drifted")
"""Somebody changed it deliberately; it is left alone."""

FAILED = Transition("failed", ("reverting",), "<previous>", "cleanup.failed")
"""The give-back failed: back to the status it had before the claim, attempts + 1."""

TRANSITIONS = {t.name: t for t in (CONFIRM, FAIL, EXPIRE, ORPHAN, CLAIM, REVERTED, DRIFTED, FAILED)}
"""Every resource transition by name."""

REPLAYABLE = (CONFIRM, FAIL, REVERTED, DRIFTED)
"""Transitions a caller may ask again after a lost reply (a 503, a timeout) and be answered
200 with the row: each has one fixed target status. (``failed`` returns a row to where it was
and spends an attempt: asking it twice is two failures, so it is never a replay.)"""


def is_replay(step: Transition, status: str, last_kind: str | None, last_error: str | None,
              error: str | None) -> bool:
    """Whether ``step`` asked of a row it did not change is the same request again: the row is
    at the step's target, its latest log entry is this step's, and the error given (if any)
    is the one stored. Such a request answers 200 with the row and changes nothing; any other
    unchanged request is a real conflict (409)."""
    return (step in REPLAYABLE and status == step.to and last_kind == step.log_kind
            and (error is None or error == last_error))


def is_retry_replay(cleanup_status: str, last_kind: str | None) -> bool:
    """Whether a person's cleanup retry asked of a run that is not ``incomplete`` is the same
    retry again: its cleanup is ``pending`` and its latest cleanup log entry is the retry."""
    return cleanup_status == "pending" and last_kind == "cleanup.retried"
