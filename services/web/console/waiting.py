"""Runs waiting for their shard or module (``ledger.sweep.waiting``), as the console flags them.

A run whose give-backs meet nobody stays ``pending`` (no attempt is spent; docs/cleanup.md, "The
back-off"). Once it has waited longer than ``SHARDBUS_AWAY_ALERT_S`` it wants a person: the runs
list and the run page say so in words ("waiting 1 h 5 min for its shard") with the colour of
wanting a person (amber), and the run page offers "Retry cleanup", which tries it now."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fastapi import Request

from services.web.console import times
from services.web.console.reads import ask
from shared import subjects
from shared.contracts.ledger import PAGE_LIMIT_MAX
from shared.status_words import WAITING_COLOUR, waited, waiting_words


@dataclass(frozen=True)
class Waiting:
    """One run's wait: how long, and whether longer than the alert setting."""

    seconds: float
    too_long: bool

    @property
    def words(self) -> str:
        return waiting_words(self.seconds) if self.too_long else f"waiting {waited(self.seconds)} for its shard"

    @property
    def colour(self) -> str:
        return WAITING_COLOUR if self.too_long else "grey"


def _alert_s(request: Request) -> float:
    return float(request.app.state.settings.away_alert_s)


def _waits(runs: Any, alert_s: float) -> dict[str, Waiting]:
    now = datetime.now(UTC)
    found: dict[str, Waiting] = {}
    for run in runs if isinstance(runs, list) else []:
        since = times.parse(run.get("waitingSince")) if isinstance(run, dict) else None
        if since is not None and isinstance(run.get("runId"), str):
            seconds = max(0.0, (now - since).total_seconds())
            found[run["runId"]] = Waiting(seconds, seconds > alert_s)
    return found


async def too_long(request: Request) -> dict[str, Waiting]:
    """The runs waiting longer than the alert setting (at most a page, 1,000); none when the
    ledger cannot say (the list is shown without the flags)."""
    alert_s = _alert_s(request)
    answer = await ask(request, subjects.LEDGER_SWEEP_WAITING, {"limit": PAGE_LIMIT_MAX, "longerThanS": alert_s},
                       "ledger")
    return _waits(answer.reply.get("runs"), alert_s) if answer.ok else {}


async def of_run(request: Request, run_id: str) -> Waiting | None:
    """The run's wait, or None when it is not waiting (or the ledger cannot say)."""
    answer = await ask(request, subjects.LEDGER_SWEEP_WAITING, {"limit": 1, "runId": run_id}, "ledger")
    return _waits(answer.reply.get("runs"), _alert_s(request)).get(run_id) if answer.ok else None
