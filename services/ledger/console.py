"""Reads: the run console (the run, its resources, counts by status, unresolved), runs by
status and cleanup status, a module's live rows, and the modules owning live rows.
PostgreSQL renders the whole answer as JSON in one query, so a console of 1,000 rows costs
one round trip and no per-row Python."""

from __future__ import annotations

from services.ledger.statuses import LIVE, RESOURCE_STATUSES, UNRESOLVED
from services.ledger.store import Database, NotFound, first, resource_json, run_json


async def console(db: Database, run_id: str) -> bytes:
    """The run console as the reply's JSON bytes (``status`` 200 included), or NotFound."""
    async with db.connect() as conn:
        row = await first(conn, f"""
            SELECT json_build_object(
                'status', 200,
                'run', {run_json('r')},
                'resources', COALESCE((SELECT json_agg({resource_json('s')} ORDER BY s.id)
                                       FROM resources s WHERE s.run_id = r.run_id), '[]'::json),
                'counts', (SELECT json_object_agg(st.status, COALESCE(c.n, 0))
                           FROM unnest(CAST(:statuses AS text[])) AS st(status)
                           LEFT JOIN (SELECT status, count(*) AS n FROM resources
                                      WHERE run_id = r.run_id GROUP BY status) c ON c.status = st.status),
                'unresolved', (SELECT count(*) FROM resources s WHERE s.run_id = r.run_id
                                                                  AND s.status = ANY(:unresolved))
            )::text AS reply
            FROM runs r WHERE r.run_id = :run_id""",
                          {"run_id": run_id, "statuses": list(RESOURCE_STATUSES), "unresolved": list(UNRESOLVED)})
    if row is None:
        raise NotFound(f"no run {run_id!r}")
    return row.reply.encode()


async def list_runs(db: Database, status: str | None, cleanup_status: str | None, limit: int) -> bytes:
    """Runs filtered by status and/or cleanup status, newest first, as the reply's JSON bytes."""
    async with db.connect() as conn:
        row = await first(conn, f"""
            SELECT json_build_object('status', 200, 'runs', COALESCE(json_agg(j ORDER BY created_at DESC, run_id),
                                                                      '[]'::json))::text AS reply
            FROM (SELECT {run_json('r')} AS j, r.created_at, r.run_id FROM runs r
                  WHERE (CAST(:status AS text) IS NULL OR r.status = :status)
                    AND (CAST(:cleanup AS text) IS NULL OR r.cleanup_status = :cleanup)
                  ORDER BY r.created_at DESC, r.run_id LIMIT :limit) picked""",
                          {"status": status, "cleanup": cleanup_status, "limit": limit})
    return row.reply.encode()


async def live(db: Database, module: str, limit: int) -> bytes:
    """The module's live (pending and confirmed) rows, oldest first, as the reply's JSON bytes."""
    async with db.connect() as conn:
        row = await first(conn, f"""
            SELECT json_build_object('status', 200, 'resources', COALESCE(json_agg(j ORDER BY id), '[]'::json))::text
                   AS reply
            FROM (SELECT {resource_json('s')} AS j, s.id FROM resources s
                  WHERE s.module = :module AND s.status = ANY(:live) ORDER BY s.id LIMIT :limit) picked""",
                          {"module": module, "live": list(LIVE), "limit": limit})
    return row.reply.encode()


async def live_modules(db: Database, limit: int) -> bytes:
    """Every module owning a live (pending or confirmed) row, by name, as the reply's JSON bytes:
    what a reconcile of every module asks (the website seed's ``modulesWithLiveRows``)."""
    async with db.connect() as conn:
        row = await first(conn, """
            SELECT json_build_object('status', 200, 'modules', COALESCE(json_agg(module ORDER BY module),
                                                                         '[]'::json))::text AS reply
            FROM (SELECT DISTINCT s.module FROM resources s WHERE s.status = ANY(:live)
                  ORDER BY s.module LIMIT :limit) picked""",
                          {"live": list(LIVE), "limit": limit})
    return row.reply.encode()
