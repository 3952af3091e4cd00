"""The ledger's series (docs/operations.md, "Metrics"), ``shardbus_ledger_…``.

Counted where the ledger already counts: replies by subject and status (the dispatcher's for
the hot subjects, :class:`shared.middlewares.CountReplies` for the rest), each coalescer's requests
per statement, the relay's published events; read at scrape time by :func:`collector`, which
also asks the database how many events wait for the relay (one small query a scrape)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from services.ledger.database.queries.outbox import RELAY_BACKLOG
from services.ledger.database.store import Database
from services.ledger.events.outbox_relay import OutboxRelay
from services.ledger.serving.dispatcher import Dispatcher
from services.ledger.serving.hot_subjects import HotActions
from shared import subjects
from shared.contracts import ledger as c
from shared.metrics import OTHER, PREFIX, histogram

NAME = f"{PREFIX}ledger_"

SUBJECTS = frozenset({contract.subject for contract in c.CONTRACTS if "{" not in contract.subject}
                     | {subjects.health("ledger"), subjects.PING})
"""The ``subject`` label: the ledger's own subjects (a module-token subject by its pattern)."""

PATTERNS = tuple((pattern.split("{")[0], pattern)
                 for pattern in (subjects.LEDGER_EXPIRED_PATTERN, subjects.LEDGER_RECONCILE_PATTERN))

SCRAPE_QUERY_S = 2.0
"""Longest a scrape waits for the outbox query (past it, the two outbox gauges are left out)."""


def subject_label(subject: str) -> str:
    """The ``subject`` label of a request's subject."""
    if subject in SUBJECTS:
        return subject
    for prefix, pattern in PATTERNS:
        if subject.startswith(prefix):
            return pattern
    return OTHER


@dataclass
class LedgerMeters:
    """What the collector reads (the app fills ``loop`` and ``relays`` as it starts)."""

    db: Database
    dispatcher: Dispatcher
    hot_actions: HotActions
    relays: list[OutboxRelay]
    replies: dict[tuple[str, int], int] = field(default_factory=dict)
    """The FastStream subjects' replies (shared.middlewares.CountReplies fills it)."""
    loop: asyncio.AbstractEventLoop | None = None


def collector(meters: LedgerMeters) -> Callable[[], Iterator[Metric]]:
    """The ledger's series at scrape time (in the metrics server's thread)."""

    def collect() -> Iterator[Metric]:
        requests = CounterMetricFamily(f"{NAME}requests_total", "Requests answered, by subject and reply status.",
                                       labels=["subject", "status"])
        totals: dict[tuple[str, str], int] = {}
        for (subject, status), n in _items(meters.replies, meters.dispatcher.replies):
            key = (subject_label(subject), str(status) if 100 <= status <= 599 else OTHER)
            totals[key] = totals.get(key, 0) + n
        for (subject, code), n in sorted(totals.items()):
            requests.add_metric([subject, code], n)
        yield requests
        yield histogram(f"{NAME}batch_size", "Requests per coalesced statement, by action.", ["action"],
                        [((action,), sizes) for action, sizes in sorted(meters.hot_actions.batch_sizes().items())])
        yield CounterMetricFamily(f"{NAME}events_published_total", "Run events published to JetStream.",
                                  value=sum(relay.published for relay in list(meters.relays)))
        in_use, idle = meters.db.pool_sizes()
        pool = GaugeMetricFamily(f"{NAME}pool_connections", "Database pool connections, by state.", labels=["state"])
        pool.add_metric(["in_use"], in_use)
        pool.add_metric(["idle"], idle)
        yield pool
        outbox = _outbox(meters)
        if outbox is not None:
            yield GaugeMetricFamily(f"{NAME}outbox_pending", "Committed events not yet published.", value=outbox[0])
            yield GaugeMetricFamily(f"{NAME}relay_lag_seconds", "Age of the oldest unpublished event (0: none).",
                                    value=outbox[1])

    return collect


def _items(*counts: dict[tuple[str, int], int]) -> Iterable[tuple[tuple[str, int], int]]:
    for one in counts:
        yield from list(one.items())


def _outbox(meters: LedgerMeters) -> tuple[int, float] | None:
    """The outbox's length and the oldest event's age, asked on the ledger's loop; None when the
    loop is not running or the database does not answer in time."""
    loop = meters.loop
    if loop is None or loop.is_closed():
        return None

    async def ask() -> tuple[int, float]:
        async with meters.db.connect() as conn:
            row = await conn.fetchrow(RELAY_BACKLOG.sql, *RELAY_BACKLOG.args({}))
        return int(row[0]), float(row[1])

    future = asyncio.run_coroutine_threadsafe(ask(), loop)
    try:
        return future.result(timeout=SCRAPE_QUERY_S)
    except Exception:  # noqa: BLE001 - the database away or slow: the gauges are left out of this scrape
        future.cancel()
        return None
