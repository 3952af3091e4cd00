"""The ledger's status vocabulary as the wire carries it: every run status, cleanup status,
resource status and give-back verdict. Which transition may go from which status to which is
the ledger's state machine (``services/ledger/statuses.py``), built from these names; a client
compares a row's status with these constants, never with a string of its own."""

from __future__ import annotations

from typing import Final, Literal, get_args

RunStatus = Literal["scheduled", "running", "completed", "cancelled", "failed", "missed"]
CleanupStatus = Literal["pending", "complete", "incomplete"]
ResourceStatus = Literal["pending", "confirmed", "reverting", "reverted", "orphaned", "drifted", "expired"]
Verdict = Literal["reverted", "drifted", "failed", "transient", "away"]
"""A give-back's outcome as the cleanup service reports it (``ledger.sweep.outcomes``)."""

RUN_STATUSES: Final[tuple[RunStatus, ...]] = get_args(RunStatus)
CLEANUP_STATUSES: Final[tuple[CleanupStatus, ...]] = get_args(CleanupStatus)
RESOURCE_STATUSES: Final[tuple[ResourceStatus, ...]] = get_args(ResourceStatus)
VERDICTS: Final[tuple[Verdict, ...]] = get_args(Verdict)

# Runs.
SCHEDULED: Final[RunStatus] = "scheduled"
RUNNING: Final[RunStatus] = "running"
COMPLETED: Final[RunStatus] = "completed"
CANCELLED: Final[RunStatus] = "cancelled"
RUN_FAILED: Final[RunStatus] = "failed"
MISSED: Final[RunStatus] = "missed"

# A run's cleanup.
CLEANUP_PENDING: Final[CleanupStatus] = "pending"
CLEANUP_COMPLETE: Final[CleanupStatus] = "complete"
CLEANUP_INCOMPLETE: Final[CleanupStatus] = "incomplete"

# Resources.
PENDING: Final[ResourceStatus] = "pending"
CONFIRMED: Final[ResourceStatus] = "confirmed"
REVERTING: Final[ResourceStatus] = "reverting"
REVERTED: Final[ResourceStatus] = "reverted"
ORPHANED: Final[ResourceStatus] = "orphaned"
DRIFTED: Final[ResourceStatus] = "drifted"
EXPIRED: Final[ResourceStatus] = "expired"

# Give-back verdicts.
VERDICT_REVERTED: Final[Verdict] = "reverted"
VERDICT_DRIFTED: Final[Verdict] = "drifted"
VERDICT_FAILED: Final[Verdict] = "failed"
VERDICT_TRANSIENT: Final[Verdict] = "transient"
VERDICT_AWAY: Final[Verdict] = "away"
