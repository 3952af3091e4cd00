"""The series the monitoring files may name: issue 28's metrics catalogue (every service's
own, with their labels), prometheus_client's process and Python collectors, and what the two
exporters of the compose ``monitoring`` profile and Prometheus itself provide.

The shardbus half mirrors the catalogue agreed with the services (docs/operations.md,
"Metrics"): a series renamed there is renamed here, once. Histograms are listed by their base
name; ``_bucket`` (with ``le``), ``_sum`` and ``_count`` follow from it.
"""

from __future__ import annotations

import re

SERVICES = ("gateway", "ledger", "cleanup", "installer", "web")
"""The five services; each is one Prometheus job of the same name."""

TARGET_LABELS = frozenset({"job", "instance"})
"""The labels Prometheus adds to every scraped series."""

_OURS: dict[str, tuple[str, ...]] = {
    # every service
    "shardbus_service_info": ("service", "version"),
    "shardbus_nats_connected": ("service",),
    # gateway
    "shardbus_gateway_shards_connected": (),
    "shardbus_gateway_frames_in_total": ("kind",),
    "shardbus_gateway_frames_out_total": ("kind",),
    "shardbus_gateway_deadletters_total": ("reason",),
    "shardbus_gateway_commands_total": ("status",),
    "shardbus_gateway_publish_backlog": (),
    "shardbus_gateway_connections_opening": (),
    "shardbus_gateway_connections_refused_total": ("reason",),
    "shardbus_gateway_frames_given_up_total": (),
    "shardbus_gateway_frames_stored_out_of_order_total": (),
    "shardbus_gateway_publish_resends_total": (),
    "shardbus_gateway_fast_ingest_batches_cut_total": (),
    "shardbus_gateway_fast_ingest": (),
    "shardbus_gateway_unread_bytes": (),
    "shardbus_gateway_reads_paused_total": (),
    "shardbus_gateway_shard_last_frame_timestamp_seconds": ("shard",),
    # ledger
    "shardbus_ledger_requests_total": ("subject", "status"),
    "shardbus_ledger_outbox_pending": (),
    "shardbus_ledger_relay_lag_seconds": (),
    "shardbus_ledger_events_published_total": (),
    "shardbus_ledger_pool_connections": ("state",),
    # cleanup
    "shardbus_cleanup_givebacks_total": ("verdict",),
    "shardbus_cleanup_runs_waiting": (),
    "shardbus_cleanup_runs_waiting_too_long": (),
    "shardbus_cleanup_runs_finished_total": ("status",),
    # installer
    "shardbus_installer_installs_total": ("outcome",),
    "shardbus_installer_fetched_bytes_total": (),
    # web
    "shardbus_web_requests_total": ("route", "method", "status"),
    "shardbus_web_feed_clients": (),
    "shardbus_web_feed_drops_total": (),
}

_OUR_HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "shardbus_gateway_command_duration_seconds": (),
    "shardbus_ledger_batch_size": ("action",),
    "shardbus_cleanup_sweep_duration_seconds": (),
    "shardbus_web_request_duration_seconds": ("route",),
}

_PROCESS: dict[str, tuple[str, ...]] = {
    "process_cpu_seconds_total": (),
    "process_resident_memory_bytes": (),
    "process_virtual_memory_bytes": (),
    "process_open_fds": (),
    "process_max_fds": (),
    "process_start_time_seconds": (),
    "python_gc_objects_collected_total": ("generation",),
    "python_gc_collections_total": ("generation",),
    "python_info": ("implementation", "major", "minor", "patchlevel", "version"),
}

# prometheus-nats-exporter (-varz -jsz=all -connz): gnatsd_<endpoint>_<field> for the core
# endpoints, jetstream_<server|stream|consumer>_<field> for /jsz.
_NATS_SERVER = ("server_id",)
_JSZ_SERVER = ("server_id", "server_name", "cluster", "domain", "meta_leader", "is_meta_leader")
_JSZ_STREAM = (*_JSZ_SERVER, "account", "account_name", "account_id", "stream_name", "stream_leader",
               "is_stream_leader", "stream_raft_group")
_JSZ_CONSUMER = (*_JSZ_STREAM, "consumer_name", "consumer_leader", "is_consumer_leader", "consumer_desc")
_NATS: dict[str, tuple[str, ...]] = {
    **{f"gnatsd_varz_{field}": _NATS_SERVER for field in (
        "connections", "total_connections", "routes", "subscriptions", "slow_consumers",
        "in_msgs", "out_msgs", "in_bytes", "out_bytes", "cpu", "mem",
        "jetstream_stats_memory", "jetstream_stats_storage", "jetstream_stats_api_total",
        "jetstream_stats_api_errors")},
    **{f"gnatsd_connz_{field}": _NATS_SERVER for field in (
        "num_connections", "total", "pending_bytes", "subscriptions", "in_msgs", "out_msgs", "in_bytes",
        "out_bytes")},
    **{f"jetstream_server_{field}": _JSZ_SERVER for field in (
        "total_streams", "total_consumers", "total_messages", "total_message_bytes")},
    **{f"jetstream_stream_{field}": _JSZ_STREAM for field in (
        "total_messages", "total_bytes", "first_seq", "last_seq", "consumer_count")},
    **{f"jetstream_consumer_{field}": _JSZ_CONSUMER for field in (
        "num_pending", "num_ack_pending", "num_redelivered", "num_waiting")},
}

# postgres_exporter's default collectors.
_DATABASE = ("datid", "datname")
_POSTGRES: dict[str, tuple[str, ...]] = {
    "pg_up": (),
    "pg_settings_max_connections": (),
    "pg_database_size_bytes": ("datname",),
    "pg_stat_activity_count": ("datname", "state", "usename", "application_name", "backend_type"),
    **{f"pg_stat_database_{field}": _DATABASE for field in (
        "numbackends", "xact_commit", "xact_rollback", "blks_read", "blks_hit", "deadlocks",
        "conflicts", "temp_bytes")},
}

_PROMETHEUS: dict[str, tuple[str, ...]] = {"up": ()}


def _with_histograms(plain: dict[str, tuple[str, ...]],
                     histograms: dict[str, tuple[str, ...]]) -> dict[str, frozenset[str]]:
    series = {name: frozenset(labels) for name, labels in plain.items()}
    for name, labels in histograms.items():
        series[f"{name}_bucket"] = frozenset({*labels, "le"})
        series[f"{name}_sum"] = series[f"{name}_count"] = frozenset(labels)
    return series


OURS = _with_histograms(_OURS, _OUR_HISTOGRAMS)
"""The services' own series (``shardbus_…``), each with its labels."""

SERIES: dict[str, frozenset[str]] = {
    **OURS,
    **_with_histograms(_PROCESS, {}),
    **_with_histograms(_NATS, {}),
    **_with_histograms(_POSTGRES, {}),
    **_with_histograms(_PROMETHEUS, {}),
}
"""Every series the alerts and the dashboard may name, each with its own labels."""

HISTOGRAMS = frozenset(_OUR_HISTOGRAMS)


def base_name(series: str) -> str:
    """The catalogue's name of ``series``: a histogram's ``_bucket``/``_sum``/``_count`` dropped."""
    match = re.fullmatch(r"(.+)_(?:bucket|sum|count)", series)
    return match.group(1) if match and match.group(1) in HISTOGRAMS else series
