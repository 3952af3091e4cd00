"""The console's shards page: the connected shards every gateway replica reports
(``gateway.status``), frames and dead letters per minute, the silent ones, and the newest dead
letters with their reasons (the ``SHARD_DEADLETTER`` stream).

``gateway.status`` gives counts since the shard connected. The door keeps each shard's recent
readings (``app.state.console_samples``) and turns two readings about a minute apart into a
rate; with only one reading yet, the rate is the average since the shard connected."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import nats.errors
import nats.js.errors
from fastapi import Request

from services.web.console import times
from services.web.console.reads import gather
from shared import subjects
from shared.contracts.ids import is_shard_id

SILENT_S = 30.0
"""A shard whose last line is older than this is shown as silent."""

RATE_WINDOW_S = 60.0
"""The rates are over about this long."""

DEAD_LETTERS_SHOWN = 20
"""The newest dead letters listed."""

LINE_CHARS = 300
"""A dead letter's line is cut to this many characters."""


@dataclass
class Sample:
    at: float
    connected_at: Any
    frames: int
    dead_letters: int


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _rates(samples: dict[str, deque[Sample]], shard: dict[str, Any], now: float) -> tuple[float, float, str]:
    """(frames/min, dead letters/min, over what) for one ``gateway.status`` entry."""
    name = str(shard.get("shard"))
    current = Sample(now, shard.get("connectedAt"), _int(shard.get("frames")), _int(shard.get("deadLetters")))
    history = samples.setdefault(name, deque(maxlen=64))
    if history and history[-1].connected_at != current.connected_at:  # reconnected: counts restarted
        history.clear()
    while history and now - history[0].at > RATE_WINDOW_S * 2:
        history.popleft()
    base = next((s for s in history if now - s.at <= RATE_WINDOW_S * 1.5), None)
    history.append(current)
    if base is not None and now - base.at >= 5:
        minutes = (now - base.at) / 60
        return ((current.frames - base.frames) / minutes, (current.dead_letters - base.dead_letters) / minutes,
                f"last {now - base.at:.0f} s")
    connected = times.parse(shard.get("connectedAt"))
    if connected is None:
        return 0.0, 0.0, "unknown"
    minutes = max((now - connected.timestamp()) / 60, 1 / 60)
    return current.frames / minutes, current.dead_letters / minutes, "since it connected"


async def shard_rows(request: Request) -> tuple[list[dict[str, Any]], str | None]:
    """Every connected shard with its rates and whether it is silent; or why none could be read."""
    answers = await gather(request, subjects.GATEWAY_STATUS)
    if answers is None:
        return [], "the web door is not connected to NATS; retry shortly"
    if not answers:
        return [], "no gateway is running (nobody answers gateway.status)"
    samples = getattr(request.app.state, "console_samples", None)
    if samples is None:
        samples = request.app.state.console_samples = {}
    now = time.time()
    rows = []
    for answer in answers:
        if answer.get("status") != HTTPStatus.OK:
            continue
        for shard in answer.get("shards") or []:
            if not isinstance(shard, dict) or not is_shard_id(shard.get("shard")):
                continue
            frames_min, dead_min, over = _rates(samples, shard, now)
            silent = shard.get("silentForS")
            silent_s = float(silent) if isinstance(silent, (int, float)) and not isinstance(silent, bool) else None
            last = times.parse(shard.get("lastLineAt"))
            rows.append({**shard, "framesPerMin": frames_min, "deadLettersPerMin": dead_min, "rateOver": over,
                         "silent": silent_s is not None and silent_s >= SILENT_S,
                         "lastLine": last, "lastLineAgo": times.ago(silent_s),
                         "connected": times.parse(shard.get("connectedAt"))})
    rows.sort(key=lambda r: r["shard"])
    return rows, None


async def dead_letters(request: Request) -> tuple[list[dict[str, Any]], str | None]:
    """The newest dead letters of every shard (newest first), each with its reason."""
    nc = request.app.state.nc
    if nc is None or not nc.is_connected:
        return [], "the web door is not connected to NATS; retry shortly"
    js = nc.jetstream(timeout=request.app.state.settings.web_request_timeout_s)
    try:
        info = await js.stream_info(subjects.DEADLETTER_STREAM)
    except nats.js.errors.NotFoundError:
        return [], None  # no gateway ever ran: no dead letters
    except (TimeoutError, nats.errors.Error) as exc:
        return [], f"the dead letters cannot be read now ({type(exc).__name__})"
    last, first = info.state.last_seq or 0, info.state.first_seq or 0
    seqs = [s for s in range(last, max(first, 1) - 1, -1)][:DEAD_LETTERS_SHOWN] if last else []

    async def one(seq: int) -> Any:
        try:
            return await js.get_msg(subjects.DEADLETTER_STREAM, seq)
        except (TimeoutError, nats.errors.Error):
            return None  # gone (aged out) between the info and the read

    letters = []
    for msg in await asyncio.gather(*(one(s) for s in seqs)):
        if msg is None:
            continue
        parts = (msg.subject or "").split(".")
        line = (msg.data or b"").decode("utf-8", errors="replace")
        reason = (msg.headers or {}).get("Shardbus-Reason", "no reason given")
        letters.append({"seq": msg.seq, "shard": parts[1] if len(parts) == 3 else "?", "reason": reason,
                        "line": line if len(line) <= LINE_CHARS else line[:LINE_CHARS] + "…",
                        "at": msg.time, "ago": times.since(msg.time)})
    return letters, None
