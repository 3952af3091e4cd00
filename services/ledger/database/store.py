"""What every ledger operation shares: its errors, the change record that becomes an update
event, and the helpers that run a named statement of ``queries/`` (rows come back as dicts,
read by column name; runs and resources come back as their wire JSON, rendered by PostgreSQL
so a 1,000-row console is one query).

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
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import asyncpg

from services.ledger.database.engine import normalise_url
from services.ledger.database.queries.statement import Statement
from services.ledger.database.queries.store import FORCE_CUSTOM_PLAN, RUN_BY_ID
from shared.errors import ShardbusError

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


UNAVAILABLE = "the ledger's database is unreachable; retry shortly"
"""The sentence of a 503 for a database away (no URL: it could carry a password)."""


class DatabaseUnavailable(ShardbusError):
    """The database could not be reached, or did not answer in time: the request changed
    nothing (or, if the connection broke after a commit, a retry with the same body is safe).
    The ledger answers 503 with its retry sentence; ``str()`` and ``reason`` name the cause."""

    status = HTTPStatus.SERVICE_UNAVAILABLE

    def __init__(self, cause: BaseException) -> None:
        super().__init__(UNAVAILABLE, said=type(cause).__name__)
        self.reason = type(cause).__name__


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc`` and every exception it wraps (SQLAlchemy's ``orig``, ``__cause__``), once each."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = getattr(exc, "orig", None) or exc.__cause__


def is_outage(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an exception it wraps (SQLAlchemy's ``orig``, ``__cause__``), says the
    database is away rather than that the request is wrong."""
    return any(isinstance(link, (DatabaseUnavailable, *OUTAGE_TYPES))
               or str(getattr(link, "sqlstate", "") or "").startswith(OUTAGE_SQLSTATES) for link in _chain(exc))


def is_unreachable(exc: BaseException | None) -> bool:
    """Whether ``exc`` says the database cannot be reached or does not answer at all, so that
    every statement would fail the same way right now: an outage (:func:`is_outage`) other than
    a cancelled statement (``57014``: the server answered, e.g. a statement that waited out
    ``STATEMENT_TIMEOUT_S`` on another's row lock, which the next statement may not)."""
    cancelled = any(isinstance(link, asyncpg.QueryCanceledError) or str(getattr(link, "sqlstate", "") or "") == "57014"
                    for link in _chain(exc))
    return not cancelled and is_outage(exc)


class Database:
    """The ledger's connection pool. Statements are ``queries/``'s, with ``:name`` parameters."""

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

    def pool_sizes(self) -> tuple[int, int]:
        """The pool's connections in use and idle (none before it opens)."""
        pool = self._pool
        if pool is None:
            return 0, 0
        idle = pool.get_idle_size()
        return pool.get_size() - idle, idle

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


Row = dict[str, Any]
"""A result row: its columns by name (``row["status"]``)."""


async def rows(conn: asyncpg.Connection, statement: Statement, params: Mapping[str, Any] | None = None) -> list[Row]:
    """Every row ``statement`` returns."""
    return [dict(record) for record in await conn.fetch(statement.sql, *statement.args(params))]


async def first(conn: asyncpg.Connection, statement: Statement, params: Mapping[str, Any] | None = None) -> Row | None:
    """The first row ``statement`` returns, or None."""
    record = await conn.fetchrow(statement.sql, *statement.args(params))
    return None if record is None else dict(record)


async def one(conn: asyncpg.Connection, statement: Statement, params: Mapping[str, Any] | None = None) -> Row:
    """The row of a statement that always returns one (an aggregate, a SELECT without FROM)."""
    row = await first(conn, statement, params)
    if row is None:  # pragma: no cover - the statement's shape guarantees a row
        raise RuntimeError(f"{statement.name} returned no row")
    return row


async def read_first(conn: asyncpg.Connection, statement: Statement,
                     params: Mapping[str, Any] | None = None) -> Row | None:
    """:func:`first` for the reads that page rows (console, log, runs, live): planned for the
    values given every time. asyncpg prepares each statement, and after five executions
    PostgreSQL may switch to a generic plan; for these reads that plan was 20 times slower
    (the run console of 1,000 rows in a database of 1,000,000: 7 ms custom, 165 ms generic,
    measured by bench/ledger.py). ``SET LOCAL`` keeps it to this statement's transaction."""
    async with conn.transaction():
        await conn.execute(FORCE_CUSTOM_PLAN.sql)
        return await first(conn, statement, params)


async def read_one(conn: asyncpg.Connection, statement: Statement,
                   params: Mapping[str, Any] | None = None) -> Row:
    """:func:`read_first` of a statement that always returns one row."""
    row = await read_first(conn, statement, params)
    if row is None:  # pragma: no cover - the statement's shape guarantees a row
        raise RuntimeError(f"{statement.name} returned no row")
    return row


class LedgerError(ShardbusError):
    """A request the ledger refuses; ``status`` is the reply's status, ``sentence`` its error."""

    status = HTTPStatus.INTERNAL_SERVER_ERROR


class NotFound(LedgerError):
    """The request names a run or resource that does not exist."""

    status = HTTPStatus.NOT_FOUND


class Conflict(LedgerError):
    """The request contradicts the ledger's state (a held target, a disallowed transition)."""

    status = HTTPStatus.CONFLICT


Json = dict[str, Any]
"""A run, a resource or a reply as its wire JSON."""


@dataclass(frozen=True)
class Change:
    """One committed change. Its update event is the run-log entry the statement that made
    the change wrote (``event_id`` is its id, ADR 0009); the relay publishes it."""

    type: str
    run: Json
    resource: Json | None = None
    event_id: int | None = None

    def event(self) -> Json:
        """The update event's payload, as the relay publishes it."""
        body: Json = {"eventId": self.event_id, "type": self.type, "run": self.run}
        if self.resource is not None:
            body["resource"] = self.resource
        return body


def as_json(value: Any) -> Any:
    """A JSON column's value as Python (asyncpg hands untyped JSON back as text)."""
    return json.loads(value) if isinstance(value, str) else value


def as_object(value: Any) -> Json:
    """A JSON column holding an object (a run, a resource) as Python."""
    parsed = as_json(value)
    if not isinstance(parsed, dict):  # pragma: no cover - the statements render objects
        raise TypeError(f"expected a JSON object, got {type(parsed).__name__}")
    return parsed


def resource_changes(result: list[Row]) -> list[Change]:
    """Turn ``(event_id, type, run, resource)`` rows (``queries/fragments.py``: ``resource_events``) into changes."""
    return [Change(row["type"], as_object(row["run"]), as_object(row["resource"]), row["event_id"])
            for row in result]


def run_changes(result: list[Row]) -> list[Change]:
    """Turn ``(event_id, type, run)`` rows (``queries/fragments.py``: ``run_events``) into changes."""
    return [Change(row["type"], as_object(row["run"]), None, row["event_id"]) for row in result]


def conflict(resource_id: int, status: str, action: str, allowed: tuple[str, ...]) -> Conflict:
    """The 409 of a transition the row's status does not allow."""
    return Conflict(f"resource {resource_id} is {status}; {action} needs it to be {' or '.join(allowed)}")


async def run_or_not_found(conn: asyncpg.Connection, run_id: str) -> Json:
    """The run's wire JSON, or NotFound."""
    row = await first(conn, RUN_BY_ID, {"id": run_id})
    if row is None:
        raise NotFound(f"no run {run_id!r}")
    return as_object(row["run"])
