"""Reads: the run console (the run, a page of its resources, counts by status, unresolved),
a page of the run's log, runs by status and cleanup status, a page of a module's live rows, and
the modules owning live rows. PostgreSQL renders the whole answer as JSON in one query, so a console of 1,000 rows costs
one round trip and no per-row Python. A run console's page is rendered once per change of its
run: this process keeps it and serves it again while the database finds its run unchanged
(``console_cache.py``: a 0.28 ms check where the render is 7.6 ms at 1,000 rows).

Replies that list rows are pages: at most ``limit`` rows and at most :data:`PAGE_BYTES` of them,
in id order, so that no reply outgrows a NATS message whatever the rows hold. A page that left
rows out says where to go on: ``next`` is the last id it holds, to be sent back as ``after``
(``next`` is null on the last page). A page always holds at least one row when one is left, and
one row always fits (``queries/fragments.py``: REVERT_INLINE_MAX)."""

from __future__ import annotations

import json
from http import HTTPStatus

from services.ledger import statuses
from services.ledger.console_cache import Key, Mark, Page, cache_of
from services.ledger.database.queries.console import (
    CONSOLE_MARK,
    CONSOLE_PAGE,
    DETAIL_INLINE_MAX,
    LEASES_OVERDUE,
    LIVE_MODULES,
    LIVE_PAGE,
    LOG_PAGE,
    RUNS_BY_SCHEDULE,
    RUNS_NEWEST,
)
from services.ledger.database.queries.fragments import REVERT_INLINE_MAX
from services.ledger.database.store import Database, NotFound, one, read_first, read_one
from shared.contracts.ledger import RUNS_CURSOR, ListRuns

__all__ = ["DETAIL_INLINE_MAX", "PAGE_BYTES", "REVERT_INLINE_MAX", "console", "leases_overdue", "list_runs", "live",
           "live_modules", "page_bytes", "run_log"]

PAGE_BYTES = 768 * 1024
"""The most bytes of rows one reply carries (console, live rows, a claim, runs). NATS's
max_payload is 1 MiB by default (headers and body together); the rest is room for the
reply's other fields (at most a few kilobytes) and its headers."""

OK = HTTPStatus.OK
"""The status every page carries (PostgreSQL renders it into the reply)."""


def page_bytes(max_payload: int | None) -> int:
    """The page budget under a NATS server whose max_payload (from its INFO) is
    ``max_payload``: :data:`PAGE_BYTES`, or three quarters of a smaller max_payload."""
    return min(PAGE_BYTES, max_payload * 3 // 4) if max_payload else PAGE_BYTES


PAGE_ROWS_MAX = 3000
"""The most rows one page renders to measure: no more can fit in :data:`PAGE_BYTES` (a row
renders to at least 280 bytes), so a larger ``limit`` renders nothing it could send."""


def _with_rows(head: str, key: str, rows: str | None) -> bytes:
    """The reply ``head`` (a JSON object's text) with ``key`` holding the rows' array."""
    return f'{head[:-1]}, "{key}" : [{rows or ""}]}}'.encode()


async def console(db: Database, run_id: str, after: int | None = None, limit: int = 1000,
                  budget: int = PAGE_BYTES) -> bytes:
    """A page of the run console as the reply's JSON bytes (``status`` 200 included), or
    NotFound: the run, its resources with an id above ``after`` (at most ``limit``, at most
    :data:`PAGE_BYTES`), ``next``, and the counts and unresolved of the whole run.

    The page this process rendered last for the same request is served again when the
    database finds what it was rendered from unchanged (``console_cache.py``): the same bytes
    a render would give now."""
    paging = _page(after, limit, budget)
    key: Key = (run_id, paging["after"], paging["limit"], budget)
    cache = cache_of(db)
    async with db.connect() as conn:
        kept = cache.get(key)
        if kept is not None:
            current = kept.mark.current(await one(conn, CONSOLE_MARK, {"run_id": run_id}))
            cache.served(current)
            if current:
                return kept.reply
        row = await read_first(conn, CONSOLE_PAGE,
                               {"run_id": run_id, "statuses": list(statuses.RESOURCE_STATUSES),
                                "unresolved": list(statuses.UNRESOLVED), "ok": OK, **paging})
    if row is None:
        cache.drop(key)
        raise NotFound(f"no run {run_id!r}")
    reply = _with_rows(row["head"], "resources", row["rows"])
    cache.put(key, Page(reply, Mark.of(row)))
    return reply


async def run_log(db: Database, run_id: str, after: int | None = None, limit: int = 1000,
                  budget: int = PAGE_BYTES) -> bytes:
    """A page of the run's log as the reply's JSON bytes (``status`` 200 included), or NotFound:
    the entries with an id above ``after``, oldest first (at most ``limit``, at most
    :data:`PAGE_BYTES`), and ``next``."""
    async with db.connect() as conn:
        row = await read_first(conn, LOG_PAGE, {"run_id": run_id, "ok": OK, **_page(after, limit, budget)})
    if row is None:
        raise NotFound(f"no run {run_id!r}")
    return _with_rows(row["head"], "entries", row["rows"])


async def list_runs(db: Database, query: ListRuns, budget: int = PAGE_BYTES) -> bytes:
    """A page of runs as the reply's JSON bytes: filtered by status, cleanup status, shard and
    a time window (runs whose schedule overlaps ``[startsFrom, startsBefore)``, ordered by
    ``startsAt``; without a window, newest first). At most ``limit`` runs and
    :data:`PAGE_BYTES`; ``next`` (a cursor, sent back as ``after``) when more are left."""
    statement = RUNS_BY_SCHEDULE if query.by_schedule else RUNS_NEWEST
    cursor = RUNS_CURSOR.fullmatch(query.after) if query.after else None
    async with db.connect() as conn:
        row = await read_one(conn, statement,
                             {"status": query.status, "cleanup": query.cleanup_status, "shard": query.shard,
                              "from": query.starts_from, "before": query.starts_before,
                              "after": cursor is not None, "k": int(cursor.group(1)) if cursor else 0,
                              "id": cursor.group(2) if cursor else "", "limit": query.limit, "budget": budget})
    head = json.dumps({"status": OK, "more": row["next"] is not None, "next": row["next"]})
    return _with_rows(head, "runs", row["rows"])


async def live(db: Database, module: str, limit: int, after: int | None = None,
               budget: int = PAGE_BYTES) -> bytes:
    """A page of the module's live (pending and confirmed) rows, oldest first, as the reply's
    JSON bytes: rows with an id above ``after``, at most ``limit`` and :data:`PAGE_BYTES`, and
    ``next``."""
    async with db.connect() as conn:
        row = await read_one(conn, LIVE_PAGE,
                             {"module": module, "live": list(statuses.LIVE), "ok": OK, **_page(after, limit, budget)})
    return _with_rows(row["head"], "resources", row["rows"])


def _page(after: int | None, limit: int, budget: int) -> dict[str, int]:
    """The paging parameters of ``queries/console.py``'s ``paged_rows``."""
    limit = min(limit, PAGE_ROWS_MAX)
    return {"after": after or 0, "limit": limit, "candidates": limit + 1, "budget": budget}


async def live_modules(db: Database, limit: int) -> bytes:
    """Every module owning a live (pending or confirmed) row, by name, as the reply's JSON bytes:
    what a reconcile of every module asks (the website seed's ``modulesWithLiveRows``). At
    most 10,000 names of at most 64 ASCII characters: far below a NATS message."""
    async with db.connect() as conn:
        row = await read_one(conn, LIVE_MODULES, {"live": list(statuses.LIVE), "ok": OK, "limit": limit})
    reply: str = row["reply"]
    return reply.encode()


async def leases_overdue(db: Database, limit: int, budget: int = PAGE_BYTES) -> tuple[int, bytes]:
    """Rows still ``confirmed`` after their ``leaseDeadline`` (the shard should have let go of
    them while nobody watched), most overdue first: their count and the reply's JSON bytes (at
    most ``limit`` rows and :data:`PAGE_BYTES`). Served by ``ix_resources_status_lease``."""
    async with db.connect() as conn:
        row = await read_one(conn, LEASES_OVERDUE, {"limit": limit, "budget": budget})
    count: int = row["count"]
    head = json.dumps({"status": OK, "count": count})
    return count, _with_rows(head, "resources", row["rows"])
