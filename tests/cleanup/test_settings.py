"""The cleanup service's settings: the defaults docs/cleanup.md, "Settings", names, and a setup that cannot work
is refused."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.cleanup.settings import CleanupSettings


def test_three_attempts_by_default_and_every_bound_is_configurable(monkeypatch):
    assert CleanupSettings().max_attempts == 3
    monkeypatch.setenv("SHARDBUS_MAX_ATTEMPTS", "5")
    monkeypatch.setenv("SHARDBUS_SWEEP_BATCH_SIZE", "7")
    monkeypatch.setenv("SHARDBUS_CLAIM_TIMEOUT_S", "40")
    monkeypatch.setenv("SHARDBUS_COMMAND_TIMEOUT_S", "4")
    monkeypatch.setenv("SHARDBUS_RECONCILE_MODULES", "arena, siege")
    settings = CleanupSettings()
    assert (settings.max_attempts, settings.sweep_batch_size, settings.claim_timeout_s,
            settings.command_timeout_s) == (5, 7, 40, 4)
    assert settings.modules_to_reconcile() == ["arena", "siege"]


def test_a_claim_timeout_not_longer_than_the_command_timeout_is_refused():
    with pytest.raises(ValidationError, match=r"claim_timeout_s .* must be longer than command_timeout_s"):
        CleanupSettings(claim_timeout_s=5, command_timeout_s=5)


def test_the_away_back_off_defaults_to_2_s_doubling_up_to_60_s_and_is_configurable(monkeypatch):
    settings = CleanupSettings()
    assert (settings.away_backoff_s, settings.away_backoff_max_s) == (2.0, 60.0)
    monkeypatch.setenv("SHARDBUS_AWAY_BACKOFF_S", "0.5")
    monkeypatch.setenv("SHARDBUS_AWAY_BACKOFF_MAX_S", "30")
    settings = CleanupSettings()
    assert (settings.away_backoff_s, settings.away_backoff_max_s) == (0.5, 30.0)


@pytest.mark.parametrize("values", [{"away_backoff_s": 0}, {"away_backoff_max_s": 100_000},
                                    {"away_backoff_s": 10, "away_backoff_max_s": 5}])
def test_an_away_back_off_the_ledger_would_refuse_is_refused_at_start(values):
    with pytest.raises(ValidationError, match="away_backoff"):
        CleanupSettings(**values)
