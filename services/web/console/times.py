"""Times as the console shows them: read from the services' values (ISO 8601 text or epoch
milliseconds), written in UTC, and "how long ago". Pure."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

MS_MAX = 253_402_300_799_999
"""9999-12-31 in epoch milliseconds: a larger number is not a time."""

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def parse(value: Any) -> datetime | None:
    """A time from ISO 8601 text or epoch milliseconds (UTC when no zone is given); None
    for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        if not 0 <= value <= MS_MAX:
            return None
        return datetime.fromtimestamp(value / 1000, tz=UTC)
    if isinstance(value, str) and 0 < len(value) <= 64:
        try:
            when = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            return None
        return when if when.tzinfo else when.replace(tzinfo=UTC)
    return None


def shown(when: datetime | None) -> str:
    """``2026-05-01 12:00:03 UTC`` (or an em dash)."""
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if when else "—"


def ago(seconds: float | None) -> str:
    """``12 s ago``, ``3 min ago``, ``2 h ago``, ``4 d ago``; ``in 5 min`` for the future."""
    if seconds is None:
        return ""
    future, seconds = seconds < 0, abs(seconds)
    if seconds < 90:
        text = f"{seconds:.0f} s"
    elif seconds < 90 * 60:
        text = f"{seconds / 60:.0f} min"
    elif seconds < 36 * 3600:
        text = f"{seconds / 3600:.0f} h"
    else:
        text = f"{seconds / 86400:.0f} d"
    return f"in {text}" if future else f"{text} ago"


def since(when: datetime | None, now: datetime | None = None) -> str:
    """How long ago ``when`` was (empty when unknown)."""
    if when is None:
        return ""
    now = now or datetime.now(UTC)
    return ago((now - when).total_seconds())


def form_value(text: str | None) -> datetime | None:
    """A time from a filter form (``datetime-local``, read as UTC, or ISO 8601)."""
    return parse(text.strip()) if text and text.strip() else None


def form_text(when: datetime) -> str:
    """``2026-05-01T12:00`` (seconds when there are some): a ``datetime-local`` input's value, UTC."""
    when = when.astimezone(UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S" if when.second else "%Y-%m-%dT%H:%M")


def to_ms(when: datetime) -> int | None:
    """``when`` in epoch milliseconds (what the ledger takes: ``startsFrom``, ``startsBefore``);
    None before 1970 or after 9999."""
    ms = (when - EPOCH) // timedelta(milliseconds=1)
    return ms if 0 <= ms <= MS_MAX else None


def day_start(day: date) -> datetime:
    """Midnight UTC of ``day``."""
    return datetime(day.year, day.month, day.day, tzinfo=UTC)
