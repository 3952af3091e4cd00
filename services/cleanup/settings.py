"""The cleanup service's settings (environment variables with the ``SHARDBUS_`` prefix)."""

from __future__ import annotations

from pydantic import Field

from shared.settings import CommonSettings


class CleanupSettings(CommonSettings):
    """How often and how hard the sweep works."""

    sweep_period_s: float = Field(default=30.0, gt=0, description="Seconds between periodic sweeps.")
