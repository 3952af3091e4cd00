"""Logging is one JSON object per line and never prints a secret."""

from __future__ import annotations

import json
import logging

from shared import logs


def _format(record_msg: str, **extra) -> dict:
    formatter = logs.JsonLineFormatter("test")
    record = logging.LogRecord("t", logging.INFO, __file__, 1, record_msg, (), None)
    for key, value in extra.items():
        setattr(record, key, value)
    line = formatter.format(record)
    assert "\n" not in line
    return json.loads(line)


def test_a_registered_secret_is_masked_wherever_it_appears():
    logs.register_secret("s3cr3t-value-xyz")
    entry = _format("hello with s3cr3t-value-xyz inside", detail="also s3cr3t-value-xyz here")
    assert "s3cr3t-value-xyz" not in json.dumps(entry)
    assert entry["msg"] == "hello with *** inside"


def test_a_password_in_a_url_is_masked():
    entry = _format("connecting", url="postgresql+asyncpg://ledger:hunter22@db:5432/shardbus")
    assert entry["url"] == "postgresql+asyncpg://ledger:***@db:5432/shardbus"


def test_a_field_named_like_a_secret_is_masked_whatever_its_value():
    entry = _format("hello", token="anything", shard="uo1")
    assert entry["token"] == "***" and entry["shard"] == "uo1"


def test_each_line_names_its_service_level_and_message():
    entry = _format("started")
    assert (entry["service"], entry["level"], entry["msg"]) == ("test", "info", "started")


def test_a_service_start_logs_no_terminal_hint_and_no_alembic_plugin_lines(capsys):
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        logs.configure("test", "INFO")
        logging.getLogger("shardbus.test.faststream").info("FastStream app started successfully! To exit, press CTRL+C")
        logging.getLogger("alembic.runtime.plugins").info("setup plugin alembic.autogenerate.schemas")
        lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    finally:
        root.handlers[:], root.level = saved
        logging.getLogger("alembic").setLevel(logging.NOTSET)
    assert [e["msg"] for e in lines] == ["FastStream app started successfully!"]
