"""What every ledger operation shares: its errors, the change record that becomes an update
event, the SQL that renders a run or a resource as its wire JSON (camelCase, built by
PostgreSQL so a 1,000-row console is one query), and small helpers to run SQL.

Operations run SQL on an asyncpg pool, each statement its own transaction: a transition is
one guarded statement whose WITH clause also writes the run-log entry, so the change and its
log entry commit together or not at all, with no BEGIN/COMMIT round trips. Where an
operation runs a second statement (an expiry settling a run), that statement is correct on
its own. (asyncpg rather than SQLAlchemy's async engine here: with 32 requests in flight the
engine's pool and greenlet hand-offs cost three times the statement — see docs/ledger.md.)

A database outage reaches the ledger in many shapes (docs/reliability.md, "Outages: every
shape and its answer"): a refused or reset socket, a backend terminated mid-statement, a connection
that died mid-protocol (asyncpg's InternalClientError), a server shutting down, a pool
acquire, connect or statement that ran out of time, a statement cancelled. :meth:`Database.connect`
turns every one of them into :class:`DatabaseUnavailable` (the ledger answers 503 with its
retry sentence) and throws the connection away, so a broken connection is never handed out
again. None of them leaves anything half-applied: each change is one statement.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import asyncpg

from shared.status_words import CLEANUP_COLOUR, CLEANUP_WORD, RESOURCE_COLOUR, RESOURCE_WORD, RUN_COLOUR
from shared.database import normalise_url

CONNECT_TIMEOUT_S = 3.0
"""Longest a new connection may take to open (a black-holed server otherwise holds it 60 s)."""

ACQUIRE_TIMEOUT_S = 5.0
"""Longest a request waits for a pooled connection, opening one included."""

STATEMENT_TIMEOUT_S = 5.0
"""PostgreSQL cancels a statement running longer (``statement_timeout``; it rolls back whole).
The ledger's statements take milliseconds; one this slow means the database is in trouble."""

UNRESPONSIVE_AFTER_S = 1.0
"""A server that has not answered ``STATEMENT_TIMEOUT_S`` plus this is unresponsive (stopped,
partitioned): the client gives up on the statement itself."""

OUTAGE_SQLSTATES = ("08", "57P01", "57P02", "57P03", "53300", "3D000", "57014")
"""SQLSTATEs (and classes) meaning the database cannot be reached or used right now: connection
exceptions, admin/crash shutdown, cannot connect now, too many connections, no such database
(not created yet), and query_canceled (a statement timeout or a cancel request)."""

OUTAGE_TYPES: tuple[type[BaseException], ...] = (
    OSError,  # refused, reset, "unexpected connection_lost()", DNS; TimeoutError is one (3.11)
    asyncio.TimeoutError,  # pool acquire, connect and statement timeouts
    asyncpg.InterfaceError,  # e.g. "connection is closed", "pool is closing"
    asyncpg.InternalClientError,  # a connection that died mid-protocol
    asyncpg.PostgresConnectionError,  # ConnectionDoesNotExistError, ConnectionFailureError …
)
"""Exception types that say the database is away, whatever their message."""


class DatabaseUnavailable(Exception):
    """The database could not be reached, or did not answer in time: the request changed
    nothing (or, if the connection broke after a commit, a retry with the same body is safe).
    The ledger answers 503 with its retry sentence."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(type(cause).__name__)
        self.reason = type(cause).__name__


def is_outage(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an exception it wraps (SQLAlchemy's ``orig``, ``__cause__``), says the
    database is away rather than that the request is wrong."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (DatabaseUnavailable, *OUTAGE_TYPES)):
            return True
        if str(getattr(exc, "sqlstate", "") or "").startswith(OUTAGE_SQLSTATES):
            return True
        exc = getattr(exc, "orig", None) or exc.__cause__
    return False


class Database:
    """The ledger's connection pool. Statements are written with ``:name`` parameters."""

    def __init__(self, url: str, pool_size: int = 10, *, connect_timeout_s: float | None = None,
                 acquire_timeout_s: float | None = None, statement_timeout_s: float | None = None) -> None:
        self.url = normalise_url(url).replace("postgresql+asyncpg://", "postgresql://", 1)
        self.pool_size = pool_size
        self.connect_timeout_s = connect_timeout_s or CONNECT_TIMEOUT_S
        self.acquire_timeout_s = acquire_timeout_s or ACQUIRE_TIMEOUT_S
        self.statement_timeout_s = statement_timeout_s or STATEMENT_TIMEOUT_S
        self._pool: asyncpg.Pool | None = None

    async def open(self) -> None:
        """Create the pool; it connects on first use, so an unreachable database is a 503
        per request, not a service that cannot start."""
        self._pool = await asyncpg.create_pool(
            self.url, min_size=0, max_size=self.pool_size, max_inactive_connection_lifetime=300,
            reset=_keep_session, timeout=self.connect_timeout_s,
            command_timeout=self.statement_timeout_s + UNRESPONSIVE_AFTER_S,
            server_settings={"statement_timeout": str(round(self.statement_timeout_s * 1000))})

    async def close(self) -> None:
        """Close every connection."""
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[asyncpg.Connection]:
        """``async with db.connect() as conn``: a pooled connection. An outage, whether met
        while acquiring it or inside the block, raises :class:`DatabaseUnavailable`; the
        connection it broke is terminated rather than returned for reuse (a connection whose
        server died mid-protocol keeps failing until its socket's end is read)."""
        if self._pool is None:
            raise RuntimeError("Database.open() was not awaited")
        try:
            conn = await self._pool.acquire(timeout=self.acquire_timeout_s)
        except Exception as exc:
            if is_outage(exc):
                raise DatabaseUnavailable(exc) from exc
            raise
        try:
            yield conn
        except Exception as exc:
            if not is_outage(exc):
                raise
            conn.terminate()
            if isinstance(exc, DatabaseUnavailable):
                raise
            raise DatabaseUnavailable(exc) from exc
        finally:
            try:
                await self._pool.release(conn)
            except Exception as exc:  # the pool terminated it; the request's outcome stands
                if not is_outage(exc):
                    raise


async def _keep_session(_conn: asyncpg.Connection) -> None:
    # asyncpg resets a returned connection (RESET ALL, UNLISTEN …): a round trip per request.
    # The ledger never changes session state, listens or takes session locks, so skip it.
    return None


class Row(dict):
    """A result row whose columns read as attributes (``row.status``)."""

    __getattr__ = dict.__getitem__


@lru_cache(maxsize=256)
def _statement(sql: str) -> tuple[str, tuple[str, ...]]:
    # ``:name`` → ``$n`` once per statement text (``::type`` casts are left alone).
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return _PARAM.sub(number, sql), tuple(names)


_PARAM = re.compile(r"(?<![:\w]):(\w+)")


async def rows(conn: asyncpg.Connection, sql: str, params: Mapping[str, Any] | None = None) -> list[Row]:
    """Every row ``sql`` returns."""
    statement, names = _statement(sql)
    return [Row(record) for record in await conn.fetch(statement, *((params or {})[n] for n in names))]


async def first(conn: asyncpg.Connection, sql: str, params: Mapping[str, Any] | None = None) -> Row | None:
    """The first row ``sql`` returns, or None."""
    statement, names = _statement(sql)
    record = await conn.fetchrow(statement, *((params or {})[n] for n in names))
    return None if record is None else Row(record)


async def read_first(conn: asyncpg.Connection, sql: str, params: Mapping[str, Any] | None = None) -> Row | None:
    """:func:`first` for the reads that page rows (console, log, runs, live): planned for the
    values given every time. asyncpg prepares each statement, and after five executions
    PostgreSQL may switch to a generic plan; for these reads that plan was 20 times slower
    (the run console of 1,000 rows in a database of 1,000,000: 7 ms custom, 165 ms generic,
    measured by bench/ledger.py). ``SET LOCAL`` keeps it to this statement's transaction."""
    async with conn.transaction():
        await conn.execute("SET LOCAL plan_cache_mode = force_custom_plan")
        return await first(conn, sql, params)


class LedgerError(Exception):
    """A request the ledger refuses; ``status`` is the reply's status."""

    status = 500


class NotFound(LedgerError):
    """The request names a run or resource that does not exist."""

    status = 404


class Conflict(LedgerError):
    """The request contradicts the ledger's state (a held target, a disallowed transition)."""

    status = 409


@dataclass(frozen=True)
class Change:
    """One committed change. Its update event was written to the outbox by the statement
    that made the change (``event_id`` is the outbox row); the relay publishes it."""

    type: str
    run: dict[str, Any]
    resource: dict[str, Any] | None = None
    event_id: int | None = None

    def event(self) -> dict[str, Any]:
        """The update event's payload, as the relay publishes it."""
        body: dict[str, Any] = {"eventId": self.event_id, "type": self.type, "run": self.run}
        if self.resource is not None:
            body["resource"] = self.resource
        return body


def run_json(alias: str) -> str:
    """SQL rendering the run row ``alias`` as its wire JSON."""
    a = alias
    return (f"json_build_object('runId', {a}.run_id, 'shard', {a}.shard, 'event', {a}.event, "
            f"'status', {a}.status, 'colour', {_by_status(a, RUN_COLOUR)}, "
            f"'cleanupStatus', {a}.cleanup_status, "
            f"'cleanupWord', {_by_status(a, CLEANUP_WORD, 'cleanup_status')}, "
            f"'cleanupColour', {_by_status(a, CLEANUP_COLOUR, 'cleanup_status')}, 'createdAt', {a}.created_at, "
            f"'updatedAt', {a}.updated_at, 'endedAt', {a}.ended_at, "
            f"'startsAt', {a}.starts_at, 'endsAt', {a}.ends_at)")


def _by_status(alias: str, table: dict[str, str], column: str = "status") -> str:
    """SQL: ``table[alias.column]`` (a CASE over constants from statuses.py, no parameters)."""
    arms = " ".join(f"WHEN '{status}' THEN '{text}'" for status, text in table.items())
    return f"CASE {alias}.{column} {arms} END"


NOW_MS = "(extract(epoch FROM now()) * 1000)::bigint"
"""SQL: the statement's time in epoch milliseconds (how lease deadlines are given)."""


def deadline_passed(alias: str) -> str:
    """SQL: the row ``alias`` is still ``confirmed`` after its ``leaseDeadline`` — a lease the
    shard should have let go of (the console flags it; ``ledger.leases.overdue`` lists them)."""
    return f"({alias}.status = 'confirmed' AND {alias}.lease_deadline < {NOW_MS})"


def resource_json(alias: str) -> str:
    """SQL rendering the resource row ``alias`` as its wire JSON (with the console's word and
    colour for its status, shared/status_words.py)."""
    a = alias
    return (f"json_build_object('resourceId', {a}.id, 'runId', {a}.run_id, 'module', {a}.module, "
            f"'kind', {a}.kind, 'ref', {a}.ref, 'status', {a}.status, "
            f"'word', {_by_status(a, RESOURCE_WORD)}, 'colour', {_by_status(a, RESOURCE_COLOUR)}, "
            f"'attempts', {a}.attempts, 'away', {a}.away, 'retryAt', {a}.retry_at, "
            f"'gaveUp', {a}.gave_up, 'leaseDeadline', {a}.lease_deadline, "
            f"'leaseDeadlinePassed', COALESCE({deadline_passed(a)}, false), 'revert', {a}.revert, "
            f"'idempotencyKey', {a}.idempotency_key, 'lastError', {a}.last_error, "
            f"'createdAt', {a}.created_at, 'updatedAt', {a}.updated_at)")


def run_events(source: str, type_sql: str) -> str:
    """SQL: a CTE ``events`` writing one outbox event of type ``type_sql`` (SQL) for each run
    row of the CTE ``source``, then the SELECT of ``(event_id, type, run)`` every run-changing
    statement ends with. The change and its event commit together (the transactional outbox)."""
    return (f"events AS (INSERT INTO ledger_outbox (run_id, type, run) "
            f"SELECT c.run_id, {type_sql}, {run_json('c')} FROM {source} c "
            f"RETURNING id, type, run::text AS run) "
            f"SELECT id AS event_id, type, run FROM events ORDER BY id")


def as_json(value: Any) -> Any:
    """A JSON column's value as Python (asyncpg hands untyped JSON back as text)."""
    return json.loads(value) if isinstance(value, str) else value


def resource_changes(result: list[Any]) -> list[Change]:
    """Turn ``(event_id, type, run, resource)`` rows (``resources.resource_events``) into changes."""
    return [Change(row.type, as_json(row.run), as_json(row.resource), row.event_id) for row in result]


def run_changes(result: list[Any]) -> list[Change]:
    """Turn ``(event_id, type, run)`` rows (:func:`run_events`) into changes."""
    return [Change(row.type, as_json(row.run), None, row.event_id) for row in result]


async def resource_or_conflict(conn: asyncpg.Connection, resource_id: int, action: str,
                               allowed: tuple[str, ...]) -> LedgerError:
    """Why a guarded resource transition changed nothing: the row is missing, or in a status
    the transition does not start from."""
    row = await first(conn, "SELECT status FROM resources WHERE id = :id", {"id": resource_id})
    if row is None:
        return NotFound(f"no resource {resource_id}")
    return conflict(resource_id, row.status, action, allowed)


def conflict(resource_id: int, status: str, action: str, allowed: tuple[str, ...]) -> Conflict:
    """The 409 of a transition the row's status does not allow."""
    return Conflict(f"resource {resource_id} is {status}; {action} needs it to be {' or '.join(allowed)}")


async def run_or_not_found(conn: asyncpg.Connection, run_id: str) -> dict[str, Any]:
    """The run's wire JSON, or NotFound."""
    row = await first(conn, f"SELECT {run_json('r')}::text AS run FROM runs r WHERE run_id = :id", {"id": run_id})
    if row is None:
        raise NotFound(f"no run {run_id!r}")
    return as_json(row.run)
