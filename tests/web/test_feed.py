"""The live feed over real WebSocket and HTTP (SSE): frames from a real gateway and shard
simulator (the seed's frames, docs/gateway.md, "Frames"), board changes,
ledger events, filters, resuming after a disconnect, a client that stops reading, auth.

Each test's door has a feed stream of its own (deleted after), sourcing the session's streams."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from nats.js.api import KeyValueConfig
from websockets.asyncio.client import ClientConnection, connect
from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode
from websockets.uri import parse_uri

from services.ledger.events.event_stream import declare_events_stream
from services.web.feed import stream as feed_stream
from services.web.feed.filter import FeedFilter, consumer_filters
from services.web.feed.hub import FeedHub
from simulator.seed_wire import GUILD_UPDATE
from tests.gateway.conftest import wait_until
from tests.web.conftest import MODULE_TOKENS, OPERATOR_TOKEN, WEBSITE_TOKEN, RunningDoor

WAIT_S = 10.0
"""Longest wait for any one event."""

SEED_GUILD = {k: v for k, v in GUILD_UPDATE.value.items() if k != "kind"}
"""The seed's own guild.update (docs/gateway.md, "Frames"):
``{"kind":"guild.update","id":7,"name":"The Cartographers","abbr":"MAP","members":2,"online":1}``."""


@pytest.fixture
async def feed_door(start_door, gateway, nc, unique) -> AsyncIterator[Callable[..., Awaitable[RunningDoor]]]:
    """Start doors whose feed stream is this test's own (after the gateway made the frames
    stream and the boards' buckets, and the ledger's events stream exists)."""
    await declare_events_stream(nc.jetstream())
    doors: list[RunningDoor] = []

    async def start(**overrides: Any) -> RunningDoor:
        doors.append(await start_door(web_feed_stream=f"WF_{unique}_{len(doors)}", **overrides))
        return doors[-1]

    yield start
    for door in doors:
        # Every feed is over once its client is gone (no session outlives it), then the stream goes.
        hub_ = getattr(door.app.state, "feed", None)
        try:
            if hub_ is not None:
                await wait_until(lambda hub_=hub_: not hub_.clients, timeout=WAIT_S)
        finally:
            with contextlib.suppress(Exception):
                await nc.jetstream().delete_stream(door.settings.web_feed_stream)


@pytest.fixture
async def sockets() -> AsyncIterator[Callable[..., Awaitable[ClientConnection]]]:
    """Open feed WebSockets (``await sockets(door, query)``); all closed after the test."""
    opened: list[ClientConnection] = []

    async def open_(door: RunningDoor, query: dict[str, Any] | None = None, token: str | None = WEBSITE_TOKEN,
                    **options: Any) -> ClientConnection:
        params = {**({"token": token} if token else {}), **(query or {})}
        ws = await connect(f"{door.ws_url}/ws?{urlencode(params)}", open_timeout=WAIT_S, close_timeout=2, **options)
        opened.append(ws)
        return ws

    yield open_
    for ws in opened:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(ws.close(), 5)


async def next_event(ws: ClientConnection, timeout: float = WAIT_S) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


async def events_until(ws: ClientConnection, done: Callable[[list[dict[str, Any]]], bool],
                       timeout: float = WAIT_S) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    async with asyncio.timeout(timeout):
        while not done(got):
            got.append(await next_event(ws, timeout))
    return got


async def closed_with(ws: ClientConnection, timeout: float = WAIT_S) -> tuple[int, str]:
    """Read until the door closes the socket; its close code and reason."""
    with pytest.raises(ConnectionClosed) as info:
        async with asyncio.timeout(timeout):
            while True:
                await ws.recv()
    assert info.value.rcvd is not None, "closed without a close frame"
    return info.value.rcvd.code, info.value.rcvd.reason


def hub(door: RunningDoor) -> FeedHub:
    return door.app.state.feed


async def consumers(nc, stream: str) -> int:
    return (await nc.jetstream().stream_info(stream)).state.consumer_count


# --- live frames and boards -----------------------------------------------------------------


async def test_frames_and_board_changes_arrive_live_each_with_its_cursor(feed_door, sockets, shard_sims, gateway,
                                                                         unique):
    door = await feed_door()
    shard = f"s{unique}"
    ws = await sockets(door, {"shards": shard})
    hello = await next_event(ws)
    assert hello["type"] == "hello" and hello["gap"] is False
    assert hello["filter"] == {"types": ["frame", "board", "ledger"], "shards": [shard], "kinds": None, "boards": None}

    sim = await shard_sims(gateway, shard)
    await sim.send("guild.update", **SEED_GUILD)
    got = await events_until(ws, lambda g: any(e["type"] == "board" for e in g)
                             and any(e.get("kind") == "guild.update" for e in g))
    frame = next(e for e in got if e["type"] == "frame" and e["kind"] == "guild.update")
    assert frame["subject"] == f"shard.{shard}.frame.guild.update" and frame["shard"] == shard
    assert {k: v for k, v in frame["data"].items() if k != "t"} == GUILD_UPDATE.value
    board = next(e for e in got if e["type"] == "board")
    assert board | {"seq": 0, "time": ""} == {
        "seq": 0, "time": "", "type": "board", "subject": f"$KV.BOARD_GUILDS.{shard}.7.snapshot", "shard": shard,
        "board": "guilds", "key": f"{shard}.7.snapshot", "id": "7", "part": "snapshot", "op": "put",
        "data": frame["data"]}
    seqs = [e["seq"] for e in got]
    assert seqs == sorted(seqs) and seqs[0] > hello["seq"]

    await sim.send("guild.remove", id=7)  # the board deletes the guild (docs/gateway.md, "Boards")
    got = await events_until(ws, lambda g: any(e["type"] == "board" for e in g))
    deleted = next(e for e in got if e["type"] == "board")
    assert (deleted["op"], deleted["key"], deleted["data"]) == ("delete", f"{shard}.7.snapshot", None)


async def test_a_filter_by_shard_and_kind_passes_only_those_frames(feed_door, sockets, shard_sims, gateway, unique):
    door = await feed_door()
    ws = await sockets(door, {"shards": f"a{unique}", "kinds": "guild.update,lease.*"})
    assert (await next_event(ws))["filter"]["types"] == ["frame"]  # kinds alone names frames only
    a, b = await shard_sims(gateway, f"a{unique}"), await shard_sims(gateway, f"b{unique}")
    await b.send("guild.update", **SEED_GUILD)
    await a.send("guild.roster", id=7, members=[{"serial": "0x1", "name": "Ada"}])
    await a.send("champ.update", serial="0x4000", bossUp=True)
    await a.send("lease.drifted", key="PlayerCaps.SkillCap", current="1300")
    await a.send("lease.list.ok", leases=[])  # lease.* is one token after lease: not this one
    await a.send("guild.update", **SEED_GUILD)
    got = await events_until(ws, lambda g: any(e.get("kind") == "guild.update" for e in g))
    assert [(e["type"], e["shard"], e["kind"]) for e in got] == [
        ("frame", f"a{unique}", "lease.drifted"), ("frame", f"a{unique}", "guild.update")]
    # NATS filtered them (2.10+ takes several subjects; 2.9 one covering them)
    (reader,) = [c.reading for c in hub(door).clients.values()]
    assert reader.filters in ([f"shard.a{unique}.frame.guild.update", f"shard.a{unique}.frame.lease.*"],
                              [f"shard.a{unique}.frame.*.*"])


def test_filter_subjects_let_nats_filter_without_overlaps():
    wanted = FeedFilter.parse({"shards": ["uo1"], "kinds": ["guild.>,guild.update"]}, ["guilds"])
    subjects_ = wanted.subjects({"guilds": "BOARD_GUILDS"}, "ledger.events.run.*")
    assert subjects_ == ["shard.uo1.frame.guild.>", "shard.uo1.frame.guild.update"]
    assert consumer_filters(subjects_, many=True) == ["shard.uo1.frame.guild.>"]  # they overlap: one cover
    everything = FeedFilter.parse({}, ["guilds"]).subjects({"guilds": "BOARD_GUILDS"}, "ledger.events.run.*")
    assert consumer_filters(everything, many=True) == ["shard.*.frame.>", "$KV.BOARD_GUILDS.>", "ledger.events.run.*"]
    assert consumer_filters(everything, many=False) == ["*.*.>"]
    assert wanted.matches("frame", "uo1", "guild.roster", None)
    assert not wanted.matches("frame", "uo2", "guild.roster", None)
    assert not wanted.matches("frame", "uo1", "guild", None)  # > needs one token more


# --- resuming -------------------------------------------------------------------------------


async def test_resuming_after_a_disconnect_loses_nothing_and_repeats_nothing(feed_door, sockets, shard_sims,
                                                                             gateway, unique):
    door = await feed_door()
    shard = f"s{unique}"
    sim = await shard_sims(gateway, shard)
    query = {"types": "frame", "shards": shard}
    first = await sockets(door, query)
    await next_event(first)
    for i in range(5):
        await sim.send("mob.killed", i=i)
    seen = await events_until(first, lambda g: len(g) == 5)
    await first.close()

    for i in range(5, 10):  # while nobody listens
        await sim.send("mob.killed", i=i)
    again = await sockets(door, {**query, "since": seen[-1]["seq"]})
    hello = await next_event(again)
    assert (hello["seq"], hello["gap"]) == (seen[-1]["seq"], False)
    seen += await events_until(again, lambda g: len(g) == 5)
    for i in range(10, 15):  # then live, on the same socket
        await sim.send("mob.killed", i=i)
    seen += await events_until(again, lambda g: len(g) == 5)
    assert [e["data"]["i"] for e in seen] == list(range(15))
    assert [e["seq"] for e in seen] == sorted({e["seq"] for e in seen})


async def test_a_cursor_the_stream_no_longer_holds_says_gap(feed_door, sockets):
    door = await feed_door()
    ws = await sockets(door, {"since": 10 ** 15})
    hello = await next_event(ws)
    assert hello["gap"] is True and hello["seq"] == hello["last"]


class SseReader:
    """Events of one SSE response (``id``, ``event``, ``data`` parsed as JSON)."""

    def __init__(self, response: httpx.Response) -> None:
        self.lines = response.aiter_lines()

    async def next(self, count: int, timeout: float = WAIT_S) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        current: dict[str, Any] = {}
        async with asyncio.timeout(timeout):
            while len(got) < count:
                line = await anext(self.lines)
                if line == "":
                    if "data" in current:
                        got.append(current)
                    current = {}
                elif not line.startswith(":"):
                    name, _, value = line.partition(":")
                    current[name] = json.loads(value.strip()) if name == "data" else value.strip()
        return got


async def test_server_sent_events_resume_with_last_event_id(feed_door, shard_sims, gateway, unique):
    door = await feed_door()
    shard = f"s{unique}"
    sim = await shard_sims(gateway, shard)
    async with door.client() as http:
        async with http.stream("GET", "/events", params={"types": "frame", "shards": shard}) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            events = SseReader(response)
            hello = (await events.next(1))[0]
            assert hello["data"]["type"] == "hello" and hello["id"] == str(hello["data"]["seq"])
            for i in range(3):
                await sim.send("mob.killed", i=i)
            first = await events.next(3)
        for i in range(3, 6):
            await sim.send("mob.killed", i=i)
        headers = {"Last-Event-ID": first[-1]["id"]}
        # since= in the URL is older: the browser's Last-Event-ID wins
        async with http.stream("GET", "/events", params={"types": "frame", "shards": shard, "since": "1"},
                               headers=headers) as response:
            events = SseReader(response)
            assert (await events.next(1))[0]["data"]["seq"] == first[-1]["data"]["seq"]
            rest = await events.next(3)
    assert [e["data"]["data"]["i"] for e in first + rest] == list(range(6))
    assert [int(e["id"]) for e in first + rest] == [e["data"]["seq"] for e in first + rest]


async def test_a_board_whose_bucket_appears_later_joins_the_feed(feed_door, sockets, nc, unique, monkeypatch):
    # The door sources only streams that exist, and looks again for the others.
    monkeypatch.setattr(feed_stream, "SOURCE_CHECK_S", 0.2)
    door = await feed_door(board_bucket_prefix=f"B{unique}")
    ws = await sockets(door, {"types": "board"})
    await next_event(ws)
    assert f"KV_B{unique}_GUILDS" in hub(door).stream.missing
    kv = await nc.jetstream().create_key_value(KeyValueConfig(bucket=f"B{unique}_GUILDS", history=1))
    try:
        await kv.put("uo1.7.snapshot", json.dumps(GUILD_UPDATE.value).encode())
        event = await next_event(ws, 15)
        assert (event["board"], event["key"], event["op"], event["data"]) == (
            "guilds", "uo1.7.snapshot", "put", GUILD_UPDATE.value)
    finally:
        await nc.jetstream().delete_key_value(f"B{unique}_GUILDS")


# --- ledger events ----------------------------------------------------------------------------


async def test_ledger_events_are_on_the_feed_filtered_by_their_runs_shard(feed_door, sockets, nc, unique):
    door = await feed_door()
    ws = await sockets(door, {"types": "ledger", "shards": f"s{unique}"})
    await next_event(ws)
    other = {"type": "run.created", "run": {"runId": f"o{unique}", "shard": f"t{unique}", "status": "scheduled"}}
    mine = {"type": "run.status", "run": {"runId": f"r{unique}", "shard": f"s{unique}", "status": "running"}}
    await nc.publish(f"ledger.events.run.o{unique}", json.dumps(other).encode())
    await nc.publish(f"ledger.events.run.r{unique}", json.dumps(mine).encode())
    event = await next_event(ws)
    assert {k: event[k] for k in ("type", "subject", "run", "shard", "data")} == {
        "type": "ledger", "subject": f"ledger.events.run.r{unique}", "run": f"r{unique}", "shard": f"s{unique}",
        "data": mine}


async def test_a_payload_that_is_not_json_is_carried_as_null_and_the_feed_goes_on(feed_door, sockets, nc, unique):
    door = await feed_door()
    ws = await sockets(door, {"types": "ledger"})
    await next_event(ws)
    for payload in (b"not json", b'{"x": NaN}', b"\xff\xfe", b"[" * 100_000):  # anyone may publish there
        await nc.publish(f"ledger.events.run.h{unique}", payload)
    await nc.publish(f"ledger.events.run.h{unique}", b'{"type":"run.created","run":{"runId":"h"}}\n')
    got = await events_until(ws, lambda g: len(g) == 5)
    assert [e["data"] for e in got] == [None, None, None, None, {"type": "run.created", "run": {"runId": "h"}}]
    assert all(e["run"] == f"h{unique}" and "shard" not in e for e in got)


async def test_the_token_in_the_url_is_never_logged(feed_door, sockets, caplog):
    door = await feed_door()
    caplog.set_level(logging.DEBUG)
    await next_event(await sockets(door))
    header = await connect(f"{door.ws_url}/ws", additional_headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"},
                           open_timeout=WAIT_S)
    try:
        await next_event(header)
    finally:
        await header.close()
    async with door.client(None) as http, \
            http.stream("GET", "/events", params={"token": WEBSITE_TOKEN, "types": "frame"}) as response:
        await SseReader(response).next(1)
    door_lines = "\n".join(r.getMessage() for r in caplog.records  # not the test's own clients
                           if not r.name.startswith(("httpx", "httpcore", "websockets.client")))
    assert "GET /ws?token=***" in door_lines and "authorization: Bearer ***" in door_lines  # uvicorn at DEBUG
    assert WEBSITE_TOKEN not in door_lines and OPERATOR_TOKEN not in door_lines


# --- a client that stops reading ---------------------------------------------------------------


class StalledClient:
    """A feed client that reads nothing until told to: a plain socket with a small receive
    buffer (so the door's writes back up soon), speaking WebSocket through websockets'
    sans-I/O protocol, or plain HTTP for SSE."""

    def __init__(self, door: RunningDoor, path: str) -> None:
        self.port, self.path = int(door.url.rsplit(":", 1)[1]), path
        self.websocket = ClientProtocol(parse_uri(f"{door.ws_url}{path}"), max_size=None) \
            if path.startswith("/ws") else None
        self.texts: list[str] = []  # WebSocket messages, or the SSE stream's text
        self.sock = socket.socket()

    async def open(self) -> None:
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_connect(self.sock, ("127.0.0.1", self.port))
        if self.websocket:
            self.websocket.send_request(self.websocket.connect())
            await self._flush()
        else:
            await loop.sock_sendall(self.sock, f"GET {self.path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        async with asyncio.timeout(WAIT_S):
            while not self.texts:
                await self.read()

    async def _flush(self) -> None:
        for data in self.websocket.data_to_send():
            if data:
                await asyncio.get_running_loop().sock_sendall(self.sock, data)

    async def read(self) -> bool:
        """One read; False at the end of the connection."""
        data = await asyncio.get_running_loop().sock_recv(self.sock, 65536)
        if self.websocket is None:
            self.texts.append(data.decode(errors="replace"))
            return bool(data)
        self.websocket.receive_data(data) if data else self.websocket.receive_eof()
        await self._flush()
        self.texts += [e.data.decode() for e in self.websocket.events_received()
                       if isinstance(e, Frame) and e.opcode is Opcode.TEXT]
        return bool(data)

    async def read_to_end(self, timeout: float = WAIT_S) -> None:
        async with asyncio.timeout(timeout):
            while await self.read():
                pass


@pytest.mark.parametrize("transport", ["ws", "sse"])
async def test_a_client_that_stops_reading_is_dropped_with_the_reason_and_its_queue_stays_bounded(
        feed_door, nc, unique, transport):
    cap = 64 * 1024
    door = await feed_door(web_feed_queue_bytes=cap, web_feed_queue_messages=1000, web_feed_stall_s=1.0)
    shard = f"s{unique}"
    query = urlencode({"token": WEBSITE_TOKEN, "types": "frame", "shards": shard})
    client = StalledClient(door, f"/{'ws' if transport == 'ws' else 'events'}?{query}")
    try:
        await client.open()  # the hello; from now on it reads nothing
        line = json.dumps({"kind": "mob.killed", "pad": "x" * 2000}).encode()
        queued: list[int] = []
        async with asyncio.timeout(30):
            while not hub(door).dropped:
                for _ in range(100):
                    await nc.publish(f"shard.{shard}.frame.mob.killed", line)
                await nc.flush()
                queued += [c.queue.bytes for c in hub(door).clients.values()]
                await asyncio.sleep(0.02)
        dropped = hub(door).dropped[-1]
        assert re.fullmatch(r"too slow: \d+ KiB queued, none taken for 1 s; resume with since=\d+", dropped.dropped)
        assert max(queued) <= cap and cap // 2 < dropped.queue.peak_bytes <= cap

        await client.read_to_end()  # reading again: what was sent, then the reason
        if client.websocket:
            close = client.websocket.close_rcvd
            assert close is not None and (close.code, close.reason) == (1008, dropped.dropped)
            assert json.loads(client.texts[-1])["seq"] == dropped.last_seq
        else:
            text = "".join(client.texts)
            assert f'event: dropped\ndata: {{"type":"dropped","reason":"{dropped.dropped}",' \
                   f'"seq":{dropped.last_seq}}}' in text
        await wait_until(lambda: not hub(door).clients)
        async with asyncio.timeout(WAIT_S):
            while await consumers(nc, door.settings.web_feed_stream):
                await asyncio.sleep(0.05)
    finally:
        client.sock.close()


async def test_idle_clients_hold_little_of_the_pull_budget(feed_door, sockets, nc, unique):
    # 4 MiB to share, 1 MiB queues: were idle clients to ask for all their room, four would hold it all
    # until their pulls expired, and the ninth client would wait that long for its first event.
    door = await feed_door(web_feed_pull_bytes=4 * 1024 * 1024, web_feed_queue_bytes=1024 * 1024)
    for i in range(8):
        await next_event(await sockets(door, {"types": "frame", "shards": f"idle{i}{unique}"}))
    ws = await sockets(door, {"types": "frame", "shards": f"s{unique}"})
    await next_event(ws)
    await asyncio.sleep(0.3)  # every reader has made its first pull
    await nc.publish(f"shard.s{unique}.frame.mob.killed", b'{"kind":"mob.killed"}')
    assert (await next_event(ws, 3))["kind"] == "mob.killed"
    assert hub(door).budget.total - hub(door).budget.free <= 9 * 64 * 1024


# --- auth, filters, limits --------------------------------------------------------------------


async def test_the_feed_needs_the_website_or_operator_token(feed_door, sockets):
    door = await feed_door()
    assert await closed_with(await sockets(door, token=None)) == (
        4401, "missing token: send 'Authorization: Bearer <token>', or ?token=<token> where headers cannot be set")
    assert await closed_with(await sockets(door, token="not-a-token")) == (4401, "the bearer token is not valid here")
    assert await closed_with(await sockets(door, token=MODULE_TOKENS["events"])) == (
        4403, "a module's token cannot read the feed: use the website's or the operator's token")
    assert (await next_event(await sockets(door, token=OPERATOR_TOKEN)))["type"] == "hello"
    header = await connect(f"{door.ws_url}/ws", additional_headers={"Authorization": f"Bearer {WEBSITE_TOKEN}"},
                           open_timeout=WAIT_S)
    try:
        assert (await next_event(header))["type"] == "hello"
    finally:
        await header.close()

    async with door.client(None) as http:
        refused = await http.get("/events")
        assert refused.status_code == 401 and refused.json()["error"].startswith("missing token")
        refused = await http.get("/events", headers={"Authorization": f"Bearer {MODULE_TOKENS['quests']}"})
        assert refused.status_code == 403 and "module" in refused.json()["error"]
        async with http.stream("GET", "/events", params={"token": WEBSITE_TOKEN}) as response:
            assert response.status_code == 200
            assert (await SseReader(response).next(1))[0]["data"]["type"] == "hello"


@pytest.mark.parametrize(("query", "said"), [
    ({"shards": "uo1,UO2!"}, "shards: 'UO2!' is not a shard id"),
    ({"kinds": "guild update"}, "kinds: 'guild update' is not a frame kind"),
    ({"kinds": "guild.>.x"}, "kinds: 'guild.>.x' is not a frame kind"),
    ({"types": "frame,gossip"}, "types: 'gossip' is no event type"),
    ({"boards": "ruleset"}, "boards: 'ruleset' is no board"),
    ({"since": "-1"}, "since: '-1' is not a feed sequence"),
    ({"since": "9" * 30}, "since: '999999999999999999999999999999' is not a feed sequence"),
    ({"types": "ledger", "kinds": "guild.update"}, "kinds: narrows frames, but types leaves frames out"),
])
async def test_a_bad_filter_value_is_refused_naming_it(feed_door, sockets, query, said):
    door = await feed_door()
    code, reason = await closed_with(await sockets(door, query))
    assert code == 4400 and reason.startswith(said)
    async with door.client() as http:
        refused = await http.get("/events", params=query)
    assert refused.status_code == 400 and refused.json()["error"].startswith(said)


async def test_clients_beyond_the_limit_are_refused_and_a_gone_client_leaves_nothing(feed_door, sockets, nc):
    door = await feed_door(web_feed_max_clients=2)
    first, second = await sockets(door), await sockets(door)
    await next_event(first), await next_event(second)
    code, reason = await closed_with(await sockets(door))
    assert (code, reason) == (1013, "too many feed clients (2 connected); try again later")
    async with door.client() as http:
        refused = await http.get("/events")
    assert refused.status_code == 503 and refused.headers["retry-after"] == "5"
    assert await consumers(nc, door.settings.web_feed_stream) == 1  # the same filter: one shared consumer
    await first.close(), await second.close()
    await wait_until(lambda: not hub(door).clients)
    async with asyncio.timeout(WAIT_S):
        while await consumers(nc, door.settings.web_feed_stream):
            await asyncio.sleep(0.05)
