"""An expiry's statements (``services/ledger/expiry.py``): expire a target's rows, then settle
the runs that hold nothing unresolved any more."""

from __future__ import annotations

from services.ledger.database.queries.fragments import (
                           SETTLE_RUNS,
                           SETTLED_BY,
                           TARGET_DETAIL,
                           resource_events,
                           run_events,
)
from services.ledger.database.queries.statement import Statement, compose

EXPIRE = Statement("EXPIRE", """
    The module's rows of the target (kind, ref) in :allowed move to :to with lastError :why
    (statuses.EXPIRE), each with its log entry and event.""", compose("""
    WITH changed AS (
        UPDATE resources SET status = :to, last_error = :why, updated_at = now(), claimed_at = NULL
        WHERE module = :module AND kind = :kind AND ref = :ref AND status = ANY(:allowed)
        RETURNING *
    ), $events""", events=resource_events("changed", TARGET_DETAIL)))

SETTLE_EXPIRED = Statement("SETTLE_EXPIRED", """
    After an expiry: the runs :run_ids that are terminal, whose cleanup is in :allowed and that
    hold nothing unresolved move their cleanup to :to (statuses.SETTLE_AFTER_EXPIRY), logged
    with {"by": :by}. A second statement: it sees the rows EXPIRE just changed.""",
                           compose(SETTLE_RUNS, which="r.run_id = ANY(:run_ids) AND",
                                   events=run_events("changed", SETTLED_BY)))
