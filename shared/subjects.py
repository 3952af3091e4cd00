"""Every NATS subject shardbus uses: the public contract (docs/contracts.md).

A subject is built here and nowhere else. ``<shard>`` is a shard id matching
:data:`SHARD_ID_PATTERN`. Each service owns its section below.
"""

from __future__ import annotations

import re

# Every id pattern is defined once, in shared/contracts/ids.py; these names are kept for the
# modules that build subjects from them.
from shared.contracts.ids import LEDGER_ID_PATTERN as LEDGER_ID_PATTERN
from shared.contracts.ids import MODULE_ID_PATTERN as MODULE_ID_PATTERN
from shared.contracts.ids import REQUEST_ID_PATTERN as REQUEST_ID_PATTERN
from shared.contracts.ids import SHARD_ID_PATTERN as SHARD_ID_PATTERN
from shared.contracts.ids import is_shard_id as is_shard_id

KIND_PATTERN = r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*"
"""What a frame kind or command verb may look like: it becomes a subject's tail."""

MAX_KIND_CHARS = 128
"""Longest frame kind or command verb."""

_KIND = re.compile(KIND_PATTERN)


def is_safe_kind(kind: object) -> bool:
    """True when ``kind`` may be a subject tail: dot-separated tokens of letters, digits,
    ``_`` and ``-`` (no wildcards, whitespace, empty tokens or other characters), not too long."""
    # fullmatch: ``$`` would also match before a trailing newline ("guild.update\n").
    return isinstance(kind, str) and len(kind) <= MAX_KIND_CHARS and _KIND.fullmatch(kind) is not None


# --- shard plane (owned by the gateway) ------------------------------------------------

FRAMES_STREAM = "SHARD_FRAMES"
"""The JetStream stream holding every frame every shard sent."""

FRAMES_WILDCARD = "shard.*.frame.>"
"""All frames of all shards (the stream's subject filter)."""

DEADLETTER_STREAM = "SHARD_DEADLETTER"
"""The JetStream stream holding lines the gateway could not publish as frames."""

DEADLETTER_WILDCARD = "shard.*.deadletter"
"""All dead letters of all shards."""

GATEWAY_STATUS = "gateway.status"
"""Request: every gateway replica answers with its connected shards and their last line."""


def frame(shard: str, kind: str) -> str:
    """Where a frame of ``kind`` from ``shard`` is published, verbatim."""
    return f"shard.{shard}.frame.{kind}"


def deadletter(shard: str) -> str:
    """Where a line from ``shard`` that could not be a frame is kept, with the reason."""
    return f"shard.{shard}.deadletter"


def command(shard: str, verb: str) -> str:
    """Request/reply: a command to ``shard``; the verb becomes the line's ``kind``."""
    return f"shard.{shard}.cmd.{verb}"


def command_wildcard(shard: str) -> str:
    """Every command to ``shard`` (what the replica holding it subscribes to)."""
    return f"shard.{shard}.cmd.>"


def board(shard: str, name: str) -> str:
    """Request: a whole board of ``shard`` (e.g. ``guilds``), in board order."""
    return f"shard.{shard}.board.{name}"


BOARD_WILDCARD = "shard.*.board.*"
"""Every board read of every shard (answered by any gateway replica)."""


def news_add(shard: str) -> str:
    """Request: the website adds (or replaces) a news item of ``shard``; it is stored, announced
    to the shard if connected, and replayed after each hello with ``announce: false``."""
    return f"shard.{shard}.news.add"


NEWS_ADD_WILDCARD = "shard.*.news.add"
"""Every news addition of every shard (answered by any gateway replica)."""


def news_announce(shard: str) -> str:
    """Internal: a stored news item for the replica holding ``shard`` to announce to it."""
    return f"shard.{shard}.news.announce"


# --- health (every service) -------------------------------------------------------------

def health(service: str) -> str:
    """Request: any replica of ``service`` answers ``{"status": 200, ...}`` when it is up."""
    return f"{service}.health"


PING = "shardbus.ping"
"""Request (no queue group): EVERY replica of every service answers ``{"status": 200,
"service", "pid", "host", "uptime_s"}``; gather replies for a bounded time to count replicas."""


# --- ledger, cleanup, installer ---------------------------------------------------------
# Each service adds its subjects in a section of its own below.

# --- ledger (owned by services/ledger; payloads in docs/contracts.md) --------------------

LEDGER_QUEUE = "ledger"
"""Queue group of every ledger request subject: replicas share the work."""

LEDGER_RUN_CREATE = "ledger.run.create"
"""Request: create an event run (idempotent on its runId)."""

LEDGER_RUN_STATUS = "ledger.run.status"
"""Request: move a run's status (guarded by the run state machine)."""

LEDGER_RESOURCE_RESERVE = "ledger.resource.reserve"
"""Request: reserve a resource (pending) before the shard acts."""

LEDGER_RESOURCE_CONFIRM = "ledger.resource.confirm"
"""Request: the shard acted; pending → confirmed."""

LEDGER_RESOURCE_RECORD = "ledger.resource.record"
"""Request: record a resource directly as confirmed."""

LEDGER_RESOURCE_FAIL = "ledger.resource.fail"
"""Request: a reservation whose creation failed (nothing is out there)."""

LEDGER_CONSOLE = "ledger.console"
"""Request: the run console (run, resources, counts by status, unresolved)."""

LEDGER_RUNS = "ledger.runs"
"""Request: a page of runs by status, cleanup status, shard and schedule window."""

LEDGER_LEASES_OVERDUE = "ledger.leases.overdue"
"""Request: leases (and other rows) whose leaseDeadline passed while still ``confirmed``."""

LEDGER_LIVE = "ledger.live"
"""Request: a module's live (pending, confirmed) rows."""

LEDGER_LIVE_MODULES = "ledger.live.modules"
"""Request: every module that owns a live (pending, confirmed) row (what a reconcile of all asks)."""

LEDGER_LOG = "ledger.log"
"""Request: a page of a run's log entries (what happened to it and its rows), in order."""

LEDGER_SWEEP_SETTLE = "ledger.sweep.settle"
"""Request: finished runs holding nothing unresolved get cleanup complete."""

LEDGER_SWEEP_CANDIDATES = "ledger.sweep.candidates"
"""Request: finished runs whose cleanup is pending with rows left."""

LEDGER_SWEEP_CLAIM = "ledger.sweep.claim"
"""Request: claim a run's rows for a give-back (→ reverting)."""

LEDGER_SWEEP_REVERTED = "ledger.sweep.reverted"
"""Request: a give-back succeeded (reverting → reverted)."""

LEDGER_SWEEP_DRIFTED = "ledger.sweep.drifted"
"""Request: somebody moved it deliberately (reverting → drifted)."""

LEDGER_SWEEP_FAILED = "ledger.sweep.failed"
"""Request: a give-back failed (back to the previous status, attempts + 1)."""

LEDGER_SWEEP_OUTCOMES = "ledger.sweep.outcomes"
"""Request: a batch of give-back outcomes (reverted, drifted, failed, transient, away) in one commit."""

LEDGER_SWEEP_FINISH = "ledger.sweep.finish"
"""Request: end a run's sweep (cleanup.swept; cleanup status decided)."""

LEDGER_SWEEP_RETRY = "ledger.sweep.retry"
"""Request: a person retries an incomplete run's cleanup."""

LEDGER_SWEEP_WAITING = "ledger.sweep.waiting"
"""Request: runs waiting for their shard (rows whose last give-back met nobody, backing off)."""

LEDGER_EXPIRED_PATTERN = "ledger.expired.{module}"
"""Subscription pattern of expiries; the module is the subject's last token."""

LEDGER_RECONCILE_PATTERN = "ledger.reconcile.{module}"
"""Subscription pattern of reconciles; the module is the subject's last token."""

LEDGER_EVENTS_WILDCARD = "ledger.events.run.*"
"""Every run's update events."""

LEDGER_EVENTS_STREAM = "LEDGER_EVENTS"
"""The JetStream stream keeping every run's update events (declared by the ledger), so the web
door's feed can replay them."""


def ledger_expired(module: str) -> str:
    """Request: ``module`` reports the game ended a target at its deadline."""
    return f"ledger.expired.{module}"


def ledger_reconcile(module: str) -> str:
    """Request: ``module`` reports which refs of a run the shard still lists."""
    return f"ledger.reconcile.{module}"


def ledger_run_events(run_id: str) -> str:
    """Where every change to run ``run_id`` is published (``{"type", "run", "resource"?}``)."""
    return f"ledger.events.run.{run_id}"


# --- cleanup (owned by services/cleanup) -----------------------------------------------

CLEANUP_SWEEP = "cleanup.sweep"
"""Request ``{runId?}``: sweep now (every candidate run, or only ``runId``); replies the totals."""

CLEANUP_RETRY = "cleanup.retry"
"""Request ``{runId}``: reset an ``incomplete`` run's attempts and sweep it now."""

CLEANUP_RECONCILE = "cleanup.reconcile"
"""Request ``{modules?}``: reconcile those modules' live rows (default: every module owning a
live row, and the configured ones)."""

CLEANUP_SWEPT = "cleanup.events.swept"
"""Event: a cleanup replica finished a sweep; the payload is that sweep's totals."""


def module_revert(module: str) -> str:
    """Request: the owning game module gives back a resource of a kind the shard plane
    does not know (see docs/contracts.md)."""
    return f"modules.{module}.revert"


# --- installer (owned by the installer) -------------------------------------------------

INSTALLER_INSTALL = "installer.install"
"""Request ``{url, requestId?}``: install or upgrade the site's module from a manifest URL."""

INSTALLER_REMOVE = "installer.remove"
"""Request ``{id}``: remove the installed module, freeing the site."""

INSTALLER_LIST = "installer.list"
"""Request ``{}``: the installed module(s) and what became of each declared module."""

INSTALLER_EVENTS = "installer.events"
"""Event after every change: ``{type: installed|upgraded|removed, module, previous?}``."""


def installer_progress(request_id: str) -> str:
    """Events of one install's progress: ``{requestId, stage, done, total}``."""
    return f"installer.progress.{request_id}"
