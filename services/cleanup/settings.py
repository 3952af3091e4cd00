"""The cleanup service's settings (environment variables with the ``SHARDBUS_`` prefix)."""

from __future__ import annotations

from pydantic import Field, model_validator

from shared.contracts import ledger as c
from shared.settings import CommonSettings


class CleanupSettings(CommonSettings):
    """How often and how hard the sweep works."""

    sweep_period_s: float = Field(default=30.0, gt=0, description="Seconds between periodic sweeps.")
    reconcile_period_s: float = Field(
        default=300.0, gt=0, description="Seconds between periodic reconciles of the ledger against the shard."
    )
    max_attempts: int = Field(
        default=3, ge=1, description="Give-back attempts per resource before its run's cleanup is incomplete."
    )
    sweep_batch_size: int = Field(
        default=200, ge=1, le=1000, description="Resources one claim takes from a run (the sweep's bounded batch)."
    )
    sweep_runs_per_batch: int = Field(
        default=100, ge=1, le=1000, description="Runs one sweep asks the ledger for at a time."
    )
    sweep_runs_in_flight: int = Field(
        default=8, ge=1, description="Runs one cleanup process gives back at the same time."
    )
    give_back_concurrency: int = Field(
        default=32, ge=1, description="Give-back commands one cleanup process has in flight at once."
    )
    claim_timeout_s: float = Field(
        default=120.0, gt=0,
        description="After this long a `reverting` row (its sweeper crashed) may be claimed again. "
        "Must exceed the command timeout.",
    )
    command_timeout_s: float = Field(
        default=15.0, gt=0, description="How long a give-back or reconcile command to the shard or a module may take."
    )
    away_backoff_s: float = Field(
        default=2.0, ge=0.01, le=86_400,
        description="Seconds a row waits after a give-back met no shard or module (no responders, no answer in "
        "time; no attempt spent), doubled each time in a row, up to the cap.",
    )
    away_backoff_max_s: float = Field(
        default=60.0, ge=0.01, le=86_400,
        description="The longest a row waits after give-backs in a row met no shard or module (the back-off's cap).",
    )
    away_alert_s: float = Field(
        default=c.AWAY_ALERT_S, ge=0, le=c.WAITING_LONGER_THAN_MAX_S,
        description="A run waiting this long for its shard or module (its give-backs meet nobody; it stays "
        "pending) is counted in shardbus_cleanup_runs_waiting_too_long and logged once: it wants a person.",
    )
    ledger_timeout_s: float = Field(default=10.0, gt=0, description="How long a request to the ledger may take.")
    reconcile_modules: str = Field(
        default="",
        description="Modules every reconcile checks besides those owning a live row (which are always checked), "
        "comma-separated.",
    )

    @model_validator(mode="after")
    def _claim_outlives_command(self) -> CleanupSettings:
        # A row reclaimed while its command is still in flight would only be answered
        # "busy" (same idempotency key), but it would waste an attempt: refuse the setup.
        if self.claim_timeout_s <= self.command_timeout_s:
            raise ValueError(
                f"claim_timeout_s ({self.claim_timeout_s}) must be longer than command_timeout_s "
                f"({self.command_timeout_s}), or a slow give-back is claimed again while in flight"
            )
        return self

    @model_validator(mode="after")
    def _cap_not_below_base(self) -> CleanupSettings:
        if self.away_backoff_max_s < self.away_backoff_s:
            raise ValueError(
                f"away_backoff_max_s ({self.away_backoff_max_s}) must not be less than away_backoff_s "
                f"({self.away_backoff_s})"
            )
        return self

    def modules_to_reconcile(self) -> list[str]:
        """The configured modules as a list (a reconcile adds every module owning a live row)."""
        return [name.strip() for name in self.reconcile_modules.split(",") if name.strip()]
