"""Event runs: create one (idempotent on its id) and move its status along the state
machine of ``statuses.RUN_STATUS_FROM``, each move one guarded UPDATE with its log entry."""

from __future__ import annotations

import uuid

from services.ledger import statuses
from services.ledger.database.queries.runs import CREATE_RUN, SET_RUN_STATUS
from services.ledger.database.store import Change, Conflict, Database, Json, first, run_changes, run_or_not_found
from services.ledger.statuses import RunStatus


async def create_run(db: Database, run_id: str | None, shard: str, event: str, starts_at: int | None = None,
                     ends_at: int | None = None) -> tuple[Json, list[Change]]:
    """A new ``scheduled`` run, with its schedule if given (``startsAt``/``endsAt``, ms); a
    repeat with the same ``run_id`` returns the first run (409 if it names another shard,
    event or schedule)."""
    run_id = run_id or uuid.uuid4().hex
    async with db.connect() as conn:
        row = await first(conn, CREATE_RUN,
                          {"run_id": run_id, "shard": shard, "event": event, "starts_at": starts_at,
                           "ends_at": ends_at, "log_kind": statuses.RUN_CREATED_LOG})
        if row is not None:
            change = run_changes([row])[0]
            return change.run, [change]
        run = await run_or_not_found(conn, run_id)
    if (run["shard"], run["event"]) != (shard, event):
        raise Conflict(f"run {run_id!r} already exists for shard {run['shard']!r}, event {run['event']!r}")
    if (starts_at, ends_at) != (None, None) and (run["startsAt"], run["endsAt"]) != (starts_at, ends_at):
        raise Conflict(f"run {run_id!r} already exists scheduled from {run['startsAt']} to {run['endsAt']}")
    return run, []


async def set_run_status(db: Database, run_id: str, status: RunStatus) -> tuple[Json, list[Change]]:
    """Move the run to ``status`` if the state machine allows it from where it is; asking for
    the status it already has changes nothing and answers the run."""
    allowed = statuses.RUN_STATUS_FROM.get(status, ())
    async with db.connect() as conn:
        row = await first(conn, SET_RUN_STATUS,
                          {"run_id": run_id, "to": status, "allowed": list(allowed),
                           "terminal": status in statuses.RUN_TERMINAL, "log_kind": statuses.RUN_STATUS_LOG})
        if row is not None:
            change = run_changes([row])[0]
            return change.run, [change]
        run = await run_or_not_found(conn, run_id)
    if run["status"] == status:
        return run, []
    raise Conflict(f"run {run_id!r} is {run['status']}; it cannot become {status} "
                   f"(only from {' or '.join(allowed) or 'nothing'})")
