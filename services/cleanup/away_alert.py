"""Runs waiting too long for their shard or module (``SHARDBUS_AWAY_ALERT_S``).

A give-back that meets nobody spends no attempt, so such a run stays ``pending`` however long
its shard (or module) is away — never ``incomplete`` (docs/adr/0006-away-is-never-incomplete.md).
What calls a person instead: after each whole sweep the ledger is asked which runs have waited
longer than the setting (``ledger.sweep.waiting {longerThanS}``); their number is the gauge
``shardbus_cleanup_runs_waiting_too_long`` (the ``RunsWaitingTooLong`` alert), and each such run
is logged once — not on every sweep. The runs already logged are remembered (at most
:data:`REMEMBERED`); one that stops waiting is forgotten, so a later outage logs it again.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from services.cleanup.ledger_client import MAX_LIMIT, LedgerClient
from services.cleanup.metrics import CleanupCounts
from shared.status_words import waiting_words

log = logging.getLogger("shardbus.cleanup.away")

REMEMBERED = 10_000
"""The most runs remembered as already logged; past it the oldest are forgotten (they may be
logged once more)."""


class AwayAlert:
    """Counts and logs (once each) the runs waiting longer than ``alert_s``."""

    def __init__(self, ledger: LedgerClient, alert_s: float, counts: CleanupCounts) -> None:
        self.ledger, self.alert_s, self.counts = ledger, alert_s, counts
        self.logged: dict[str, None] = {}
        """Runs already logged, oldest first (a dict keeps insertion order)."""

    async def check(self) -> list[str]:
        """Ask the ledger, set the gauge, log the runs not logged before; those runs' ids.
        Raises :class:`~services.cleanup.ledger_client.LedgerError` when the ledger cannot say
        (the gauge keeps its last value)."""
        reply = await self.ledger.waiting_longer_than(self.alert_s, MAX_LIMIT)
        self.counts.runs_waiting_too_long = len(reply.runs)
        listed = {run.run_id for run in reply.runs}
        if not reply.more:  # every run waiting too long is listed: the others stopped waiting
            self.logged = {run_id: None for run_id in self.logged if run_id in listed}
        now = datetime.now(UTC)
        fresh = []
        for run in reply.runs:
            if run.run_id in self.logged:
                continue
            waited = _seconds_since(run.waiting_since, now)
            log.warning(f"run {waiting_words(waited)}: start the shard or module, or give its rows back by hand",
                        extra={"runId": run.run_id, "shard": run.shard, "rows": run.rows,
                               "waitingSince": run.waiting_since, "awayAlertS": self.alert_s})
            self.logged[run.run_id] = None
            fresh.append(run.run_id)
        while len(self.logged) > REMEMBERED:
            del self.logged[next(iter(self.logged))]
        return fresh


def _seconds_since(iso: str, now: datetime) -> float:
    try:
        return max(0.0, (now - datetime.fromisoformat(iso)).total_seconds())
    except (TypeError, ValueError):
        return 0.0
