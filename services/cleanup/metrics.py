"""The cleanup service's series (docs/operations.md, "Metrics"), ``shardbus_cleanup_…``: counted by
the sweeper in plain numbers (:class:`CleanupCounts`), read at scrape time by :func:`collector`."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from shared.contracts import ledger_statuses
from shared.metrics import PREFIX, Buckets, histogram

NAME = f"{PREFIX}cleanup_"

VERDICTS = ledger_statuses.VERDICTS
"""The ``verdict`` label: the give-back's verdicts as the ledger names them."""

FINISHED = ("complete", "incomplete")
"""The ``status`` label of ``runs_finished_total``: a run's cleanup status once it is settled."""


class CleanupCounts:
    """What the sweeper counted since the service started."""

    def __init__(self) -> None:
        self.give_backs = dict.fromkeys(VERDICTS, 0)
        self.finished = dict.fromkeys(FINISHED, 0)
        self.runs_waiting = 0
        """Runs of the last whole sweep whose give-backs met no shard or module (they stay pending)."""
        self.runs_waiting_too_long = 0
        """Runs waiting for their shard or module longer than ``SHARDBUS_AWAY_ALERT_S`` (the ledger
        says, after each whole sweep; at most the ledger's page, 1,000)."""
        self.sweep_seconds = Buckets()


def collector(counts: CleanupCounts) -> Callable[[], Iterator[Metric]]:
    """The series at scrape time (in the metrics server's thread)."""

    def collect() -> Iterator[Metric]:
        now = counts
        verdicts = CounterMetricFamily(f"{NAME}givebacks_total", "Give-backs, by verdict.", labels=["verdict"])
        for verdict, n in dict(now.give_backs).items():
            verdicts.add_metric([verdict], n)
        yield verdicts
        finished = CounterMetricFamily(f"{NAME}runs_finished_total", "Runs whose cleanup was settled, by status.",
                                       labels=["status"])
        for status, n in dict(now.finished).items():
            finished.add_metric([status], n)
        yield finished
        yield GaugeMetricFamily(f"{NAME}runs_waiting", "Runs of the last sweep waiting for their shard or module.",
                                value=now.runs_waiting)
        yield GaugeMetricFamily(f"{NAME}runs_waiting_too_long",
                                "Runs waiting for their shard or module longer than SHARDBUS_AWAY_ALERT_S.",
                                value=now.runs_waiting_too_long)
        yield histogram(f"{NAME}sweep_duration_seconds", "How long a whole sweep took.",
                        series=[((), now.sweep_seconds)])

    return collect
