"""Expiry: the owning module reports that the game ended a target at its own deadline.

docs/ledger.md, "Expiry": that module's rows for that exact (kind, ref) in ``pending``, ``confirmed``
or ``orphaned`` become ``expired``, each with a ``resource.expired`` log entry; ``reverting``
rows are left to their revert and resolved rows stay as they are. A malformed or unknown
expiry is not an error: it answers 0 and writes nothing. A terminal run whose last
unresolved row this was gets its cleanup ``complete`` — even from ``incomplete``; a run still
in flight is left to its own end. The module comes from the subject, never the payload.
"""

from __future__ import annotations

from typing import Any

from services.ledger import statuses
from services.ledger.database.queries.expiry import EXPIRE, SETTLE_EXPIRED
from services.ledger.database.store import Change, Database, resource_changes, rows, run_changes
from shared.contracts.ledger import KIND_MAX, REF_MAX, is_module_name, is_storable


def target_of(module: str, body: Any) -> tuple[str, str] | None:
    """The (kind, ref) an expiry names, or None when it is malformed: not an object, kind or
    ref missing, not text, empty, over-long or holding what no row can (a NUL, a lone
    surrogate), or a module token that is not a module name."""
    if not is_module_name(module) or not isinstance(body, dict):
        return None
    kind, ref = body.get("kind"), body.get("ref")
    if not (isinstance(kind, str) and isinstance(ref, str) and is_storable(kind) and is_storable(ref)):
        return None
    if not (0 < len(kind) <= KIND_MAX and 0 < len(ref) <= REF_MAX):
        return None
    return kind, ref


async def expire(db: Database, module: str, body: Any) -> tuple[int, list[Change]]:
    """Apply an expiry from ``module`` (the subject's token); returns how many rows expired."""
    target = target_of(module, body)
    if target is None:
        return 0, []
    kind, ref = target
    step, settle = statuses.EXPIRE, statuses.SETTLE_AFTER_EXPIRY
    async with db.connect() as conn:
        result = await rows(conn, EXPIRE,
                            {"module": module, "kind": kind, "ref": ref, "to": step.to, "why": statuses.EXPIRED_ERROR,
                             "allowed": list(step.allowed), "log_kind": step.log_kind})
        changes = resource_changes(result)
        run_ids = sorted({change.run["runId"] for change in changes})
        if run_ids:
            # A second statement: it must see the rows the first one just expired.
            settled = await rows(conn, SETTLE_EXPIRED,
                                 {"run_ids": run_ids, "terminal": list(statuses.RUN_TERMINAL),
                                  "unresolved": list(statuses.UNRESOLVED), "to": settle.to,
                                  "allowed": list(settle.allowed), "log_kind": settle.log_kind,
                                  "by": step.log_kind})
            changes += run_changes(settled)
    return len(result), changes
