"""Which of the ledger's two request paths serves each subject of its contract
(docs/architecture.md, "The ledger's two request paths").

Both paths run the same handler, built by ``app.answering`` from the subject's action: the
request validated with the contract's model in, the whole reply out (``dispatcher.Handler``).
FastStream calls it from a subscriber; the dispatcher (``dispatcher.py``) from a plain nats-py
queue subscription in the same ``ledger`` group, with the same body reading, the same 400s and
the same error replies. So moving a fixed subject from one path to the other is changing its
entry here, and its replies stay byte for byte the same (``tests/ledger/test_request_paths.py``
moves every one and compares)."""

from __future__ import annotations

from enum import Enum

from shared import subjects


class Served(Enum):
    """A request path of the ledger."""

    FASTSTREAM = "FastStream"
    """A FastStream subscriber (``app.register_handlers``): validation, the AsyncAPI document and
    the error middleware come with it."""
    DISPATCHER = "dispatcher"
    """``dispatcher.py`` on nats-py: no per-message framework cost, bounded at
    ``SHARDBUS_LEDGER_PENDING_MAX`` requests under way a subject (then 503 at once)."""


FASTSTREAM, DISPATCHER = Served.FASTSTREAM, Served.DISPATCHER

SERVED: dict[str, Served] = {
    subjects.LEDGER_RUN_CREATE: FASTSTREAM,
    subjects.LEDGER_RUN_STATUS: FASTSTREAM,
    subjects.LEDGER_RESOURCE_RESERVE: DISPATCHER,
    subjects.LEDGER_RESOURCE_RECORD: DISPATCHER,
    subjects.LEDGER_RESOURCE_CONFIRM: DISPATCHER,
    subjects.LEDGER_RESOURCE_FAIL: DISPATCHER,
    subjects.LEDGER_CONSOLE: FASTSTREAM,
    subjects.LEDGER_LOG: FASTSTREAM,
    subjects.LEDGER_RUNS: FASTSTREAM,
    subjects.LEDGER_LEASES_OVERDUE: FASTSTREAM,
    subjects.LEDGER_LIVE: FASTSTREAM,
    subjects.LEDGER_LIVE_MODULES: FASTSTREAM,
    subjects.LEDGER_SWEEP_SETTLE: FASTSTREAM,
    subjects.LEDGER_SWEEP_CANDIDATES: DISPATCHER,
    subjects.LEDGER_SWEEP_CLAIM: DISPATCHER,
    subjects.LEDGER_SWEEP_REVERTED: DISPATCHER,
    subjects.LEDGER_SWEEP_DRIFTED: DISPATCHER,
    subjects.LEDGER_SWEEP_FAILED: DISPATCHER,
    subjects.LEDGER_SWEEP_OUTCOMES: DISPATCHER,
    subjects.LEDGER_SWEEP_FINISH: DISPATCHER,
    subjects.LEDGER_SWEEP_RETRY: FASTSTREAM,
    subjects.LEDGER_SWEEP_WAITING: FASTSTREAM,
    # These two take the module from the subject (FastStream's ``Path``); the dispatcher serves
    # fixed subjects only, so they cannot move without teaching it subject tokens.
    subjects.LEDGER_EXPIRED_PATTERN: FASTSTREAM,
    subjects.LEDGER_RECONCILE_PATTERN: FASTSTREAM,
}
"""Every subject of ``shared.contracts.ledger.CONTRACTS`` and the path that serves it. The
dispatcher's are the ones a sweep or a busy shard sends by the thousand (issue 15: under a
sweep, FastStream's per-message machinery was a fifth of the ledger's CPU)."""

MOVABLE: frozenset[str] = frozenset(subject for subject in SERVED if "{" not in subject)
"""The subjects either path can serve: the fixed ones."""


def served_by(path: Served) -> tuple[str, ...]:
    """The subjects ``path`` serves, in the table's order."""
    return tuple(subject for subject, served in SERVED.items() if served is path)
