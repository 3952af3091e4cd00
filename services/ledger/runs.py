"""Event runs: create one (idempotent on its id) and move its status along the state
machine of ``statuses.RUN_STATUS_FROM``, each move one guarded UPDATE with its log entry."""

from __future__ import annotations

import uuid

from services.ledger.statuses import RUN_STATUS_FROM, RUN_TERMINAL
from services.ledger.store import Database, Change, Conflict, first, run_changes, run_events, run_or_not_found


async def create_run(db: Database, run_id: str | None, shard: str, event: str, starts_at: int | None = None,
                     ends_at: int | None = None) -> tuple[dict, list[Change]]:
    """A new ``scheduled`` run, with its schedule if given (``startsAt``/``endsAt``, ms); a
    repeat with the same ``run_id`` returns the first run (409 if it names another shard,
    event or schedule)."""
    run_id = run_id or uuid.uuid4().hex
    async with db.connect() as conn:
        row = await first(conn, f"""
            WITH created AS (
                INSERT INTO runs (run_id, shard, event, starts_at, ends_at)
                VALUES (:run_id, :shard, :event, CAST(:starts_at AS bigint), CAST(:ends_at AS bigint))
                ON CONFLICT (run_id) DO NOTHING RETURNING *
            ), logged AS (
                INSERT INTO run_log (run_id, kind, detail)
                SELECT run_id, 'run.created', jsonb_build_object('shard', shard, 'event', event) FROM created
            ), {run_events('created', "'run.created'")}""",
                          {"run_id": run_id, "shard": shard, "event": event, "starts_at": starts_at,
                           "ends_at": ends_at})
        if row is not None:
            change = run_changes([row])[0]
            return change.run, [change]
        run = await run_or_not_found(conn, run_id)
    if (run["shard"], run["event"]) != (shard, event):
        raise Conflict(f"run {run_id!r} already exists for shard {run['shard']!r}, event {run['event']!r}")
    if (starts_at, ends_at) != (None, None) and (run["startsAt"], run["endsAt"]) != (starts_at, ends_at):
        raise Conflict(f"run {run_id!r} already exists scheduled from {run['startsAt']} to {run['endsAt']}")
    return run, []


async def set_run_status(db: Database, run_id: str, status: str) -> tuple[dict, list[Change]]:
    """Move the run to ``status`` if the state machine allows it from where it is; asking for
    the status it already has changes nothing and answers the run."""
    allowed = RUN_STATUS_FROM.get(status, ())
    async with db.connect() as conn:
        row = await first(conn, f"""
            WITH changed AS (
                UPDATE runs SET status = :to, updated_at = now(),
                       ended_at = CASE WHEN :terminal THEN now() ELSE ended_at END
                WHERE run_id = :run_id AND status = ANY(:allowed)
                RETURNING *
            ), logged AS (
                INSERT INTO run_log (run_id, kind, detail)
                SELECT run_id, 'run.status', jsonb_build_object('status', status) FROM changed
            ), {run_events('changed', "'run.status'")}""",
                          {"run_id": run_id, "to": status, "allowed": list(allowed),
                           "terminal": status in RUN_TERMINAL})
        if row is not None:
            change = run_changes([row])[0]
            return change.run, [change]
        run = await run_or_not_found(conn, run_id)
    if run["status"] == status:
        return run, []
    raise Conflict(f"run {run_id!r} is {run['status']}; it cannot become {status} "
                   f"(only from {' or '.join(allowed) or 'nothing'})")

