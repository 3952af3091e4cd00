"""The store's own statements (``services/ledger/database/store.py``): the plan of a paged read, a run
by id."""

from __future__ import annotations

from services.ledger.database.queries.fragments import run_json
from services.ledger.database.queries.statement import Statement, compose

FORCE_CUSTOM_PLAN = Statement("FORCE_CUSTOM_PLAN", """
    Plan the next statement of this transaction for the values it is given (store.read_first:
    the paged reads' generic plans were 20 times slower).""", """
    SET LOCAL plan_cache_mode = force_custom_plan""")

RUN_BY_ID = Statement("RUN_BY_ID", "The run's wire JSON (none: no such run).", compose("""
    SELECT $run::text AS run FROM runs r WHERE run_id = :id""", run=run_json("r")))
