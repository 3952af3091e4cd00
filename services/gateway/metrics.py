"""The gateway's series (docs/operations.md, "Metrics"), ``shardbus_gateway_…``: the plain
counts of :class:`~services.gateway.counts.GatewayCounts`, with the live links and publishers,
read at scrape time by :func:`collector`."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from services.gateway.counts import GatewayCounts
from shared.metrics import OTHER, PREFIX, histogram

if TYPE_CHECKING:
    from services.gateway.gateway import Gateway

NAME = f"{PREFIX}gateway_"


def collector(gateway: Callable[[], Gateway | None]) -> Callable[[], Iterator[Metric]]:
    """The gateway's series at scrape time (``gateway()`` is None until it serves: zeros). Runs
    in the metrics server's thread: it only reads ints and copies dicts the event loop writes."""
    nothing_yet = GatewayCounts()

    def collect() -> Iterator[Metric]:
        served = gateway()
        counts = served.counts if served else nothing_yet
        yield _counter("frames_in_total", "Lines read from shards, by frame kind.", "kind", counts.frames_in)
        yield _counter("frames_out_total", "Lines written to shards, by kind.", "kind", counts.frames_out)
        yield _counter("deadletters_total", "Lines sent to the dead-letter stream, by reason.", "reason",
                       counts.dead_letters)
        yield _counter("commands_total", "Replies to commands, by status.", "status",
                       {(str(s) if s else OTHER): n for s, n in dict(counts.commands).items()})
        yield _counter("connections_refused_total", "Connections refused before they became a shard's link, "
                       "by reason (TLS handshake, hello).", "reason", counts.refusals)
        paused = CounterMetricFamily(f"{NAME}reads_paused", "Times reading from a shard was paused for a "
                                     "line that had to wait (back-pressure).", value=counts.reads_paused)
        yield paused
        yield histogram(f"{NAME}command_duration_seconds", "From a command's request to its reply.",
                        series=[((), counts.command_seconds)])
        links = dict(served.links) if served else {}
        publishers = list(served.publishers.values()) if served else []
        yield _gauge("shards_connected", "Shards connected to this gateway.", len(links))
        yield _gauge("connections_opening", "Connections accepted that are not a shard's link yet "
                     "(in their TLS handshake or before their hello).", served.connections.opening if served else 0)
        yield _gauge("publish_backlog", "Frames read and not yet acknowledged by JetStream.",
                     sum(pub.pending() for pub in publishers))
        given_up = CounterMetricFamily(f"{NAME}frames_given_up", "Messages taken off a shard's window without "
                                       "JetStream storing them (refused 5 times in a row, dead-lettered); never "
                                       "acknowledged to the shard.", value=sum(pub.given_up for pub in publishers))
        yield given_up
        resends = CounterMetricFamily(f"{NAME}publish_resends", "Resends of a frame JetStream did not store at "
                                      "once (a timeout, no responders, 409 \"in process\", a refusal).",
                                      value=sum(pub.retries for pub in publishers))
        yield resends
        yield CounterMetricFamily(f"{NAME}frames_stored_out_of_order", "Frames JetStream stored only after a later "
                                  "frame of their shard (a leader change dropped them in flight; docs/gateway.md, "
                                  "\"What a shard may rely on\").",
                                  value=sum(pub.stored_out_of_order for pub in publishers))
        yield CounterMetricFamily(f"{NAME}fast_ingest_batches_cut", "Fast-ingest batches JetStream ended before "
                                  "the shard did (a gap, a refusal, a batch it forgot); what followed the cut was "
                                  "published again in order.", value=sum(pub.batches_cut for pub in publishers))
        yield _gauge("fast_ingest", "1 when frames go to their stream in fast-ingest batches (nats-server 2.14 "
                     "and later, SHARDBUS_FAST_INGEST), which keep each shard's order; 0 when published plainly.",
                     1 if served and served.pipeline.fast_ingest else 0)
        yield _gauge("unread_bytes", "Bytes written to shards and not yet taken by them.",
                     sum(link.unsent_bytes() for link in links.values() if not link.closed))
        now = time.time()
        for shard, link in links.items():
            counts.remember(shard, link.last_line_at)
        counts.forget_old(now)
        last = GaugeMetricFamily(f"{NAME}shard_last_frame_timestamp_seconds",
                                 "Unix time of each shard's last line (kept 24 h after it disconnects).",
                                 labels=["shard"])
        for shard, at in sorted(dict(counts.last_line_at).items()):
            last.add_metric([shard], at)
        yield last

    return collect


def _counter(name: str, doc: str, label: str, values: dict[str, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(f"{NAME}{name}", doc, labels=[label])
    for value, count in sorted(dict(values).items()):
        family.add_metric([value], count)
    return family


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{NAME}{name}", doc, value=value)
