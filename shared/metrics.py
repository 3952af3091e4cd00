"""Prometheus metrics every service shares (docs/operations.md, "Metrics"): a registry per app,
the common series, and the ``/metrics`` endpoint on the service's own port
(``SHARDBUS_METRICS_PORT``; 0 = off), started with the app and stopped with it.

The hot paths count in plain ints on the objects that already count (a ``Counter.labels().inc()``
per frame would cost more than the frame's own bookkeeping); each service's ``metrics.py`` turns
those counts into series at scrape time with a collector. :class:`Buckets` is the plain histogram
for them, and :func:`bounded` the one rule for label values: a known value, else ``"other"``.

No FastStream import here (the app is duck-typed): domain modules may import the counters."""

from __future__ import annotations

import bisect
import logging
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector, start_http_server
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from shared.errors import ShardbusError

if TYPE_CHECKING:
    from faststream import FastStream
    from faststream.nats import NatsBroker

    from shared.settings import CommonSettings

log = logging.getLogger("shardbus.metrics")

PREFIX = "shardbus_"
"""Every series of ours starts with it (then the service: ``shardbus_gateway_…``)."""

OTHER = "other"
"""The label value of anything outside a label's known set."""

SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Upper bounds of the duration histograms (requests, commands, sweeps)."""


def bounded(value: str, known: Collection[str]) -> str:
    """``value`` when it is one of ``known``, else :data:`OTHER`: a label never takes a raw string."""
    return value if value in known else OTHER


def version() -> str:
    """The installed shardbus's version (the ``version`` label of ``shardbus_service_info``)."""
    try:
        return metadata.version("shardbus")
    except metadata.PackageNotFoundError:  # pragma: no cover - run from a tree never installed
        return "unknown"


@dataclass
class Buckets:
    """A histogram kept in plain numbers (``observe`` is a bisect and two additions), exported
    by a collector with :meth:`family`."""

    bounds: Sequence[float] = SECONDS_BUCKETS
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)  # the last is +Inf

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, float]]:
        """``(le, count)`` pairs as Prometheus wants them (each count includes the lower ones)."""
        out, running = [], 0
        for bound, count in zip([*map(str, self.bounds), "+Inf"], self.counts, strict=True):
            running += count
            out.append((bound, float(running)))
        return out


def histogram(name: str, doc: str, labels: Sequence[str] = (),
              series: Iterable[tuple[Sequence[str], Buckets]] = ()) -> HistogramMetricFamily:
    """A histogram family from :class:`Buckets`, one per label values."""
    family = HistogramMetricFamily(name, doc, labels=list(labels))
    for values, buckets in series:
        family.add_metric(list(values), buckets.cumulative(), sum_value=buckets.total)
    return family


class CallbackCollector(Collector):
    """A collector whose series are whatever ``collect_fn`` yields at scrape time."""

    def __init__(self, collect_fn: Callable[[], Iterable[Metric]]) -> None:
        self._collect = collect_fn

    def collect(self) -> Iterator[Metric]:
        try:
            yield from self._collect()
        except Exception:  # a failing collector must not fail the scrape of the rest
            log.exception("a metrics collector failed")


def service_registry(service: str, connected: Callable[[], bool]) -> CollectorRegistry:
    """A registry of its own for one app (two apps in one test process never collide), holding
    the common series: ``shardbus_service_info``, ``shardbus_nats_connected`` and the process,
    platform and garbage-collector series of prometheus_client."""
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    release = version()

    def common() -> Iterator[Metric]:
        info = GaugeMetricFamily(f"{PREFIX}service_info", "The service and the shardbus version it runs (always 1).",
                                 labels=["service", "version"])
        info.add_metric([service, release], 1)
        yield info
        up = GaugeMetricFamily(f"{PREFIX}nats_connected", "1 while the service's NATS connection is up, else 0.",
                               labels=["service"])
        up.add_metric([service], 1 if connected() else 0)
        yield up

    registry.register(CallbackCollector(common))
    return registry


def broker_connected(broker: NatsBroker) -> Callable[[], bool]:
    """Whether ``broker``'s connection is up now (False before it connects)."""

    from shared import faststream_internals  # here: this module imports no FastStream at load

    def connected() -> bool:
        nc = faststream_internals.connection_of(broker)
        return nc is not None and nc.is_connected

    return connected


class MetricsPortUnavailable(ShardbusError, RuntimeError):
    """The metrics endpoint cannot listen on its port: a setting to change, said as such."""


@dataclass
class MetricsServer:
    """The ``/metrics`` endpoint of one app: :attr:`registry` is where its collectors go."""

    registry: CollectorRegistry
    host: str
    port: int
    _server: Any = None
    _thread: threading.Thread | None = None

    def start(self) -> None:
        if self.port == 0 or self._server is not None:
            return
        try:
            self._server, self._thread = start_http_server(self.port, addr=self.host, registry=self.registry)
        except OSError as exc:  # not an outage to wait out (a bare OSError reads as one)
            raise MetricsPortUnavailable(
                f"cannot serve metrics on {self.host}:{self.port} ({exc.strerror or exc}): "
                "free that port or set SHARDBUS_METRICS_PORT to another (0: no metrics)") from None
        log.info("serving metrics", extra={"url": self.url})

    def stop(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None:
            return
        server.shutdown()  # its own handle: serve_forever returns, the thread ends
        server.server_close()
        if thread is not None:
            thread.join(timeout=5.0)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"


def serve_metrics(app: FastStream, broker: NatsBroker, service: str, settings: CommonSettings,
                  *collectors: Callable[[], Iterable[Metric]]) -> MetricsServer:
    """Give ``app`` its registry (the common series and ``collectors``, each called at scrape
    time) and serve it on ``metrics_host``:``metrics_port`` from startup to shutdown."""
    registry = service_registry(service, broker_connected(broker))
    for collect in collectors:
        registry.register(CallbackCollector(collect))
    server = MetricsServer(registry, settings.metrics_host, settings.metrics_port)

    @app.on_startup
    async def _start_metrics() -> None:
        server.start()

    @app.after_shutdown
    async def _stop_metrics() -> None:
        server.stop()

    return server
