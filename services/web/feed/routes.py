"""The live feed: ``GET /ws`` (WebSocket) and ``GET /events`` (server-sent events) stream the
shards' frames, the boards' changes and the ledger's run events, one JSON object each, every
one with ``seq``, the feed's cursor: ``since=<seq>`` (or SSE's ``Last-Event-ID``) resumes after
it with nothing missed or repeated. docs/web.md, "Live feed", is the contract.

This module is the HTTP side: who may read (a header, or ``?token=`` since a browser's
WebSocket and EventSource cannot set one), the query, and the two transports. The clients'
bookkeeping and writing loop are hub.py's; reading from NATS, reader.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qsl, urlencode

from fastapi import APIRouter, FastAPI, HTTPException, Request, WebSocket
from fastapi.responses import Response
from starlette.types import Receive, Scope, Send

from services.web.auth import Caller
from services.web.feed.filter import FeedFilter, FeedQueryError, sequence
from services.web.feed.hub import FeedClient, FeedFull, FeedHub
from services.web.feed.stream import FeedEvent, FeedUnavailable

log = logging.getLogger("shardbus.web.feed")
router = APIRouter()

SSE_CHUNK_BYTES = 64 * 1024
"""Events already queued are written to an SSE client together, up to about this much."""

WS_BATCH_BYTES = 64 * 1024
"""Events already queued are taken for a WebSocket client together, up to about this much
(written one message each): one wake-up of its writer for many (bench/web_feed.py)."""

SSE_RETRY_MS = 2000
"""How long a browser's EventSource waits before reconnecting (sent as ``retry:``)."""

NO_TOKEN = "missing token: send 'Authorization: Bearer <token>', or ?token=<token> where headers cannot be set"
MODULE_REFUSED = "a module's token cannot read the feed: use the website's or the operator's token"


class _HideTokens(logging.Filter):
    """uvicorn's WebSocket layer logs each request line and header at DEBUG: mask ``token=``
    values and bearer tokens there (the route also removes ``token`` from the query first)."""

    _TOKEN = re.compile(r"(token=)[^&\s\"]*")
    _BEARER = re.compile(r"(?i)(authorization:\s*\S+\s+)\S+")

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "token=" in text or "uthorization" in text:
            record.msg, record.args = self._BEARER.sub(r"\1***", self._TOKEN.sub(r"\1***", text)), ()
        return True


logging.getLogger("uvicorn.error").addFilter(_HideTokens())


def feed_hub(app: FastAPI) -> FeedHub:
    """The door's hub, made at first use (the NATS connection is set after the app is built)."""
    hub = getattr(app.state, "feed", None)
    if hub is None:
        if app.state.nc is None:
            raise HTTPException(HTTPStatus.SERVICE_UNAVAILABLE,
                                "the door is not connected to NATS yet; try again shortly")
        hub = app.state.feed = FeedHub(app.state.nc, app.state.settings)
    return hub


def _take_token(scope: Scope) -> tuple[str | None, dict[str, list[str]]]:
    """The ``token`` query parameter, removed from the request before anything (uvicorn's own
    log lines included) can print its URL; and the other parameters."""
    pairs = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    token = next((v for k, v in reversed(pairs) if k == "token"), None)
    rest = [(k, v) for k, v in pairs if k != "token"]
    scope["query_string"] = urlencode(rest).encode("latin-1", "replace")
    query: dict[str, list[str]] = {}
    for key, value in rest:
        query.setdefault(key, []).append(value)
    return token, query


def _caller(app: FastAPI, authorization: str | None, token: str | None) -> Caller:
    """The website or the operator (header first, else ``?token=``); 401 / 403 otherwise."""
    if not authorization and not token:
        raise HTTPException(HTTPStatus.UNAUTHORIZED, NO_TOKEN, headers={"WWW-Authenticate": "Bearer"})
    caller: Caller = app.state.tokens.caller(authorization or f"Bearer {token}")
    if caller.role == "module":
        raise HTTPException(HTTPStatus.FORBIDDEN, MODULE_REFUSED)
    return caller


def _wanted(app: FastAPI, query: dict[str, list[str]], last_event_id: str | None) -> tuple[FeedFilter, int | None]:
    """The filter and the cursor (``Last-Event-ID`` over ``since``: the browser sends it on
    reconnecting to the same URL, so it is the newer); 400 naming a bad value."""
    try:
        wanted = FeedFilter.parse(query, app.state.settings.web_feed_boards)
        given = query.get("since")
        since = sequence("since", given[-1] if given else None)
        if last_event_id is not None:
            since = sequence("Last-Event-ID", last_event_id.strip())
    except FeedQueryError as exc:
        raise HTTPException(HTTPStatus.BAD_REQUEST, str(exc)) from None
    return wanted, since


def _close_reason(text: str) -> str:
    """A WebSocket close reason: at most 123 bytes of UTF-8."""
    data = text.encode()
    return text if len(data) <= 123 else data[:120].decode(errors="ignore") + "..."


# --- WebSocket --------------------------------------------------------------------------


@router.websocket("/ws")
async def feed_ws(websocket: WebSocket) -> None:
    """The feed over WebSocket: one JSON text message per event. Refusals close the socket
    with 4000 + the HTTP status (4400 bad query, 4401 no or wrong token, 4403 a module's
    token, 4503 the door not ready) or 1013 (too many clients), the reason naming why."""
    app = websocket.app
    token, query = _take_token(websocket.scope)
    client: FeedClient | None = None
    try:
        _caller(app, websocket.headers.get("authorization"), token)
        wanted, since = _wanted(app, query, None)
        hub = feed_hub(app)
        client = hub.admit("ws")
        hello = await hub.open(client, wanted, since)
    except (HTTPException, FeedFull, FeedUnavailable) as exc:
        if client is not None:
            hub.release(client)
        code, reason = _refusal(exc)
        with contextlib.suppress(Exception):  # accepted first: a browser sees only a close's reason
            await websocket.accept()
            await websocket.close(code, _close_reason(reason))
        return
    except BaseException:
        if client is not None:
            hub.release(client)
        raise
    try:
        await websocket.accept()
        await websocket.send_text(json.dumps(hello, separators=(",", ":")))

        async def send(batch: list[FeedEvent]) -> None:
            for event in batch:
                await websocket.send_text(event.text)
                client.last_seq = event.seq  # a batch cut short still leaves the right cursor

        async def gone() -> None:
            while (await websocket.receive())["type"] != "websocket.disconnect":
                pass  # what a client sends is not read: the feed is one way

        # Events already queued go out in one wake-up of the writer (one message each still).
        dropped = await hub.serve(client, send, None, gone, WS_BATCH_BYTES)
        if dropped:
            code = 1001 if hub.stopping.is_set() else 1008
            with contextlib.suppress(Exception):
                await asyncio.wait_for(websocket.close(code, _close_reason(dropped)), hub.close_grace_s())
    except Exception:  # noqa: BLE001 — the client went mid-send: nothing to tell it
        pass
    finally:
        hub.release(client)


def _refusal(exc: HTTPException | FeedFull | FeedUnavailable) -> tuple[int, str]:
    """A refusal as a WebSocket close: 1013 (try again later) when full, 1011 when NATS
    cannot serve the feed now, else 4000 + the HTTP status."""
    if isinstance(exc, FeedFull):
        return 1013, str(exc)
    if isinstance(exc, FeedUnavailable):
        return 1011, f"the feed is unavailable now ({exc}); try again shortly"
    return 4000 + exc.status_code, str(exc.detail)


# --- server-sent events -----------------------------------------------------------------


@router.get("/events", summary="The live feed as server-sent events")
async def feed_events(request: Request) -> Response:
    """The feed as ``text/event-stream``: each event ``id: <seq>`` and ``data: <the JSON>``;
    the browser's ``Last-Event-ID`` resumes. A dropped client gets ``event: dropped``."""
    app = request.app
    token, query = _take_token(request.scope)
    _caller(app, request.headers.get("authorization"), token)
    wanted, since = _wanted(app, query, request.headers.get("last-event-id"))
    return await open_event_stream(app, wanted, since)


async def open_event_stream(app: Any, wanted: Any, since: int | None) -> EventStream:
    """An SSE client admitted to the hub and opened at ``since``, or a 503 saying why not
    (the door is full, or the feed's stream is away). Also the console's feed."""
    hub = feed_hub(app)
    try:
        client = hub.admit("sse")
    except FeedFull as exc:
        raise HTTPException(HTTPStatus.SERVICE_UNAVAILABLE, str(exc), headers={"Retry-After": "5"}) from None
    try:
        hello = await hub.open(client, wanted, since)
    except FeedUnavailable as exc:
        hub.release(client)
        raise HTTPException(HTTPStatus.SERVICE_UNAVAILABLE, f"the feed is unavailable now ({exc}); try again shortly",
                            headers={"Retry-After": "5"}) from None
    except BaseException:
        hub.release(client)
        raise
    return EventStream(hub, client, hello)


class EventStream(Response):
    """The SSE response: written by hand (not StreamingResponse) so that a write the client
    does not take can time out, and its disconnect is seen while nothing is sent."""

    def __init__(self, hub: FeedHub, client: FeedClient, hello: dict[str, Any]) -> None:
        # Not Response.__init__: it would announce a Content-Length of 0.
        self.status_code, self.background = HTTPStatus.OK, None
        self.raw_headers = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                            (b"x-accel-buffering", b"no")]  # nginx: pass each event on at once
        self.hub, self.client, self.hello = hub, client, hello

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hub, client = self.hub, self.client
        try:
            await send({"type": "http.response.start", "status": HTTPStatus.OK, "headers": self.raw_headers})
            hello = json.dumps(self.hello, separators=(",", ":"))
            first = f"retry: {SSE_RETRY_MS}\nid: {self.hello['seq']}\ndata: {hello}\n\n"
            await send({"type": "http.response.body", "body": first.encode(), "more_body": True})

            async def write(batch: list[FeedEvent]) -> None:
                body = "".join(f"id: {e.seq}\ndata: {e.text}\n\n" for e in batch).encode()
                await send({"type": "http.response.body", "body": body, "more_body": True})

            async def keepalive() -> None:
                await send({"type": "http.response.body", "body": b": keep-alive\n\n", "more_body": True})

            async def gone() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass

            reason = await hub.serve(client, write, keepalive, gone, SSE_CHUNK_BYTES)
            if reason:
                dropped = json.dumps({"type": "dropped", "reason": reason, "seq": client.last_seq},
                                     separators=(",", ":"))
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(send({"type": "http.response.body", "more_body": True,
                                                 "body": f"event: dropped\ndata: {dropped}\n\n".encode()}),
                                           hub.close_grace_s())
            with contextlib.suppress(Exception):
                await asyncio.wait_for(send({"type": "http.response.body", "body": b"", "more_body": False}), 1.0)
        except Exception:  # noqa: BLE001 — the client went mid-send (uvicorn's ClientDisconnected is an OSError)
            pass
        finally:
            hub.release(client)
