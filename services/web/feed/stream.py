"""The feed's stream and its events. Plain (no FastAPI, no FastStream).

``WEB_FEED`` *sources* the frames stream, every board's key-value stream and the ledger's
events stream, so one stream sequence orders all three: that sequence is the feed's only
cursor. The door declares it at first use and adds a source when its stream appears later
(sourcing a stream that does not exist yet is left to the door, not the server: NATS 2.15
was seen never to start one of two sources that appeared together). A source added when the
feed is created starts after what its stream holds now; one created after the feed, at its
beginning.

Each stored message becomes one JSON text (:class:`FeedEvent`), built once per door whatever
the number of clients, the payload spliced in verbatim once checked to be JSON.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime
from http import HTTPStatus
from typing import Any

from nats.aio.client import Client

from services.web.settings import WebSettings
from shared import subjects
from shared.contracts.ids import is_shard_id
from shared.errors import ShardbusError

log = logging.getLogger("shardbus.web.feed")

API_TIMEOUT_S = 5.0
"""Longest wait for one JetStream API answer."""

SOURCE_CHECK_S = 10.0
"""How often, at most, the door looks again for a source stream that did not exist."""

CACHE_EVENTS = 8192
"""Events kept built, by sequence: clients close together share one build."""

STREAM_NOT_FOUND = 10059
STREAM_NAME_IN_USE = 10058


class FeedUnavailable(ShardbusError):
    """The feed stream cannot be reached or made now (NATS away, permissions)."""

    status = HTTPStatus.SERVICE_UNAVAILABLE


@dataclass(frozen=True, slots=True)
class FeedEvent:
    """One event as its clients receive it."""

    seq: int
    type: str
    shard: str | None
    kind: str | None
    board: str | None
    text: str
    size: int


def _json_text(data: bytes) -> tuple[str | None, Any]:
    """The payload as JSON text to splice in verbatim and its parsed value, or (None, None)
    when it is not strict JSON (not UTF-8, NaN, malformed, too deep)."""
    if not data:
        return None, None
    try:
        text = data.decode()
        value = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return None, None
    if "\n" in text or "\r" in text:  # only whitespace between tokens can be a raw line break
        text = text.replace("\r", " ").replace("\n", " ")  # one line: SSE frames by lines
    return text, value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _iso(ts_ns: int) -> str:
    seconds, ns = divmod(ts_ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{ns // 1_000_000:03d}Z"


def build_event(seq: int, subject: str, headers: dict[str, str] | None, data: bytes, ts_ns: int,
                board_of: dict[str, str]) -> FeedEvent | None:
    """The event of one stored message (``board_of``: bucket → board), or None for a subject
    the feed does not carry."""
    tokens = subject.split(".")
    head: dict[str, Any] = {"seq": seq}
    shard = kind = board = None
    payload, value = _json_text(data)
    if len(tokens) >= 4 and tokens[0] == "shard" and tokens[2] == "frame":
        shard, kind = tokens[1], ".".join(tokens[3:])
        head.update(type="frame", time=_iso(ts_ns), subject=subject, shard=shard, kind=kind)
    elif len(tokens) >= 3 and tokens[0] == "$KV" and tokens[1] in board_of:
        board, shard, key = board_of[tokens[1]], tokens[2], ".".join(tokens[2:])
        deleted = (headers or {}).get("KV-Operation") in ("DEL", "PURGE")
        head.update(type="board", time=_iso(ts_ns), subject=subject, shard=shard, board=board, key=key)
        if len(tokens) == 5:  # <shard>.<id>.<part>
            head.update(id=tokens[3], part=tokens[4])
        head["op"] = "delete" if deleted else "put"
        if deleted:
            payload = None
    elif len(tokens) == 4 and subject.startswith("ledger.events.run."):
        run = value.get("run") if isinstance(value, dict) else None
        run_shard = run.get("shard") if isinstance(run, dict) else None
        shard = run_shard if is_shard_id(run_shard) else None
        head.update(type="ledger", time=_iso(ts_ns), subject=subject, run=tokens[3])
        if shard:
            head["shard"] = shard
    else:
        return None
    text = json.dumps(head, ensure_ascii=False, separators=(",", ":"))[:-1] + ',"data":' + (payload or "null") + "}"
    return FeedEvent(seq, head["type"], shard, kind, board, text, len(text.encode()))


class FeedStream:
    """The ``WEB_FEED`` stream of one door: declared at first use, sources added as their
    streams appear, and the events it holds built once (cached by sequence)."""

    def __init__(self, nc: Client, settings: WebSettings) -> None:
        self.nc, self.settings = nc, settings
        self.name = settings.web_feed_stream
        self.bucket_of = {b: f"{settings.board_bucket_prefix}_{b.upper()}" for b in settings.web_feed_boards}
        self.board_of = {bucket: board for board, bucket in self.bucket_of.items()}
        self.sources = [settings.frames_stream, *(f"KV_{b}" for b in self.bucket_of.values()),
                        subjects.LEDGER_EVENTS_STREAM]
        self.missing: list[str] = list(self.sources)
        self._declared = False
        self._checked = 0.0
        self._lock = asyncio.Lock()
        self._cache: OrderedDict[int, FeedEvent | None] = OrderedDict()

    # --- JetStream API (raw JSON: a configuration read back is sent back whole) -----------

    async def _api(self, subject: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        payload = json.dumps(body).encode() if body is not None else b""
        try:
            msg = await self.nc.request(f"$JS.API.{subject}", payload, timeout=API_TIMEOUT_S)
            reply = json.loads(msg.data)
        except Exception as exc:
            raise FeedUnavailable(f"JetStream did not answer {subject.split('.')[0].lower()} "
                                  f"({type(exc).__name__})") from exc
        return reply if isinstance(reply, dict) else {"error": {"description": "not an object"}}

    async def info(self, name: str) -> dict[str, Any] | None:
        """A stream's info, None when it does not exist."""
        reply = await self._api(f"STREAM.INFO.{name}")
        error = reply.get("error")
        if error:
            if error.get("err_code") == STREAM_NOT_FOUND:
                return None
            raise FeedUnavailable(f"stream {name}: {error.get('description', 'error')}")
        return reply

    # --- declaration ----------------------------------------------------------------------

    async def ensure(self, force: bool = False) -> None:
        """Make sure the stream exists with every source that exists; cheap when nothing is
        missing (FeedUnavailable when NATS cannot tell or refuses)."""
        if self._declared and not force and (not self.missing or time.monotonic() - self._checked < SOURCE_CHECK_S
                                             or self._lock.locked()):  # a look in progress: never wait for it
            return
        async with self._lock:
            if self._declared and not force and (not self.missing or time.monotonic() - self._checked < SOURCE_CHECK_S):
                return
            await self._declare()
            self._declared, self._checked = True, time.monotonic()

    def _limits(self) -> dict[str, Any]:
        return {"max_age": int(self.settings.web_feed_max_age_s * 1e9), "max_bytes": self.settings.web_feed_max_bytes,
                "num_replicas": self.settings.jetstream_replicas}

    async def _declare(self) -> None:
        feed = await self.info(self.name)
        if feed is None:
            present = {n: i for n in self.sources if (i := await self.info(n)) is not None}
            config = {"name": self.name, "subjects": [], "retention": "limits", "storage": "file",
                      "discard": "old", **self._limits(),
                      "sources": [{"name": n, "opt_start_seq": i["state"]["last_seq"] + 1} for n, i in present.items()]}
            reply = await self._api(f"STREAM.CREATE.{self.name}", config)
            error = reply.get("error")
            if not error:
                self.missing = [n for n in self.sources if n not in present]
                log.info("feed stream created", extra={"stream": self.name, "sources": sorted(present),
                                                       "missing": self.missing})
                return
            if error.get("err_code") != STREAM_NAME_IN_USE:  # another replica may have just made it
                raise FeedUnavailable(f"stream {self.name} could not be created: {error.get('description')}")
            feed = await self.info(self.name)
            if feed is None:
                raise FeedUnavailable(f"stream {self.name} could not be created")
        await self._update(feed)

    async def _update(self, feed: dict[str, Any]) -> None:
        config = feed["config"]
        have = {s.get("name") for s in config.get("sources") or []}
        created = _when(feed.get("created"))
        added = []
        for name in self.sources:
            if name in have or (info := await self.info(name)) is None:
                continue
            # Younger than the feed: everything it holds is news. Older: only what comes next.
            newer = created is not None and (_when(info.get("created")) or created) > created
            added.append({"name": name, "opt_start_seq": 1 if newer else info["state"]["last_seq"] + 1})
        limits = self._limits()
        if added or any(config.get(k) != v for k, v in limits.items()):
            config = {**config, **limits, "sources": [*(config.get("sources") or []), *added]}
            reply = await self._api(f"STREAM.UPDATE.{self.name}", config)
            if reply.get("error"):  # keep serving what exists; say why
                log.warning("feed stream not updated", extra={"stream": self.name,
                                                              "reason": reply["error"].get("description")})
                added = []
            elif added:
                log.info("feed stream sources added",
                         extra={"stream": self.name, "sources": [a["name"] for a in added]})
        now = have | {a["name"] for a in added}
        self.missing = [n for n in self.sources if n not in now]

    async def bounds(self) -> tuple[int, int]:
        """The first and last sequence the stream holds now (first = last + 1 when empty)."""
        info = await self.info(self.name)
        if info is None:
            await self.ensure(force=True)
            info = await self.info(self.name)
            if info is None:
                raise FeedUnavailable(f"stream {self.name} does not exist")
        state = info.get("state", {})
        return int(state.get("first_seq", 0)), int(state.get("last_seq", 0))

    # --- events ---------------------------------------------------------------------------

    def event(self, seq: int, subject: str, headers: dict[str, str] | None, data: bytes,
              ts_ns: int) -> FeedEvent | None:
        """The event stored at ``seq`` (built once; cached for the other clients)."""
        if seq in self._cache:
            return self._cache[seq]
        try:
            event = build_event(seq, subject, headers, data, ts_ns, self.board_of)
        except Exception:  # hostile content never stops a feed; the event is skipped
            log.warning("feed event skipped", exc_info=True, extra={"seq": seq})
            event = None
        self._cache[seq] = event
        if len(self._cache) > CACHE_EVENTS:
            self._cache.popitem(last=False)
        return event


def _when(value: Any) -> datetime | None:
    """A JetStream timestamp (RFC 3339, nanoseconds) as a datetime."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
