"""The ledger's state machine, as data: for every change the ledger makes, the statuses it may
start from, the status it leads to and the run-log kind it writes. The vocabulary itself (every
status and verdict, as the wire carries it) is ``shared/contracts/ledger_statuses.py``; this
module is the only place in the ledger that names a status.

Nothing else decides whether a change is allowed: every statement in ``queries/`` *binds*
these entries as parameters (``status = ANY(:allowed)``, ``SET status = :to``, the per-row
rules of a batch of give-back outcomes as ``unnest`` arrays), and the few fragments that cannot
take parameters (a row's rendering as JSON, shared by every statement, and the tables' CHECK
constraints) are generated here from the same data (:func:`sql_one_of`, :func:`sql_case`).
``docs/adr/0001-ledger-state-machine.md`` says why; ``tests/ledger/test_statuses.py`` checks
this table against ``docs/ledger.md``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Final

from shared.contracts import ledger_statuses as vocab
from shared.contracts.ledger_statuses import (
    CLEANUP_STATUSES,
    RESOURCE_STATUSES,
    RUN_STATUSES,
    VERDICTS,
    CleanupStatus,
    ResourceStatus,
    RunStatus,
    Verdict,
)

__all__ = [
    "AWAY", "CLAIM", "CLEANUP_STATUSES", "CONFIRM", "DISPLACED", "DRIFTED", "EXPIRE", "EXPIRED_ERROR", "FAIL",
    "FAILED", "FINISH",
    "IN_FLIGHT", "LEASE_HELD", "LIVE", "NEW_RUN", "NEW_RUN_CLEANUP", "ORPHAN", "OUTCOMES", "OUTCOMES_FROM",
    "PREVIOUS_UNKNOWN", "RECLAIM", "RECORD", "REOPEN", "REPLAYABLE", "RESERVE", "RESOURCE_STATUSES", "RETRY",
    "REVERTABLE", "REVERTED", "RUN_CREATED_LOG", "RUN_STATUSES", "RUN_STATUS_FROM", "RUN_STATUS_LOG", "RUN_TERMINAL",
    "SETTLE", "SETTLE_AFTER_EXPIRY", "SWEEPABLE", "SWEEP_DRIFTED", "SWEEP_FAILED", "SWEEP_REVERTED", "UNRESOLVED",
    "VERDICTS", "WAITING", "CleanupStatus", "CleanupStep", "FinishRule", "Outcome", "ResourceStatus", "RunStatus",
    "Transition", "Verdict", "is_replay", "is_retry_replay", "sql_case", "sql_literal", "sql_one_of",
]

# --- runs ------------------------------------------------------------------------------

NEW_RUN: Final[RunStatus] = vocab.SCHEDULED
"""The status a run is created with (the column's default)."""

RUN_TERMINAL: Final[tuple[RunStatus, ...]] = (vocab.COMPLETED, vocab.CANCELLED, vocab.RUN_FAILED, vocab.MISSED)
"""Run statuses after which the run does nothing more (its cleanup may begin)."""

RUN_STATUS_FROM: Final[Mapping[RunStatus, tuple[RunStatus, ...]]] = MappingProxyType({
    vocab.RUNNING: (vocab.SCHEDULED,),
    vocab.COMPLETED: (vocab.RUNNING,),
    vocab.RUN_FAILED: (vocab.RUNNING,),
    vocab.CANCELLED: (vocab.SCHEDULED, vocab.RUNNING),
    vocab.MISSED: (vocab.SCHEDULED,),
})
"""For each target run status, the statuses a run may move to it from (``scheduled`` is only
ever the first status, never a target)."""

RUN_CREATED_LOG: Final = "run.created"
"""The run-log kind (and update event type) of a new run."""

RUN_STATUS_LOG: Final = "run.status"
"""The run-log kind (and update event type) of a run's move along :data:`RUN_STATUS_FROM`."""


# --- a run's cleanup -------------------------------------------------------------------

NEW_RUN_CLEANUP: Final[CleanupStatus] = vocab.CLEANUP_PENDING
"""The cleanup status a run is created with (the column's default)."""

SWEEPABLE: Final[tuple[CleanupStatus, ...]] = (vocab.CLEANUP_PENDING,)
"""Cleanup statuses a sweep works on: settle, candidates, waiting and finish look only at runs
whose cleanup is one of these (``incomplete`` wants a person first: a retry)."""


@dataclass(frozen=True)
class CleanupStep:
    """One change of a run's cleanup status: from which, to which, and the log kind it writes."""

    name: str
    allowed: tuple[CleanupStatus, ...]
    to: CleanupStatus
    log_kind: str


SETTLE = CleanupStep("settle", SWEEPABLE, vocab.CLEANUP_COMPLETE, "cleanup.settled")
"""A terminal run holding nothing unresolved is cleaned up (``ledger.sweep.settle``)."""

SETTLE_AFTER_EXPIRY = CleanupStep("settle after an expiry", (vocab.CLEANUP_PENDING, vocab.CLEANUP_INCOMPLETE),
                                  vocab.CLEANUP_COMPLETE, "cleanup.settled")
"""An expiry resolved a terminal run's last unresolved row: cleaned up, even from
``incomplete`` (the person it waited for has nothing left to do)."""

RETRY = CleanupStep("retry", (vocab.CLEANUP_INCOMPLETE,), vocab.CLEANUP_PENDING, "cleanup.retried")
"""A person's retry: the sweep takes the run up again (its rows' attempts reset)."""

REOPEN = CleanupStep("reopen", (vocab.CLEANUP_COMPLETE,), vocab.CLEANUP_PENDING, "resource.recorded")
"""A row recorded for a run whose cleanup was complete: the sweep must give it back too. It
writes no entry of its own: the record's ``resource.recorded`` is it."""


@dataclass(frozen=True)
class FinishRule:
    """How the end of a sweep decides its run's cleanup status, from what the run still holds."""

    allowed: tuple[CleanupStatus, ...]
    clean: CleanupStatus
    """Nothing unresolved is left."""
    stuck: CleanupStatus
    """Unresolved rows are left, none within the sweep's reach (drifted, refused, attempts spent)."""
    unfinished: CleanupStatus
    """Rows within the sweep's reach are left (attempts left, in flight, or backing off)."""
    log_kind: str


FINISH = FinishRule(SWEEPABLE, clean=vocab.CLEANUP_COMPLETE, stuck=vocab.CLEANUP_INCOMPLETE,
                    unfinished=vocab.CLEANUP_PENDING, log_kind="cleanup.swept")
"""``ledger.sweep.finish``: logged (and an event) whether or not the status changed."""


# --- resources -------------------------------------------------------------------------

LIVE: Final[tuple[ResourceStatus, ...]] = (vocab.PENDING, vocab.CONFIRMED)
"""Statuses that hold a target (module, kind, ref): at most one such row per target."""

UNRESOLVED: Final[tuple[ResourceStatus, ...]] = (vocab.PENDING, vocab.CONFIRMED, vocab.REVERTING, vocab.ORPHANED,
                                                 vocab.DRIFTED)
"""Statuses that still count against a run's cleanup (``unresolved`` on the console)."""

REVERTABLE: Final[tuple[ResourceStatus, ...]] = (vocab.PENDING, vocab.CONFIRMED, vocab.ORPHANED)
"""Statuses a sweep may claim for a give-back (and fall back to after a failed one); the only
values ``previous_status`` may hold."""

IN_FLIGHT: Final[tuple[ResourceStatus, ...]] = (vocab.REVERTING,)
"""Statuses of a row claimed for a give-back whose outcome is not recorded yet."""

WAITING: Final[tuple[ResourceStatus, ...]] = REVERTABLE + IN_FLIGHT
"""Statuses of a row that may be waiting for its shard (``away`` > 0): ``ledger.sweep.waiting``."""

LEASE_HELD: Final[tuple[ResourceStatus, ...]] = (vocab.CONFIRMED,)
"""Statuses in which a row's ``leaseDeadline`` can pass (the shard should let go of it)."""

PREVIOUS_UNKNOWN: Final[ResourceStatus] = vocab.CONFIRMED
"""Where a failed give-back returns a row that remembers no status from before its claim."""

DISPLACED: Final[ResourceStatus] = vocab.ORPHANED
"""Where a failed give-back returns a row whose status before its claim held a target (:data:`LIVE`)
when a newer row holds that target now (taken while this one was ``reverting``, which holds
none): still unresolved and given back, but not a second live row for one target."""

EXPIRED_ERROR = "the game ended it at its deadline"
"""The ``lastError`` an expiry writes, the website core seed's sentence (docs/ledger.md, "Expiry")."""


@dataclass(frozen=True)
class Transition:
    """One resource transition: from which statuses, to which, and the run-log kind (and update
    event type) it writes. ``to`` is None for a give-back that did not happen: the row goes back
    to the status it had before its claim (``previous_status``, else :data:`PREVIOUS_UNKNOWN`).
    ``action`` is how a 409 names it ("… ; {action} needs it to be …"); its name by default."""

    name: str
    allowed: tuple[ResourceStatus, ...]
    to: ResourceStatus | None
    log_kind: str
    action: str = ""

    def __post_init__(self) -> None:
        if not self.action:
            object.__setattr__(self, "action", self.name)


RESERVE = Transition("reserve", (), vocab.PENDING, "resource.recorded")
"""A new row for a thing the shard is about to create (needs a run that is not over)."""

RECORD = Transition("record", (), vocab.CONFIRMED, "resource.recorded")
"""A new row for a thing already out there (whatever the run's status: it reopens its cleanup)."""

CONFIRM = Transition("confirm", (vocab.PENDING,), vocab.CONFIRMED, "resource.confirmed")
"""The shard acted on a reservation: the thing is out there."""

FAIL = Transition("fail", (vocab.PENDING,), vocab.REVERTED, "resource.failed")
"""The shard did not create what was reserved: nothing is out there, the target is free."""

EXPIRE = Transition("expire", (vocab.PENDING, vocab.CONFIRMED, vocab.ORPHANED), vocab.EXPIRED, "resource.expired")
"""The owning module reports the game ended it at its deadline (never a ``reverting`` row)."""

ORPHAN = Transition("orphan", (vocab.CONFIRMED,), vocab.ORPHANED, "resource.orphaned")
"""A reconcile found the shard no longer lists it."""

CLAIM = Transition("claim", REVERTABLE, vocab.REVERTING, "cleanup.claimed")
"""A sweep takes the row for a give-back (attempts left, no back-off ahead); the row remembers
the status it had (``previous_status``)."""

RECLAIM = Transition("reclaim", IN_FLIGHT, vocab.REVERTING, "cleanup.claimed")
"""A sweep takes again a row whose claim is older than its claim timeout (a sweeper died); the
status remembered by the first claim stays."""

REVERTED = Transition("reverted", IN_FLIGHT, vocab.REVERTED, "cleanup.reverted")
"""The give-back succeeded (removed, or already gone)."""

DRIFTED = Transition("drifted", IN_FLIGHT, vocab.DRIFTED, "cleanup.drifted")
"""Somebody changed it deliberately; it is left alone."""

FAILED = Transition("failed", IN_FLIGHT, None, "cleanup.failed", action="a failed give-back")
"""The give-back failed: back to the status before the claim (an attempt spent)."""

AWAY = Transition("away", IN_FLIGHT, None, "cleanup.away")
"""The give-back met nobody (no gateway held the shard, no module subscribed, no answer in
time): back to the status before the claim, no attempt spent."""

REPLAYABLE: Final[tuple[Transition, ...]] = (CONFIRM, FAIL, REVERTED, DRIFTED)
"""Transitions a caller may ask again after a lost reply (a 503, a timeout) and be answered
200 with the row: each has one fixed target status. (``failed`` returns a row to where it was
and spends an attempt: asking it twice is two failures, so it is never a replay.)"""


@dataclass(frozen=True)
class Outcome:
    """What recording one give-back's outcome does to its row, beyond ``step`` (allowed
    statuses, target, log kind): whether it spends one of the row's attempts, gives up on the
    row (no more give-backs until a person's retry), counts a give-back that met nobody
    (``away + 1``, ``retry_at`` = now + min(cap, base × 2^away)) or clears that count
    (``away = 0``, no ``retry_at``: somebody answered)."""

    step: Transition
    spends_attempt: bool = False
    gives_up: bool = False
    counts_away: bool = False
    clears_away: bool = True

    def __post_init__(self) -> None:
        if self.step.allowed != OUTCOMES_FROM:
            raise ValueError(f"an outcome starts from {OUTCOMES_FROM}, not {self.step.allowed}")
        if self.counts_away and self.clears_away:
            raise ValueError("an outcome counts a give-back that met nobody or clears the count, not both")


OUTCOMES_FROM: Final[tuple[ResourceStatus, ...]] = IN_FLIGHT
"""Every outcome starts from these (one guard for a whole batch: ``status = ANY(:allowed)``)."""

OUTCOMES: Final[Mapping[Verdict, Outcome]] = MappingProxyType({
    vocab.VERDICT_REVERTED: Outcome(REVERTED),
    vocab.VERDICT_DRIFTED: Outcome(DRIFTED),
    vocab.VERDICT_FAILED: Outcome(FAILED, spends_attempt=True, gives_up=True),
    vocab.VERDICT_TRANSIENT: Outcome(FAILED, spends_attempt=True),
    vocab.VERDICT_AWAY: Outcome(AWAY, counts_away=True, clears_away=False),
})
"""What each verdict of ``ledger.sweep.outcomes`` does: ``failed`` is a refusal (gives up),
``transient`` a failure worth another attempt, ``away`` a give-back that met nobody."""

SWEEP_REVERTED: Final = replace(OUTCOMES[vocab.VERDICT_REVERTED], clears_away=False)
"""``ledger.sweep.reverted``: the ``reverted`` verdict for one row. Like the other one-row
subjects it predates ``away`` and leaves ``away``/``retry_at`` as they are."""

SWEEP_DRIFTED: Final = replace(OUTCOMES[vocab.VERDICT_DRIFTED], clears_away=False)
"""``ledger.sweep.drifted``: the ``drifted`` verdict for one row (``away`` left as it is)."""

SWEEP_FAILED: Final[Mapping[bool, Outcome]] = MappingProxyType({
    True: replace(OUTCOMES[vocab.VERDICT_TRANSIENT], clears_away=False),
    False: replace(OUTCOMES[vocab.VERDICT_FAILED], clears_away=False),
})
"""``ledger.sweep.failed`` by its ``transient`` flag: the ``transient`` or ``failed`` verdict
for one row (``away`` left as it is)."""

if set(OUTCOMES) != set(VERDICTS):  # pragma: no cover - the vocabulary grew a verdict
    raise RuntimeError(f"verdicts without an outcome: {set(VERDICTS) - set(OUTCOMES)}")
if CLAIM.to != RECLAIM.to:  # pragma: no cover - one claim statement sets both
    raise RuntimeError("a claim and a reclaim must lead to the same status")


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
    retry again: its cleanup is where a retry leads and its latest cleanup log entry (a retry or
    a sweep's finish) is the retry."""
    return cleanup_status == RETRY.to and last_kind == RETRY.log_kind


# --- SQL generated from the table --------------------------------------------------------
# Where a fragment is shared by every statement (a row's rendering) or is DDL (a CHECK
# constraint), it cannot take parameters: these write the table's values as SQL constants.


def sql_literal(value: str) -> str:
    """A constant string as SQL text (quotes doubled)."""
    return "'" + value.replace("'", "''") + "'"


def sql_one_of(column: str, values: Sequence[str]) -> str:
    """SQL: ``column`` holds one of ``values`` (``column = 'a'`` for one value, so an index on
    ``column`` keeps its order; ``column IN ('a', 'b')`` for more)."""
    if not values:
        raise ValueError("sql_one_of needs at least one value")
    if len(values) == 1:
        return column + " = " + sql_literal(values[0])
    return column + " IN (" + ", ".join(sql_literal(v) for v in values) + ")"


def sql_case(column: str, table: Mapping[str, str]) -> str:
    """SQL: ``table[column]`` (NULL for a value the table does not name), e.g. the console's
    word or colour of each status (``shared/status_words.py``)."""
    arms = " ".join("WHEN " + sql_literal(key) + " THEN " + sql_literal(text) for key, text in table.items())
    return "CASE " + column + " " + arms + " END"
