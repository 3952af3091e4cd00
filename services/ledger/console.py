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

from services.ledger.resources import REVERT_INLINE_MAX, resource_json
from services.ledger.statuses import LIVE, RESOURCE_STATUSES, UNRESOLVED
from services.ledger.store import Database, NotFound, first, run_json

__all__ = ["DETAIL_INLINE_MAX", "PAGE_BYTES", "REVERT_INLINE_MAX", "console", "list_runs", "live", "live_modules",
           "page_bytes", "paged_rows", "run_log"]

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
        row = await first(conn, f"""
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
        row = await first(conn, f"""
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


async def list_runs(db: Database, status: str | None, cleanup_status: str | None, limit: int,
                    budget: int = PAGE_BYTES) -> bytes:
    """Runs filtered by status and/or cleanup status, newest first, as the reply's JSON bytes.
    Fewer than ``limit`` when they would pass :data:`PAGE_BYTES` (then ``"more": true``)."""
    async with db.connect() as conn:
        row = await first(conn, f"""
            WITH picked AS (
                SELECT {run_json('r')}::text AS j, r.created_at, r.run_id FROM runs r
                WHERE (CAST(:status AS text) IS NULL OR r.status = :status)
                  AND (CAST(:cleanup AS text) IS NULL OR r.cleanup_status = :cleanup)
                ORDER BY r.created_at DESC, r.run_id LIMIT :limit
            ), sized AS (
                SELECT j, created_at, run_id,
                       row_number() OVER w AS n, sum(octet_length(j) + 2) OVER w AS upto
                FROM picked WINDOW w AS (ORDER BY created_at DESC, run_id)
            )
            SELECT string_agg(j, ', ' ORDER BY created_at DESC, run_id)
                       FILTER (WHERE n = 1 OR upto <= :budget) AS rows,
                   count(*) FILTER (WHERE NOT (n = 1 OR upto <= :budget)) > 0 AS more
            FROM sized""",
                          {"status": status, "cleanup": cleanup_status, "limit": limit, "budget": budget})
    head = '{"status" : 200, "more" : true}' if row.more else '{"status" : 200}'
    return _with_rows(head, "runs", row.rows)


async def live(db: Database, module: str, limit: int, after: int | None = None,
               budget: int = PAGE_BYTES) -> bytes:
    """A page of the module's live (pending and confirmed) rows, oldest first, as the reply's
    JSON bytes: rows with an id above ``after``, at most ``limit`` and :data:`PAGE_BYTES`, and
    ``next``."""
    async with db.connect() as conn:
        row = await first(conn, f"""
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
        row = await first(conn, """
            SELECT json_build_object('status', 200, 'modules', COALESCE(json_agg(module ORDER BY module),
                                                                         '[]'::json))::text AS reply
            FROM (SELECT DISTINCT s.module FROM resources s WHERE s.status = ANY(:live)
                  ORDER BY s.module LIMIT :limit) picked""",
                          {"live": list(LIVE), "limit": limit})
    return row.reply.encode()
