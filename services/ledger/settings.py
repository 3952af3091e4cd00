"""The ledger's settings (environment variables with the ``SHARDBUS_`` prefix)."""

from __future__ import annotations

from pydantic import Field

from shared.settings import CommonSettings


class LedgerSettings(CommonSettings):
    """How the ledger uses its database."""

    migrate_on_start: bool = Field(default=True,
                                   description="Bring the database schema forward when the ledger starts.")
    db_pool_size: int = Field(default=10, ge=1, description="Database connections per ledger process.")
    ledger_concurrency: int = Field(default=32, ge=1, le=1000,
                             description="Requests one ledger process handles at once, per subject.")
    ledger_batch_max: int = Field(
        default=64, ge=1, le=1000,
        description="The most requests of one hot subject (reserve, record, confirm, fail, a give-back's "
                    "outcome) that one statement carries; 1 turns coalescing off (docs/ledger.md).")
    ledger_batches_in_flight: int = Field(
        default=1, ge=1, le=64,
        description="Statements of one hot subject a ledger process runs at once; requests arriving "
                    "meanwhile wait and go together into the next.")
    ledger_pending_max: int = Field(
        default=4096, ge=1, le=1_000_000,
        description="Requests of one hot subject a ledger process answers at once; one more is answered "
                    "503 (busy) at once rather than queued.")
    events_duplicate_window_s: float = Field(
        default=120.0, gt=0, le=86400,
        description="How long the LEDGER_EVENTS stream remembers an event id to drop a repeat "
                    "(JetStream's duplicate window); the relay's takeover check covers longer gaps.")
    lease_check_period_s: float = Field(
        default=60.0, gt=0, le=86400,
        description="How often the ledger looks for leases still confirmed after their deadline "
                    "(at start, then this often) and logs a warning when their number changes.")
