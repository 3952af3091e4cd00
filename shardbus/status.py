"""``shardbus status``: the operator's view of a running deployment, gathered over NATS.

- every service's replicas: ``shardbus.ping`` is answered by EVERY replica (no queue group),
  so the replies gathered for a bounded time count them;
- connected shards and the time of their last line: ``gateway.status``, also answered by every
  gateway replica (each holds its own shards), gathered the same way;
- stream and bucket sizes: the JetStream API's stream list (a key-value bucket is a stream
  named ``KV_<bucket>``);
- runs whose cleanup is ``incomplete`` (a person's to clear): ``ledger.runs``;
- runs waiting for their shard (their give-backs met no shard or module, and back off without
  spending attempts; cleanup stays ``pending``): ``ledger.sweep.waiting``; one waiting longer
  than ``SHARDBUS_AWAY_ALERT_S`` (default 900) is flagged (``waitingTooLong``): it wants a person;
- leases still ``confirmed`` after their deadline (the shard should have let go of them):
  ``ledger.leases.overdue``.

Printed as a table, or as JSON with ``--json`` (the same data). A part that cannot be read
(e.g. no ledger running) is reported in ``errors`` and the rest is still shown.

It never reports on another system silently: it says which NATS it asked and where that
address came from (``--nats-url``, ``SHARDBUS_NATS_URL``, the env file of the ``shardbus up``
running for this directory, or the default), and when that env file's stack is not running it
says so and exits 1 instead of asking whatever listens on the default address.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from http import HTTPStatus
from typing import Any

from shardbus import registry
from shared.errors import ShardbusError

DEFAULT_WAIT_S = 1.0
"""How long replies of every replica are gathered: a replica slower than this is not counted."""

INCOMPLETE_LIMIT = 100
"""At most this many incomplete runs are listed."""

WAITING_LIMIT = 100
"""At most this many runs waiting for their shard are listed."""

AWAY_ALERT_ENV = "SHARDBUS_AWAY_ALERT_S"
"""How long a run may wait for its shard or module before it is flagged (the services' setting)."""

OVERDUE_LIMIT = 20
"""At most this many leases past their deadline are listed (all are counted)."""


def _replicas(pings: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Ping replies grouped by service, each replica once (by host and pid); every service of
    the registry is there, with no replica when none answered (0 replicas is the news)."""
    found: dict[str, dict[tuple[str, str], dict[str, Any]]] = {name: {} for name in registry.NAMES}
    for reply in pings:
        service = reply.get("service")
        if reply.get("status") != HTTPStatus.OK or not isinstance(service, str):
            continue
        replica = {"host": reply.get("host"), "pid": reply.get("pid"), "uptimeS": reply.get("uptime_s")}
        found.setdefault(service, {})[(str(replica["host"]), str(replica["pid"]))] = replica
    return {service: sorted(by_id.values(), key=lambda r: (str(r["host"]), str(r["pid"])))
            for service, by_id in sorted(found.items())}


def _shards(answers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every shard every gateway replica holds (a shard is held by one replica at a time)."""
    shards = [shard for answer in answers if answer.get("status") == HTTPStatus.OK
              for shard in answer.get("shards") or [] if isinstance(shard, dict)]
    return sorted(shards, key=lambda s: str(s.get("shard")))


def _replication(cluster: Any) -> dict[str, Any]:
    """A clustered stream's leader and its other replicas as the leader sees them, with those
    ``behind``: not current, offline, or lagging (docs/operations.md, "Replicas behind"). A
    replica left behind after a partition heals holds a short history: a reader placed there
    sees fewer messages, and should the leader fail now, what it lacks could be lost."""
    if cluster is None or not cluster.replicas:
        return {"leader": getattr(cluster, "leader", None), "replicas": [], "behind": []}
    replicas = [{"name": peer.name, "current": bool(peer.current), "offline": bool(peer.offline),
                 "lag": peer.lag or 0, "activeS": round((peer.active or 0) / 1e9, 3)}
                for peer in cluster.replicas]
    behind = [r for r in replicas if not r["current"] or r["offline"] or r["lag"] > 0]
    return {"leader": cluster.leader, "replicas": replicas, "behind": behind}


async def _streams(nc: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(streams, buckets): each with its messages, bytes and replicas."""
    streams, buckets = [], []
    for info in await nc.jetstream().streams_info():
        row = {"name": info.config.name, "messages": info.state.messages, "bytes": info.state.bytes,
               "consumers": info.state.consumer_count, **_replication(info.cluster)}
        if info.config.name.startswith("KV_"):
            buckets.append({**row, "name": info.config.name[3:]})
        else:
            streams.append({**row, "subjects": list(info.config.subjects or [])})
    return sorted(streams, key=lambda r: r["name"]), sorted(buckets, key=lambda r: r["name"])


async def _ask_ledger(nc: Any, subject: str, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """The ledger's 200 reply to one request, or a RuntimeError quoting its answer."""
    reply = json.loads((await nc.request(subject, json.dumps(body).encode(), timeout=timeout_s)).data)
    if not isinstance(reply, dict):
        raise RuntimeError(f"{subject} answered {type(reply).__name__}, not an object")
    if reply.get("status") != HTTPStatus.OK:
        raise RuntimeError(f"{subject} answered {reply.get('status')}: {reply.get('error')}")
    return reply


async def _incomplete_runs(nc: Any, timeout_s: float) -> list[dict[str, Any]]:
    from shared import subjects

    reply = await _ask_ledger(nc, subjects.LEDGER_RUNS, {"cleanupStatus": "incomplete", "limit": INCOMPLETE_LIMIT},
                              timeout_s)
    return list(reply.get("runs") or [])


async def _waiting_runs(nc: Any, timeout_s: float) -> list[dict[str, Any]]:
    from shared import subjects

    reply = await _ask_ledger(nc, subjects.LEDGER_SWEEP_WAITING, {"limit": WAITING_LIMIT}, timeout_s)
    return list(reply.get("runs") or [])


def away_alert_s() -> float:
    """``SHARDBUS_AWAY_ALERT_S`` as the services read it (default 900); not a number: the default."""
    from shared.contracts.ledger import AWAY_ALERT_S

    try:
        value = float(os.environ.get(AWAY_ALERT_ENV, "").strip() or AWAY_ALERT_S)
    except ValueError:
        return AWAY_ALERT_S
    return value if 0 <= value < float("inf") else AWAY_ALERT_S


def _waited_s(run: dict[str, Any], now_s: float) -> float | None:
    """Seconds the run has waited (``waitingSince``, ISO 8601), or None when it does not say."""
    from datetime import datetime

    try:
        return max(0.0, now_s - datetime.fromisoformat(str(run.get("waitingSince"))).timestamp())
    except ValueError:
        return None


def flag_waiting(runs: list[dict[str, Any]], now_s: float, alert_s: float) -> list[dict[str, Any]]:
    """Each waiting run with ``waitingS`` and ``waitingTooLong`` (waited longer than ``alert_s``)."""
    flagged = []
    for run in runs:
        waited = _waited_s(run, now_s)
        flagged.append({**run, "waitingS": None if waited is None else round(waited, 1),
                        "waitingTooLong": waited is not None and waited > alert_s})
    return flagged


async def _overdue_leases(nc: Any, timeout_s: float) -> dict[str, Any]:
    from shared import subjects

    reply = await _ask_ledger(nc, subjects.LEDGER_LEASES_OVERDUE, {"limit": OVERDUE_LIMIT}, timeout_s)
    return {"count": reply.get("count", 0), "resources": list(reply.get("resources") or [])}


async def gather(nats_url: str, wait_s: float = DEFAULT_WAIT_S) -> dict[str, Any]:
    """The whole status as one JSON-able dict. Raises ``OSError``/NATS errors only when NATS
    itself cannot be reached; every other failure lands in ``errors``."""
    import nats

    from shared import subjects
    from shared.logs import redact
    from shared.nats_calls import quiet
    from shared.nats_connect import connection_name, inbox_prefix
    from shared.scatter_gather import scatter_gather

    servers = [url.strip() for url in nats_url.split(",") if url.strip()]
    from shared.settings import CommonSettings

    nc = await nats.connect(servers, name=connection_name("status"), inbox_prefix=inbox_prefix(servers),
                            connect_timeout=5, allow_reconnect=False, max_reconnect_attempts=1, error_cb=quiet,
                            **CommonSettings().nats_tls())
    errors: list[str] = []
    alert_s = away_alert_s()

    async def part(name: str, job: Any, fallback: Any) -> Any:
        try:
            return await job
        except Exception as exc:  # noqa: BLE001 — one unreadable part must not hide the others
            errors.append(f"{name}: {redact(str(exc)) or type(exc).__name__}")
            return fallback

    try:
        pings, gateways, (streams, buckets), incomplete, waiting, overdue = await asyncio.gather(
            part("replicas", scatter_gather(nc, subjects.PING, b"{}", wait_s), []),
            part("shards", scatter_gather(nc, subjects.GATEWAY_STATUS, b"{}", wait_s), []),
            part("streams", _streams(nc), ([], [])),
            part("incomplete runs", _incomplete_runs(nc, max(wait_s, 2.0)), []),
            part("waiting runs", _waiting_runs(nc, max(wait_s, 2.0)), []),
            part("overdue leases", _overdue_leases(nc, max(wait_s, 2.0)), {"count": 0, "resources": []}),
        )
    finally:
        with contextlib.suppress(Exception):  # NATS gone meanwhile: the parts already said so
            await nc.close()
    return {
        "nats": ",".join(redact(url) for url in servers),
        "at": round(time.time(), 3),
        "services": {name: {"replicas": len(rs), "instances": rs} for name, rs in _replicas(pings).items()},
        "shards": _shards(gateways),
        "streams": streams,
        "buckets": buckets,
        "incompleteRuns": incomplete,
        "awayAlertS": alert_s,
        "waitingRuns": flag_waiting(waiting, time.time(), alert_s),
        "overdueLeases": overdue,
        "errors": errors,
    }


# --- the table ---------------------------------------------------------------------------

def _table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    cells = [headers] + [["" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return ["  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True)).rstrip() for row in cells]


def _ago(ms: Any, now_s: float) -> str:
    if not isinstance(ms, (int, float)):
        return "-"
    return f"{time.strftime('%H:%M:%S', time.gmtime(ms / 1000))}Z ({max(0.0, now_s - ms / 1000):.1f} s ago)"


def _due(iso: Any, now_s: float) -> str:
    """When a waiting run's next give-back is due (``retryAt``, an ISO 8601 time)."""
    from datetime import datetime

    try:
        at = datetime.fromisoformat(str(iso)).timestamp()
    except ValueError:
        return "-" if iso is None else str(iso)
    left = at - now_s
    shown = time.strftime("%H:%M:%S", time.gmtime(at))
    return f"{shown}Z (in {left:.1f} s)" if left > 0 else f"{shown}Z (due)"


def _seconds(value: Any) -> str:
    return f"{value:.0f} s" if isinstance(value, (int, float)) else "?"


def render(status: dict[str, Any]) -> str:
    """The status as the terminal table."""
    now = status["at"]
    source = f"  (from {status['natsSource']})" if status.get("natsSource") else ""
    lines = [f"NATS {status['nats']}{source}", "", "SERVICES"]
    lines += _table(["service", "replicas", "instances (host:pid, up)"],
                    [[name, s["replicas"], ", ".join(f"{r['host']}:{r['pid']} ({_seconds(r['uptimeS'])})"
                                                    for r in s["instances"]) or "-"]
                     for name, s in status["services"].items()])
    lines += ["", f"SHARDS ({len(status['shards'])} connected)"]
    lines += _table(["shard", "protocol", "last line", "frames", "unpublished"],
                    [[s.get("shard"), s.get("protocol"), _ago(s.get("lastLineAt"), now), s.get("frames"),
                      s.get("unpublished")] for s in status["shards"]])
    lines += ["", "STREAMS"]
    lines += _table(["stream", "messages", "bytes", "subjects"],
                    [[s["name"], s["messages"], s["bytes"], " ".join(s["subjects"])] for s in status["streams"]])
    lines += ["", "BUCKETS"]
    lines += _table(["bucket", "entries", "bytes"], [[b["name"], b["messages"], b["bytes"]] for b in status["buckets"]])
    lines += _behind(status["streams"] + status["buckets"])
    lines += ["", f"RUNS WITH CLEANUP INCOMPLETE ({len(status['incompleteRuns'])})"]
    lines += _table(["run", "shard", "event", "status", "ended"],
                    [[r.get("runId"), r.get("shard"), r.get("event"), r.get("status"), r.get("endedAt")]
                     for r in status["incompleteRuns"]])
    from shared.status_words import waited, waiting_words

    waiting = status["waitingRuns"]
    too_long = sum(1 for r in waiting if r.get("waitingTooLong"))
    alert = f"; {too_long} longer than {waited(status['awayAlertS'])}: start the shard or module" if too_long else ""
    lines += ["", f"RUNS WAITING FOR THEIR SHARD ({len(waiting)}; cleanup pending, no attempt spent{alert})"]

    def how_long(run: dict[str, Any]) -> str:
        seconds = run.get("waitingS")
        if not isinstance(seconds, (int, float)):
            return "-"
        return f"!! {waiting_words(seconds)}: wants a person" if run.get("waitingTooLong") else waited(seconds)

    lines += _table(["run", "shard", "rows", "waiting", "next try", "misses in a row"],
                    [[r.get("runId"), r.get("shard"), r.get("rows"), how_long(r), _due(r.get("retryAt"), now),
                      r.get("away")] for r in waiting])
    overdue = status["overdueLeases"]
    lines += ["", f"LEASES PAST THEIR DEADLINE, STILL CONFIRMED ({overdue['count']}; the shard should have let go)"]
    lines += _table(["run", "resource", "module", "kind", "ref", "deadline"],
                    [[r.get("runId"), r.get("resourceId"), r.get("module"), r.get("kind"), r.get("ref"),
                      _ago(r.get("leaseDeadline"), now)] for r in overdue["resources"]])
    if status["errors"]:
        lines += ["", "COULD NOT READ"] + [f"  {error}" for error in status["errors"]]
    return "\n".join(lines)


def _behind(streams: list[dict[str, Any]]) -> list[str]:
    """The replicas not caught up with their leader, if any (docs/operations.md, "Replicas behind")."""
    rows = [[s["name"], r["name"], s.get("leader") or "-", r["lag"], "offline" if r["offline"] else
             ("current" if r["current"] else "catching up"), _seconds(r["activeS"])]
            for s in streams for r in s.get("behind", [])]
    if not rows:
        return []
    table = _table(["stream", "replica", "leader", "lag (entries)", "state", "last heard"], rows)
    return ["", f"!! REPLICAS BEHIND THEIR LEADER ({len(rows)}; a reader there sees a short history)", *table]


# --- the command -------------------------------------------------------------------------

class StackNotRunning(ShardbusError):
    """The env file of this directory's ``shardbus up`` names a stack that is not running."""

    status = HTTPStatus.SERVICE_UNAVAILABLE


def nats_address(nats_url: str, stack: Any) -> tuple[str, str]:
    """(the NATS URL to ask, where it came from): ``--nats-url``, else ``SHARDBUS_NATS_URL`` (set in
    the environment, or taken from the env file of the ``shardbus up`` running here: ``stack``,
    a ``stack_env.StackEnv``), else the default. Raises :class:`StackNotRunning` rather than
    fall back to the default when the env file's stack is not running."""
    import os

    from shardbus import stack_env
    from shared.logs import redact
    from shared.settings import CommonSettings

    if nats_url:
        return nats_url, "--nats-url"
    env_url = os.environ.get("SHARDBUS_NATS_URL", "").strip()
    if stack is not None and "SHARDBUS_NATS_URL" in stack.applied:
        return env_url, stack.describe()
    if env_url:
        source = "SHARDBUS_NATS_URL"
        theirs = stack.values.get("NATS_URL", "") if stack is not None and stack.running else ""
        if theirs and theirs != env_url:
            source += (f", which wins over {stack.path} (its stack, at {redact(theirs)}, is running: "
                       "unset SHARDBUS_NATS_URL to ask that one)")
        return env_url, source
    if stack is not None and not stack.running:
        raise StackNotRunning(
            f"the shardbus up of {stack.path.parent} is not running (its env file {stack.path} names NATS at "
            f"{redact(stack.values.get('NATS_URL', '?'))}); start it with `make up`, or name a NATS with "
            "--nats-url or SHARDBUS_NATS_URL")
    default = CommonSettings().nats_url
    return default, (f"the default: no --nats-url, no SHARDBUS_NATS_URL, and no running shardbus up here "
                     f"(no {stack_env.state_dir() / stack_env.ENV_FILE})")


def _cmd_status(args: argparse.Namespace) -> int:
    import nats.errors

    from shared.nats_calls import nats_failure

    try:
        url, source = nats_address(args.nats_url, getattr(args, "stack_env", None))
    except StackNotRunning as exc:
        print(f"shardbus status: {exc}", file=sys.stderr)
        return 1
    try:
        status = asyncio.run(gather(url, args.wait))
    except (nats.errors.Error, OSError) as exc:  # the connect failed (the parts catch their own)
        print(f"{nats_failure(url, exc)} (the address came from {source})", file=sys.stderr)
        return 1
    status = {"nats": status.pop("nats"), "natsSource": source, **status}
    print(json.dumps(status, indent=2) if args.json else render(status))
    return 0


def register(sub: Any) -> None:
    """Add ``shardbus status`` to the CLI's subcommands."""
    cmd = sub.add_parser("status", help="every service's replicas, connected shards, stream and "
                                        "bucket sizes, runs whose cleanup is incomplete, runs waiting "
                                        "for their shard")
    cmd.add_argument("--json", action="store_true", help="print the same as JSON")
    cmd.add_argument("--nats-url", default="",
                     help="default: SHARDBUS_NATS_URL, else the NATS of the shardbus up running for this "
                          "directory (.shardbus/env), else nats://127.0.0.1:4222; the report says which")
    cmd.add_argument("--wait", type=float, default=DEFAULT_WAIT_S,
                     help="seconds to gather the replies of every replica (default 1)")
    cmd.set_defaults(func=_cmd_status)
