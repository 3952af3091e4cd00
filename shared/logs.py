"""Structured one-line logging (one JSON object per line) that never prints a secret.

Secrets are kept out three ways: values registered with :func:`register_secret` are masked
wherever they appear; passwords inside URLs are masked; and extra fields whose name says
they hold a secret (``token``, ``password``, ``secret``) are masked whatever their value.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Any

MASK = "***"
"""What a secret is replaced with."""

_SECRET_FIELD = re.compile(r"token|password|passwd|secret", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^:/@\s]*:)[^@/\s]+@", re.IGNORECASE)
_secrets: set[str] = set()
# Attributes every LogRecord has; anything else was passed with ``extra=``.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def register_secret(value: str | None) -> None:
    """Mask ``value`` in every log line from now on (ignores empty and very short values)."""
    if value and len(value) >= 4:
        _secrets.add(value)


def redact(text: str) -> str:
    """``text`` with URL passwords and every registered secret masked."""
    text = _URL_PASSWORD.sub(lambda m: f"{m.group('head')}{MASK}@", text)
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


class JsonLineFormatter(logging.Formatter):
    """Formats a record as one JSON line: time, level, service, logger, message, extras."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key in _STANDARD or key.startswith("_"):
                continue
            entry[key] = MASK if _SECRET_FIELD.search(key) else value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return redact(json.dumps(entry, default=str, ensure_ascii=False))


def configure(service: str, level: str = "INFO") -> None:
    """Send every log record of this process to stderr as JSON lines, tagged ``service``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLineFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # FastStream's own default logger prints coloured text; route it through ours.
    import faststream  # noqa: F401  (creates that logger, which we then take over)

    for name in ("faststream", "nats"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    # One line per thing that happened: Alembic's "setup plugin …" lines (7 per ledger start)
    # say nothing the ledger's own "schema ready" does not, and a service has no terminal.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    handler.addFilter(_no_terminal_hint)


def _no_terminal_hint(record: logging.LogRecord) -> bool:
    """FastStream's start line, without "To exit, press CTRL+C": a service runs under a
    supervisor or ``shardbus up``, whose own way to stop is documented."""
    if isinstance(record.msg, str) and record.msg.endswith(" To exit, press CTRL+C"):
        record.msg = record.msg[: -len(" To exit, press CTRL+C")]
    return True
