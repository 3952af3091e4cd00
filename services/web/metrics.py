"""The web door's series (docs/operations.md, "Metrics"), ``shardbus_web_…``: every HTTP request
by its route's path template (never the raw path: ``/shards/{shard}/guilds``), method and
status, its duration, and the feed's clients and drops.

:class:`RequestMeter` is pure ASGI middleware (no task or queue per request) counting into
plain numbers; :func:`collector` reads them at scrape time."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from shared.metrics import OTHER, PREFIX, Buckets, histogram

NAME = f"{PREFIX}web_"

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
"""The ``method`` label (else ``other``)."""


class RequestCounts:
    """The door's requests since it started."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, str, int], int] = {}
        self.seconds: dict[str, Buckets] = {}

    def count(self, route: str, method: str, status: int, seconds: float) -> None:
        key = (route, method if method in METHODS else OTHER, status if 100 <= status <= 599 else 0)
        self.requests[key] = self.requests.get(key, 0) + 1
        if (buckets := self.seconds.get(route)) is None:
            buckets = self.seconds[route] = Buckets()
        buckets.observe(seconds)


def route_of(scope: dict[str, Any]) -> str:
    """The matched route's path template (Starlette puts the route in the scope), else ``other``:
    a path no route took (a 404) is never a label."""
    path = getattr(scope.get("route"), "path", None)
    return path if isinstance(path, str) else OTHER


class RequestMeter:
    """Pure ASGI middleware: each HTTP request counted by route, method and status, and timed
    (from its start to the end of its response's headers being sent, or the request's end)."""

    def __init__(self, app: Any, counts: RequestCounts) -> None:
        self.app, self.counts = app, counts

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # an exception before the response started is the 500 the server sends

        async def sending(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            self.counts.count(route_of(scope), scope.get("method", ""), status, time.perf_counter() - started)


def collector(counts: RequestCounts, feed: Callable[[], Any]) -> Callable[[], Iterator[Metric]]:
    """The series at scrape time; ``feed()`` is the feed hub (None until the first feed)."""

    def collect() -> Iterator[Metric]:
        requests = CounterMetricFamily(f"{NAME}requests_total", "HTTP requests, by route, method and status.",
                                       labels=["route", "method", "status"])
        for (route, method, status), n in sorted(dict(counts.requests).items()):
            requests.add_metric([route, method, str(status) if status else OTHER], n)
        yield requests
        yield histogram(f"{NAME}request_duration_seconds", "HTTP request durations, by route.", ["route"],
                        [((route,), buckets) for route, buckets in sorted(dict(counts.seconds).items())])
        hub = feed()
        yield GaugeMetricFamily(f"{NAME}feed_clients", "Feed clients connected (WebSocket and SSE).",
                                value=len(hub.clients) if hub else 0)
        yield CounterMetricFamily(f"{NAME}feed_drops_total", "Feed clients dropped (too slow, stopping, failed).",
                                  value=hub.drops if hub else 0)

    return collect
