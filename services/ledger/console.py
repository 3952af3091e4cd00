"""Reads: the run console (the run, a page of its resources, counts by status, unresolved),
a page of the run's log, runs by status and cleanup status, a page of a module's live rows, and
the modules owning live rows. PostgreSQL renders the whole answer as JSON in one query, so a console of 1,000 rows costs
one round trip and no per-row Python.

Replies that list rows are pages: at most ``limit`` rows and at most :data:`PAGE_BYTES` of them,
in id order, so that no reply outgrows a NATS message whatever the rows hold. A page that left
rows out says where to go on: ``next`` is the last id it holds, to be sent back as ``after``
(``next`` is null on the last page). A page always holds at least one row when one is left, and
one row always fits (``resources.REVERT_INLINE_MAX``)."""

from __future__ import annotations

import json

from services.ledger.requests import RUNS_CURSOR, ListRuns
from services.ledger.resources import REVERT_INLINE_MAX, resource_json
from services.ledger.statuses import LIVE, RESOURCE_STATUSES, UNRESOLVED
from services.ledger.store import NOW_MS, Database, NotFound, deadline_passed, read_first, run_json

__all__ = ["DETAIL_INLINE_MAX", "PAGE_BYTES", "REVERT_INLINE_MAX", "console", "list_runs", "live", "live_modules",
           "leases_overdue", "page_bytes", "paged_rows", "run_log"]

PAGE_BYTES = 768 * 1024
"""The most bytes of rows one reply carries (console, live rows, a claim, runs). NATS's
max_payload is 1 MiB by default (headers and body together); the rest is room for the
reply's other fields (at most a few kilobytes) and its headers."""

def page_bytes(max_payload: int | None) -> int:
    """The page budget under a NATS server whose max_payload (from its INFO) is
    ``max_payload``: :data:`PAGE_BYTES`, or three quarters of a smaller max_payload."""
    return min(PAGE_BYTES, max_payload * 3 // 4) if max_payload else PAGE_BYTES


PAGE_ROWS_MAX = 3000
"""The most rows one page renders to measure: no more can fit in :data:`PAGE_BYTES` (a row
renders to at least 280 bytes), so a larger ``limit`` renders nothing it could send."""


def paged_rows(candidates: str) -> str:
    """SQL (CTEs, to follow ``WITH``) that keeps the rows of ``candidates`` (a CTE of ``id``
    and ``j``, the row's JSON text, at most ``:limit`` + 1 rows in id order) that fit a page:
    ``kept`` (id, j) holds the first ``:limit`` rows whose sizes add up to at most ``:budget``
    (always the first row), ``sized`` all of them; more were left when ``sized`` outnumbers
    ``kept``."""
    return f"""
        sized AS (
            SELECT id, j, row_number() OVER w AS n, sum(octet_length(j) + 2) OVER w AS upto
            FROM {candidates} WINDOW w AS (ORDER BY id)
        ), kept AS (
            SELECT id, j FROM sized WHERE n <= :limit AND (n = 1 OR upto <= :budget)
        )"""


_NEXT = "CASE WHEN (SELECT count(*) FROM sized) > (SELECT count(*) FROM kept) THEN (SELECT max(id) FROM kept) END"
"""SQL: the page's ``next`` (its last id when rows were left, else null)."""

_ROWS = "(SELECT string_agg(j, ', ' ORDER BY id) FROM kept)"
"""SQL: the kept rows' JSON, comma-separated (the text of the reply's array, unparsed)."""


def _with_rows(head: str, key: str, rows: str | None) -> bytes:
    """The reply ``head`` (a JSON object's text) with ``key`` holding the rows' array."""
    return f'{head[:-1]}, "{key}" : [{rows or ""}]}}'.encode()


async def console(db: Database, run_id: str, after: int | None = None, limit: int = 1000,
                  budget: int = PAGE_BYTES) -> bytes:
    """A page of the run console as the reply's JSON bytes (``status`` 200 included), or
    NotFound: the run, its resources with an id above ``after`` (at most ``limit``, at most
    :data:`PAGE_BYTES`), ``next``, and the counts and unresolved of the whole run."""
    async with db.connect() as conn:
        row = await read_first(conn, f"""
            WITH candidates AS (
                SELECT s.id, {resource_json('s')}::text AS j FROM resources s
                WHERE s.run_id = :run_id AND s.id > :after ORDER BY s.id LIMIT :candidates
            ), {paged_rows('candidates')}
            SELECT json_build_object(
                'status', 200,
                'run', {run_json('r')},
                'counts', (SELECT json_object_agg(st.status, COALESCE(c.n, 0))
                           FROM unnest(CAST(:statuses AS text[])) AS st(status)
                           LEFT JOIN (SELECT status, count(*) AS n FROM resources
                                      WHERE run_id = r.run_id GROUP BY status) c ON c.status = st.status),
                'unresolved', (SELECT count(*) FROM resources s WHERE s.run_id = r.run_id
                                                                  AND s.status = ANY(:unresolved)),
                'leasesOverdue', (SELECT count(*) FROM resources s WHERE s.run_id = r.run_id
                                                                     AND {deadline_passed('s')}),
                'next', {_NEXT}
            )::text AS head, {_ROWS} AS rows
            FROM runs r WHERE r.run_id = :run_id""",
                          {"run_id": run_id, "statuses": list(RESOURCE_STATUSES), "unresolved": list(UNRESOLVED),
                           **_page(after, limit, budget)})
    if row is None:
        raise NotFound(f"no run {run_id!r}")
    return _with_rows(row.head, "resources", row.rows)


DETAIL_INLINE_MAX = 128 * 1024
"""The largest log entry ``detail`` a page carries (bytes as PostgreSQL prints it). Requests cap
what reaches the log (a sweep's summary at 64 KiB), so only an entry written before those caps
can pass this: it comes with ``"detail": null`` and ``"detailOmitted"`` (its size), so one entry
never outgrows a page. The detail stays in the database, whole."""


def _entry_json(alias: str) -> str:
    """SQL rendering the run-log row ``alias`` as its wire JSON (an oversized detail left out)."""
    a = alias
    size = f"octet_length({a}.detail::text)"
    head = f"'entryId', {a}.id, 'runId', {a}.run_id, 'resourceId', {a}.resource_id, 'kind', {a}.kind"
    return (f"(CASE WHEN {size} <= {DETAIL_INLINE_MAX} "
            f"THEN json_build_object({head}, 'detail', {a}.detail, 'at', {a}.at) "
            f"ELSE json_build_object({head}, 'detail', NULL, 'detailOmitted', {size}, 'at', {a}.at) END)")


async def run_log(db: Database, run_id: str, after: int | None = None, limit: int = 1000,
                  budget: int = PAGE_BYTES) -> bytes:
    """A page of the run's log as the reply's JSON bytes (``status`` 200 included), or NotFound:
    the entries with an id above ``after``, oldest first (at most ``limit``, at most
    :data:`PAGE_BYTES`), and ``next``."""
    async with db.connect() as conn:
        row = await read_first(conn, f"""
            WITH candidates AS (
                SELECT l.id, {_entry_json('l')}::text AS j FROM run_log l
                WHERE l.run_id = :run_id AND l.id > :after ORDER BY l.id LIMIT :candidates
            ), {paged_rows('candidates')}
            SELECT json_build_object('status', 200, 'runId', r.run_id, 'next', {_NEXT})::text AS head,
                   {_ROWS} AS rows
            FROM runs r WHERE r.run_id = :run_id""",
                          {"run_id": run_id, **_page(after, limit, budget)})
    if row is None:
        raise NotFound(f"no run {run_id!r}")
    return _with_rows(row.head, "entries", row.rows)


_RUN_ORDERS = {
    # (sort key as a number, ORDER BY, the keyset condition after the cursor (:k, :id))
    False: ("(extract(epoch FROM r.created_at) * 1000000)::bigint", "r.created_at DESC, r.run_id",
            "(r.created_at < 'epoch'::timestamptz + CAST(:k AS bigint) * interval '1 microsecond' OR "
            "(r.created_at = 'epoch'::timestamptz + CAST(:k AS bigint) * interval '1 microsecond' "
            "AND r.run_id > :id))"),
    True: ("r.starts_at", "r.starts_at, r.run_id",
           "(r.starts_at > CAST(:k AS bigint) OR (r.starts_at = CAST(:k AS bigint) AND r.run_id > :id))"),
}
"""How ``ledger.runs`` orders: newest first, or by schedule when a time window is asked."""


async def list_runs(db: Database, query: ListRuns, budget: int = PAGE_BYTES) -> bytes:
    """A page of runs as the reply's JSON bytes: filtered by status, cleanup status, shard and
    a time window (runs whose schedule overlaps ``[startsFrom, startsBefore)``, ordered by
    ``startsAt``; without a window, newest first). At most ``limit`` runs and
    :data:`PAGE_BYTES`; ``next`` (a cursor, sent back as ``after``) when more are left."""
    key, order, after = _RUN_ORDERS[query.by_schedule]
    cursor = RUNS_CURSOR.fullmatch(query.after) if query.after else None
    async with db.connect() as conn:
        row = await read_first(conn, f"""
            WITH picked AS (
                SELECT {run_json('r')}::text AS j, ({key})::text || ':' || r.run_id AS cursor,
                       row_number() OVER (ORDER BY {order}) AS n
                FROM runs r
                WHERE (CAST(:status AS text) IS NULL OR r.status = :status)
                  AND (CAST(:cleanup AS text) IS NULL OR r.cleanup_status = :cleanup)
                  AND (CAST(:shard AS text) IS NULL OR r.shard = :shard)
                  AND (CAST(:before AS bigint) IS NULL OR r.starts_at < :before)
                  AND (CAST(:from AS bigint) IS NULL OR COALESCE(r.ends_at, r.starts_at) >= :from)
                  AND (CAST(:after AS boolean) IS NOT TRUE OR {after})
                ORDER BY {order} LIMIT :limit + 1
            ), sized AS (
                SELECT j, cursor, n, sum(octet_length(j) + 2) OVER (ORDER BY n) AS upto FROM picked
            ), kept AS (
                SELECT * FROM sized WHERE n <= :limit AND (n = 1 OR upto <= :budget)
            )
            SELECT (SELECT string_agg(j, ', ' ORDER BY n) FROM kept) AS rows,
                   CASE WHEN (SELECT count(*) FROM picked) > (SELECT count(*) FROM kept)
                        THEN (SELECT cursor FROM kept ORDER BY n DESC LIMIT 1) END AS next""",
                          {"status": query.status, "cleanup": query.cleanup_status, "shard": query.shard,
                           "from": query.starts_from, "before": query.starts_before,
                           "after": cursor is not None, "k": int(cursor.group(1)) if cursor else 0,
                           "id": cursor.group(2) if cursor else "", "limit": query.limit, "budget": budget})
    head = json.dumps({"status": 200, "more": row.next is not None, "next": row.next})
    return _with_rows(head, "runs", row.rows)


async def live(db: Database, module: str, limit: int, after: int | None = None,
               budget: int = PAGE_BYTES) -> bytes:
    """A page of the module's live (pending and confirmed) rows, oldest first, as the reply's
    JSON bytes: rows with an id above ``after``, at most ``limit`` and :data:`PAGE_BYTES`, and
    ``next``."""
    async with db.connect() as conn:
        row = await read_first(conn, f"""
            WITH candidates AS (
                SELECT s.id, {resource_json('s')}::text AS j FROM resources s
                WHERE s.module = :module AND s.status = ANY(:live) AND s.id > :after
                ORDER BY s.id LIMIT :candidates
            ), {paged_rows('candidates')}
            SELECT json_build_object('status', 200, 'next', {_NEXT})::text AS head, {_ROWS} AS rows""",
                          {"module": module, "live": list(LIVE), **_page(after, limit, budget)})
    return _with_rows(row.head, "resources", row.rows)


def _page(after: int | None, limit: int, budget: int) -> dict[str, int]:
    """The paging parameters of :func:`paged_rows`."""
    limit = min(limit, PAGE_ROWS_MAX)
    return {"after": after or 0, "limit": limit, "candidates": limit + 1, "budget": budget}


async def live_modules(db: Database, limit: int) -> bytes:
    """Every module owning a live (pending or confirmed) row, by name, as the reply's JSON bytes:
    what a reconcile of every module asks (the website seed's ``modulesWithLiveRows``). At
    most 10,000 names of at most 64 ASCII characters: far below a NATS message."""
    async with db.connect() as conn:
        row = await read_first(conn, """
            SELECT json_build_object('status', 200, 'modules', COALESCE(json_agg(module ORDER BY module),
                                                                         '[]'::json))::text AS reply
            FROM (SELECT DISTINCT s.module FROM resources s WHERE s.status = ANY(:live)
                  ORDER BY s.module LIMIT :limit) picked""",
                          {"live": list(LIVE), "limit": limit})
    return row.reply.encode()


async def leases_overdue(db: Database, limit: int, budget: int = PAGE_BYTES) -> tuple[int, bytes]:
    """Rows still ``confirmed`` after their ``leaseDeadline`` (the shard should have let go of
    them while nobody watched), most overdue first: their count and the reply's JSON bytes (at
    most ``limit`` rows and :data:`PAGE_BYTES`). Served by ``ix_resources_status_lease``."""
    async with db.connect() as conn:
        row = await read_first(conn, f"""
            WITH overdue AS (
                SELECT s.id, s.lease_deadline, {resource_json('s')}::text AS j,
                       row_number() OVER (ORDER BY s.lease_deadline, s.id) AS n
                FROM resources s WHERE s.status = 'confirmed' AND s.lease_deadline < {NOW_MS}
                ORDER BY s.lease_deadline, s.id LIMIT :limit
            ), sized AS (
                SELECT j, n, sum(octet_length(j) + 2) OVER (ORDER BY n) AS upto FROM overdue
            )
            SELECT (SELECT count(*) FROM resources s WHERE s.status = 'confirmed' AND s.lease_deadline < {NOW_MS})
                       AS count,
                   (SELECT string_agg(j, ', ' ORDER BY n) FROM sized WHERE n = 1 OR upto <= :budget) AS rows""",
                          {"limit": limit, "budget": budget})
    head = json.dumps({"status": 200, "count": row.count})
    return row.count, _with_rows(head, "resources", row.rows)
