"""Settings come from SHARDBUS_ environment variables and say clearly what is wrong."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shared.settings import CommonSettings


def test_settings_are_read_from_prefixed_environment_variables(monkeypatch):
    monkeypatch.setenv("SHARDBUS_NATS_URL", "nats://a:4222, nats://b:4222")
    monkeypatch.setenv("SHARDBUS_LOG_LEVEL", "debug")
    settings = CommonSettings()
    assert settings.nats_servers() == ["nats://a:4222", "nats://b:4222"]
    assert settings.log_level == "DEBUG"


def test_an_unknown_log_level_is_refused_naming_the_setting(monkeypatch):
    monkeypatch.setenv("SHARDBUS_LOG_LEVEL", "loud")
    with pytest.raises(ValidationError, match="log_level"):
        CommonSettings()
