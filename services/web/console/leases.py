"""Leases past their deadline, across every run (``ledger.leases.overdue``): rows still
``confirmed`` after their ``leaseDeadline`` — leases a shard should have let go of while nobody
watched — most overdue first, with their count. Shown on the runs page (the first
:data:`ON_RUNS_PAGE`) and on ``/console/leases`` (up to :data:`LISTED`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from services.web.console import times
from services.web.console.reads import ask
from shared import subjects

ON_RUNS_PAGE = 10
"""The most overdue leases listed on the runs page."""

LISTED = 1000
"""The most listed on the leases page (``ledger.leases.overdue``'s largest ``limit``)."""


@dataclass
class Overdue:
    """How many leases are past their deadline, the most overdue of them, or why the ledger
    could not say."""

    count: int = 0
    rows: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    brief: bool = False

    @property
    def left_out(self) -> int:
        return max(0, self.count - len(self.rows))


async def overdue(request: Request, limit: int, brief: bool = False) -> Overdue:
    answer = await ask(request, subjects.LEDGER_LEASES_OVERDUE, {"limit": limit}, "ledger")
    if not answer.ok:
        return Overdue(error=answer.error, brief=brief)
    rows = [r for r in answer.reply.get("resources") or [] if isinstance(r, dict)]
    for row in rows:
        row["_deadline"] = times.parse(row.get("leaseDeadline"))
    count = answer.reply.get("count")
    count = count if isinstance(count, int) and not isinstance(count, bool) else len(rows)
    return Overdue(max(count, len(rows)), rows, brief=brief)
