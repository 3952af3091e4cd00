"""The cleanup service's settings: defaults SPEC names, and a setup that cannot work is refused."""

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
    with pytest.raises(ValidationError, match="claim_timeout_s .* must be longer than command_timeout_s"):
        CleanupSettings(claim_timeout_s=5, command_timeout_s=5)
