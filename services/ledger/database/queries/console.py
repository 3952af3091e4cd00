"""The console's reads (``services/ledger/console.py``): a run's page, its log, lists of runs,
live rows and modules, leases overdue. Each is rendered whole by PostgreSQL and cut by count
and bytes (:func:`paged_rows`). A run's page also says what it was rendered from (its change
mark, :func:`tuple_mark`), so that a rendered page can be served again while
:data:`CONSOLE_MARK` finds the same (``services/ledger/console_cache.py``)."""

from __future__ import annotations

from services.ledger import statuses
from services.ledger.database.queries.fragments import NOW_MS, deadline_passed, resource_json, run_json
from services.ledger.database.queries.statement import Statement, compose

DETAIL_INLINE_MAX = 128 * 1024
"""The largest log entry ``detail`` a page carries (bytes as PostgreSQL prints it). Requests cap
what reaches the log (a sweep's summary at 64 KiB), so only an entry written before those caps
can pass this: it comes with ``"detail": null`` and ``"detailOmitted"`` (its size), so one entry
never outgrows a page. The detail stays in the database, whole."""


def entry_json(alias: str) -> str:
    """The run-log row ``alias`` as its wire JSON (a detail over :data:`DETAIL_INLINE_MAX` left
    out and sized: ``detailOmitted``)."""
    size = compose("octet_length($a.detail::text)", a=alias)
    head = compose("'entryId', $a.id, 'runId', $a.run_id, 'resourceId', $a.resource_id, 'kind', $a.kind", a=alias)
    return compose("""(CASE WHEN $size <= $max
        THEN json_build_object($head, 'detail', $a.detail, 'at', $a.at)
        ELSE json_build_object($head, 'detail', NULL, 'detailOmitted', $size, 'at', $a.at) END)""",
                   size=size, max=str(DETAIL_INLINE_MAX), head=head, a=alias)


def paged_rows(candidates: str) -> str:
    """CTEs (to follow ``WITH``) that keep the rows of ``candidates`` (a CTE of ``id`` and ``j``,
    the row's JSON text, at most ``:limit`` + 1 rows in id order) that fit a page: ``kept``
    (id, j) holds the first ``:limit`` rows whose sizes add up to at most ``:budget`` (always the
    first row), ``sized`` all of them; more were left when ``sized`` outnumbers ``kept``."""
    return compose("""sized AS (
            SELECT id, j, row_number() OVER w AS n, sum(octet_length(j) + 2) OVER w AS upto
            FROM $candidates WINDOW w AS (ORDER BY id)
        ), kept AS (
            SELECT id, j FROM sized WHERE n <= :limit AND (n = 1 OR upto <= :budget)
        )""", candidates=candidates)


PAGE_NEXT = "CASE WHEN (SELECT count(*) FROM sized) > (SELECT count(*) FROM kept) THEN (SELECT max(id) FROM kept) END"
"""A page's ``next``: its last id when rows were left, else null."""

PAGE_ROWS = "(SELECT string_agg(j, ', ' ORDER BY id) FROM kept)"
"""The kept rows' JSON, comma-separated (the text of the reply's array, unparsed)."""


def tuple_mark(alias: str) -> str:
    """A 64-bit hash of the row version ``alias`` as PostgreSQL stores it: the transaction that
    wrote it (``xmin``) and where it lies (``ctid``). Every UPDATE writes a new version, with
    the id of the writing transaction, so a row changed since a render has a version no render
    before its commit saw. Values the writer picked (``updated_at``, a serial id) cannot say
    that: a transaction that began before the render commits after it with older ones."""
    return compose("hashtextextended($a.xmin::text || '/' || $a.ctid::text, 0)", a=alias)


def _run_marks(alias: str) -> str:
    """The marks of the run ``alias``'s resources (:data:`CONSOLE_MARK`'s columns)."""
    return compose("""count(*) AS rows_count, sum($mark) AS rows_mark""", mark=tuple_mark(alias))


CONSOLE_PAGE = Statement("CONSOLE_PAGE", """
    A page of the run console, rendered whole by PostgreSQL: the reply's head (status :ok, the
    run, counts by status for every status in :statuses, unresolved, leases overdue, next) and
    its resources above :after (paged_rows) as JSON text; and, from the same snapshot, what it
    was rendered from: the run's row version (run_mark), the count and summed version hashes of
    the run's resources (rows_count, rows_mark), and the times between which every lease flag
    it carries stands (lease_after, the latest deadline it shows passed; lease_until, the
    earliest it shows not yet passed; in the statement's epoch milliseconds).""", compose("""
    WITH candidates AS (
        SELECT s.id, $resource::text AS j FROM resources s
        WHERE s.run_id = :run_id AND s.id > :after ORDER BY s.id LIMIT :candidates
    ), $paged
    SELECT json_build_object(
        'status', CAST(:ok AS integer),
        'run', $run,
        'counts', (SELECT json_object_agg(st.status, COALESCE(c.n, 0))
                   FROM unnest(CAST(:statuses AS text[])) AS st(status)
                   LEFT JOIN (SELECT status, count(*) AS n FROM resources
                              WHERE run_id = r.run_id GROUP BY status) c ON c.status = st.status),
        'unresolved', m.unresolved,
        'leasesOverdue', m.overdue,
        'next', $next
    )::text AS head, $rows AS rows,
    $run_mark AS run_mark, m.rows_count, m.rows_mark, m.lease_after, m.lease_until
    FROM runs r CROSS JOIN LATERAL (
        SELECT $marks,
               count(*) FILTER (WHERE s.status = ANY(:unresolved)) AS unresolved,
               count(*) FILTER (WHERE $deadline_passed) AS overdue,
               max(s.lease_deadline) FILTER (WHERE $deadline_passed) AS lease_after,
               min(s.lease_deadline) FILTER (WHERE $held AND s.lease_deadline >= $now_ms) AS lease_until
        FROM resources s WHERE s.run_id = r.run_id) m
    WHERE r.run_id = :run_id""", resource=resource_json("s"), paged=paged_rows("candidates"),
                                 run=run_json("r"), deadline_passed=deadline_passed("s"),
                                 next=PAGE_NEXT, rows=PAGE_ROWS, run_mark=tuple_mark("r"), marks=_run_marks("s"),
                                 held=statuses.sql_one_of("s.status", statuses.LEASE_HELD), now_ms=NOW_MS))

CONSOLE_MARK = Statement("CONSOLE_MARK", """
    What a page of the run :run_id would be rendered from now (CONSOLE_PAGE's run_mark,
    rows_count, rows_mark; run_mark null when the run is gone), and the statement's time in
    epoch milliseconds: a rendered page is still the page while all three are the same and
    the time is after its lease_after and at most its lease_until. It reads each of the run's
    resources' row versions (through ix_resources_run_status), not its JSON: 0.28 ms for a
    run of 1,000 rows where CONSOLE_PAGE takes 7.6 ms.""", compose("""
    SELECT (SELECT $run_mark FROM runs r WHERE r.run_id = :run_id) AS run_mark, $marks, $now_ms AS now_ms
    FROM resources s WHERE s.run_id = :run_id""", run_mark=tuple_mark("r"), marks=_run_marks("s"), now_ms=NOW_MS))

LOG_PAGE = Statement("LOG_PAGE", """
    A page of the run's log above :after, oldest first (paged_rows): the reply's head (status
    :ok, runId, next) and the entries as JSON text.""", compose("""
    WITH candidates AS (
        SELECT l.id, $entry::text AS j FROM run_log l
        WHERE l.run_id = :run_id AND l.id > :after ORDER BY l.id LIMIT :candidates
    ), $paged
    SELECT json_build_object('status', CAST(:ok AS integer), 'runId', r.run_id, 'next', $next)::text AS head,
           $rows AS rows
    FROM runs r WHERE r.run_id = :run_id""", entry=entry_json("l"), paged=paged_rows("candidates"),
                                                        next=PAGE_NEXT, rows=PAGE_ROWS))

_RUNS_PAGE = """
    WITH picked AS (
        SELECT $run::text AS j, ($key)::text || ':' || r.run_id AS cursor,
               row_number() OVER (ORDER BY $order) AS n
        FROM runs r
        WHERE (CAST(:status AS text) IS NULL OR r.status = :status)
          AND (CAST(:cleanup AS text) IS NULL OR r.cleanup_status = :cleanup)
          AND (CAST(:shard AS text) IS NULL OR r.shard = :shard)
          AND (CAST(:before AS bigint) IS NULL OR r.starts_at < :before)
          AND (CAST(:from AS bigint) IS NULL OR COALESCE(r.ends_at, r.starts_at) >= :from)
          AND (CAST(:after AS boolean) IS NOT TRUE OR $keyset)
        ORDER BY $order LIMIT :limit + 1
    ), sized AS (
        SELECT j, cursor, n, sum(octet_length(j) + 2) OVER (ORDER BY n) AS upto FROM picked
    ), kept AS (
        SELECT * FROM sized WHERE n <= :limit AND (n = 1 OR upto <= :budget)
    )
    SELECT (SELECT string_agg(j, ', ' ORDER BY n) FROM kept) AS rows,
           CASE WHEN (SELECT count(*) FROM picked) > (SELECT count(*) FROM kept)
                THEN (SELECT cursor FROM kept ORDER BY n DESC LIMIT 1) END AS next"""

RUNS_NEWEST = Statement("RUNS_NEWEST", """
    A page of runs (ledger.runs without a time window), newest first, filtered by status,
    cleanup status and shard; after the cursor (:k, created_at in microseconds; :id) when
    :after; at most :limit runs and :budget bytes; next is the last run's cursor when more are
    left.""", compose(_RUNS_PAGE, run=run_json("r"), key="(extract(epoch FROM r.created_at) * 1000000)::bigint",
                      order="r.created_at DESC, r.run_id",
                      keyset="(r.created_at < 'epoch'::timestamptz + CAST(:k AS bigint) * interval '1 microsecond' "
                             "OR (r.created_at = 'epoch'::timestamptz + CAST(:k AS bigint) * interval '1 microsecond' "
                             "AND r.run_id > :id))"))

RUNS_BY_SCHEDULE = Statement("RUNS_BY_SCHEDULE", """
    A page of runs whose schedule meets [:from, :before) (a calendar), by startsAt, filtered as
    RUNS_NEWEST; after the cursor (:k, startsAt; :id) when :after.""", compose(
    _RUNS_PAGE, run=run_json("r"), key="r.starts_at", order="r.starts_at, r.run_id",
    keyset="(r.starts_at > CAST(:k AS bigint) OR (r.starts_at = CAST(:k AS bigint) AND r.run_id > :id))"))

LIVE_PAGE = Statement("LIVE_PAGE", """
    A page of the module's live rows (status in :live) above :after, oldest first (paged_rows):
    the reply's head (status :ok, next) and the rows as JSON text.""", compose("""
    WITH candidates AS (
        SELECT s.id, $resource::text AS j FROM resources s
        WHERE s.module = :module AND s.status = ANY(:live) AND s.id > :after
        ORDER BY s.id LIMIT :candidates
    ), $paged
    SELECT json_build_object('status', CAST(:ok AS integer), 'next', $next)::text AS head, $rows AS rows""",
                                                        resource=resource_json("s"), paged=paged_rows("candidates"),
                                                        next=PAGE_NEXT, rows=PAGE_ROWS))

LIVE_MODULES = Statement("LIVE_MODULES", """
    The whole reply (status :ok) naming every module that owns a live row (status in :live), by
    name, at most :limit.""", """
    SELECT json_build_object('status', CAST(:ok AS integer),
                             'modules', COALESCE(json_agg(module ORDER BY module), '[]'::json))::text AS reply
    FROM (SELECT DISTINCT s.module FROM resources s WHERE s.status = ANY(:live)
          ORDER BY s.module LIMIT :limit) picked""")

LEASES_OVERDUE = Statement("LEASES_OVERDUE", """
    Rows still held after their lease deadline, most overdue first (ix_resources_status_lease):
    how many, and at most :limit of them within :budget bytes as JSON text.""", compose("""
    WITH overdue AS (
        SELECT s.id, s.lease_deadline, $resource::text AS j,
               row_number() OVER (ORDER BY s.lease_deadline, s.id) AS n
        FROM resources s WHERE $deadline_passed
        ORDER BY s.lease_deadline, s.id LIMIT :limit
    ), sized AS (
        SELECT j, n, sum(octet_length(j) + 2) OVER (ORDER BY n) AS upto FROM overdue
    )
    SELECT (SELECT count(*) FROM resources s WHERE $deadline_passed) AS count,
           (SELECT string_agg(j, ', ' ORDER BY n) FROM sized WHERE n = 1 OR upto <= :budget) AS rows""",
                                                                    resource=resource_json("s"),
                                                                    deadline_passed=deadline_passed("s")))
