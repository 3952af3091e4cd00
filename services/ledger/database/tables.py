"""The ledger's tables (SQLModel). The schema itself is made by the Alembic migrations
(``migrations/versions``); these classes describe it for code and for autogenerate.

The database enforces what it can: allowed status values (CHECK), length bounds (varchar and
CHECK), at most one live row per target (a partial unique index) and one row per
idempotency key (a unique index) — so a race the code did not foresee still cannot break them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    SmallInteger,
    String,
    UniqueConstraint,
    Uuid,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlmodel import Field, SQLModel

from services.ledger.statuses import (
    CLEANUP_STATUSES,
    LIVE,
    NEW_RUN,
    NEW_RUN_CLEANUP,
    RESOURCE_STATUSES,
    REVERTABLE,
    RUN_STATUSES,
    sql_one_of,
)
from shared.contracts.ids import LEDGER_ID_PATTERN

# The columns' lengths are the contract's limits (what a request may carry), written once.
from shared.contracts.ledger import ERROR_MAX, IDEMPOTENCY_KEY_MAX, KIND_MAX, REF_MAX

ID_PATTERN = f"^{LEDGER_ID_PATTERN}$"
"""What a run id and a module name may look like: each becomes a NATS subject token (one
definition, in shared/contracts/ids.py, for every service and the web door)."""


def _now() -> Column[datetime]:
    return Column(DateTime(timezone=True), nullable=False, server_default=text("now()"))


class Run(SQLModel, table=True):
    """One occurrence of a scheduled world event."""

    __tablename__ = "runs"
    __table_args__ = (
        CheckConstraint(f"run_id ~ '{ID_PATTERN}'", name="ck_runs_run_id"),
        CheckConstraint(sql_one_of("status", RUN_STATUSES), name="ck_runs_status"),
        CheckConstraint(sql_one_of("cleanup_status", CLEANUP_STATUSES), name="ck_runs_cleanup_status"),
        CheckConstraint("char_length(shard) >= 1 AND char_length(event) >= 1", name="ck_runs_names"),
        CheckConstraint("starts_at IS NULL OR ends_at IS NULL OR ends_at >= starts_at", name="ck_runs_schedule"),
        Index("ix_runs_status_cleanup", "status", "cleanup_status"),
        Index("ix_runs_starts_at", "starts_at"),
        Index("ix_runs_created", text("created_at DESC"), "run_id"),
        Index("ix_runs_cleanup_created", "cleanup_status", text("created_at DESC"), "run_id"),
        Index("ix_runs_status_created", "status", text("created_at DESC"), "run_id"),
    )

    run_id: str = Field(sa_column=Column(String(64), primary_key=True))
    shard: str = Field(sa_column=Column(String(32), nullable=False))
    event: str = Field(sa_column=Column(String(128), nullable=False))
    status: str = Field(sa_column=Column(String(16), nullable=False, server_default=NEW_RUN))
    cleanup_status: str = Field(sa_column=Column(String(16), nullable=False, server_default=NEW_RUN_CLEANUP))
    created_at: datetime | None = Field(default=None, sa_column=_now())
    updated_at: datetime | None = Field(default=None, sa_column=_now())
    ended_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True)))
    starts_at: int | None = Field(default=None, sa_column=Column(BigInteger))
    """When the run is scheduled to start (ms since the epoch; optional, for calendars)."""
    ends_at: int | None = Field(default=None, sa_column=Column(BigInteger))
    """When it is scheduled to end (ms; optional, not before ``starts_at``)."""


class Resource(SQLModel, table=True):
    """One thing a run created in the world, or one value it borrowed."""

    __tablename__ = "resources"
    __table_args__ = (
        CheckConstraint(sql_one_of("status", RESOURCE_STATUSES), name="ck_resources_status"),
        CheckConstraint(f"previous_status IS NULL OR {sql_one_of('previous_status', REVERTABLE)}",
                        name="ck_resources_previous_status"),
        CheckConstraint(f"module ~ '{ID_PATTERN}'", name="ck_resources_module"),
        CheckConstraint("char_length(kind) >= 1 AND char_length(ref) >= 1", name="ck_resources_target"),
        CheckConstraint("attempts >= 0", name="ck_resources_attempts"),
        CheckConstraint("jsonb_typeof(revert) = 'object'", name="ck_resources_revert"),
        Index("uq_resources_live_target", "module", "kind", "ref", unique=True,
              postgresql_where=text(sql_one_of("status", LIVE))),
        Index("ix_resources_run_status", "run_id", "status"),
        Index("ix_resources_status_lease", "status", "lease_deadline"),
        UniqueConstraint("idempotency_key", name="uq_resources_idempotency_key"),
    )

    id: int | None = Field(default=None, sa_column=Column(BigInteger, primary_key=True, autoincrement=True))
    run_id: str = Field(sa_column=Column(String(64), ForeignKey("runs.run_id"), nullable=False))
    module: str = Field(sa_column=Column(String(64), nullable=False))
    kind: str = Field(sa_column=Column(String(KIND_MAX), nullable=False))
    ref: str = Field(sa_column=Column(String(REF_MAX), nullable=False))
    status: str = Field(sa_column=Column(String(16), nullable=False))
    previous_status: str | None = Field(default=None, sa_column=Column(String(16)))
    attempts: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default="0"))
    gave_up: bool = Field(default=False, sa_column=Column(Boolean, nullable=False, server_default=text("false")))
    lease_deadline: int | None = Field(default=None, sa_column=Column(BigInteger))
    revert: dict[str, Any] = Field(default_factory=dict,
                                   sa_column=Column(JSONB, nullable=False, server_default=text("'{}'")))
    last_error: str | None = Field(default=None, sa_column=Column(String(ERROR_MAX)))
    idempotency_key: str = Field(sa_column=Column(String(IDEMPOTENCY_KEY_MAX), nullable=False))
    claimed_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True)))
    retry_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True)))
    """A give-back that met no shard waits until then (no attempt spent)."""
    away: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default="0"))
    """Give-backs in a row that met no shard (the back-off's exponent)."""
    away_since: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True)))
    """When the first of those give-backs in a row was recorded (revision 0006): waiting since."""
    created_at: datetime | None = Field(default=None, sa_column=_now())
    updated_at: datetime | None = Field(default=None, sa_column=_now())


class RunLog(SQLModel, table=True):
    """The run log: what happened to a run and its resources, in order. Append-only and
    without foreign keys (revision 0004 says why). It is also the event source (ADR 0009): an
    entry with ``run`` is the update event of its change, ``eventId`` its id."""

    __tablename__ = "run_log"
    __table_args__ = (Index("ix_run_log_run", "run_id", "id"),)

    id: int | None = Field(default=None, sa_column=Column(BigInteger, primary_key=True, autoincrement=True))
    run_id: str = Field(sa_column=Column(String(64), nullable=False))
    resource_id: int | None = Field(default=None, sa_column=Column(BigInteger))
    kind: str = Field(sa_column=Column(String(64), nullable=False))
    detail: dict[str, Any] = Field(default_factory=dict,
                                   sa_column=Column(JSONB, nullable=False, server_default=text("'{}'")))
    at: datetime | None = Field(default=None, sa_column=_now())
    run: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    """The run as its wire JSON when the change committed (revision 0007; none: not an event)."""
    resource: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    """The resource as its wire JSON, for a resource's change."""


class Relay(SQLModel, table=True):
    """One row: how far the relay has published the run log (ADR 0009)."""

    __tablename__ = "ledger_relay"
    __table_args__ = (CheckConstraint("id = 1", name="ck_ledger_relay_one_row"),)

    id: int = Field(default=1, sa_column=Column(SmallInteger, primary_key=True, server_default="1"))
    relayed_through: int = Field(sa_column=Column(BigInteger, nullable=False))
    """Every event with an id up to this one is published, or was never committed."""
    stream_after: int | None = Field(default=None, sa_column=Column(BigInteger))
    """The stream's sequence after the last batch the relay finished: a relay taking over looks
    for the batch a dead one published after it."""


class Outbox(SQLModel, table=True):
    """Update events written before revision 0007 (or by a replica of older code during a
    rolling upgrade) and not yet published: the relay publishes and deletes them before the
    run log's events (ADR 0009)."""

    __tablename__ = "ledger_outbox"

    id: int | None = Field(default=None, sa_column=Column(BigInteger, primary_key=True, autoincrement=True))
    run_id: str = Field(sa_column=Column(String(64), nullable=False))
    type: str = Field(sa_column=Column(String(64), nullable=False))
    run: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    resource: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    claimed_after: int | None = Field(default=None, sa_column=Column(BigInteger))
    """The stream's last sequence when a relay took the event for publishing."""
    created_at: datetime | None = Field(default=None, sa_column=_now())


class Identity(SQLModel, table=True):
    """One row: this database's random id, the prefix of every event's ``Nats-Msg-Id``."""

    __tablename__ = "ledger_identity"
    __table_args__ = (CheckConstraint("id = 1", name="ck_ledger_identity_one_row"),)

    id: int = Field(default=1, sa_column=Column(SmallInteger, primary_key=True, server_default="1"))
    ledger_id: Any = Field(sa_column=Column(Uuid, nullable=False, server_default=text("gen_random_uuid()")))
