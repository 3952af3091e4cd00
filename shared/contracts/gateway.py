"""The gateway's contract (docs/contracts.md, "Gateway command plane"): what a command, a board
read, a news addition and ``gateway.status`` take and answer, written once for the gateway and
its clients (the web door's sidecar routes and console, ``shardbus status``; the cleanup service
reads the shard's answer inside ``body`` by the seed's own rules, services/cleanup/classify.py).

A command's body and the shard's answer are the shard's (the forwarder property: the gateway
defines no schema for them), so their models name only what is always there and keep the rest.
The replies are the gateway's own: their models name every field it sends."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, RootModel

from shared import subjects
from shared.contracts import Contract
from shared.replies import Reply

BOARDS_QUEUE = "gateway-boards"
"""The queue group of board reads: any replica answers (the boards live in JetStream buckets)."""

NEWS_QUEUE = "gateway-news"
"""The queue group of news additions: any replica stores the item and announces it."""


class CommandRequest(BaseModel):
    """The command's body (empty or null = `{}`). The shard receives it verbatim with
    `kind` = the subject's verb and a fresh `reqId`. Optional header `Shard-Protocol`:
    the protocol the caller expects (409 if the shard speaks another)."""

    model_config = ConfigDict(extra="allow", title="CommandRequest", json_schema_extra={"examples": [
        {"key": "PlayerCaps.SkillCap", "value": "1300", "holdMs": 600_000, "untilMs": 1733000600000,
         "runId": "42", "idempotencyKey": "run42:step3"},
        {"runId": "42", "what": "creature", "map": "Felucca", "x": 1400, "y": 1600},
        {"actor": "gm-ada", "account": "alice", "durationSec": 3600, "reason": "spam"},
    ]})

    actor: str | None = Field(default=None, description="Who is acting: required by the staff verbs (admin.*).")
    runId: str | None = Field(default=None, description="The run acting, on the event plane.")
    idempotencyKey: Any = Field(default=None, description="Passed through untouched: a repeat is answered "
                                                          "with the original answer (replayed: true).")


class ShardAnswer(BaseModel):
    """The shard's answer line, verbatim."""

    model_config = ConfigDict(extra="allow", title="ShardAnswer", json_schema_extra={"examples": [
        {"t": 1733000000123, "kind": "lease.ok", "key": "PlayerCaps.SkillCap", "value": "1300",
         "baseline": "1200", "untilMs": 1733000600123, "reqId": "5f0c2a9e41b7-1f"},
        {"t": 1733000000123, "kind": "lease.drifted", "key": "PlayerCaps.SkillCap", "current": "1300",
         "reqId": "5f0c2a9e41b7-20"},
        {"t": 1733000000123, "kind": "oneshot.error",
         "reason": "run 42 has no participation ledger open on this shard", "reqId": "5f0c2a9e41b7-21"},
    ]})

    kind: str = Field(description="The answer's kind: <verb>.ok and the like, <plane>.error, bridge.busy, "
                                  "lease.drifted.")
    reqId: str = Field(description="The reqId the gateway sent with the command.")
    t: int | None = Field(default=None, description="Shard time in ms.")
    reason: str | None = Field(default=None, description="Why, on an error answer: the status follows it.")
    replayed: bool | None = Field(default=None, description="True on the original answer to a repeated "
                                                            "idempotencyKey.")


class CommandReply(Reply):
    """`{status, body}` with the shard's answer, or `{status, error}` when the gateway
    answers by itself (400, 409, 503, 504). No gateway holding the shard: NATS "no responders"
    (the 503)."""

    model_config = ConfigDict(title="CommandReply", extra="allow")

    status: int = Field(description="200; 425 bridge.busy; 403, 404, 409, 429 or 400 by the answer's plane "
                                    "and reason; 409 protocol gate; 503 no shard; 504 no answer in time.")
    body: ShardAnswer | None = Field(default=None, description="The shard's answer.")
    error: str | None = Field(default=None, description="The gateway's own answer, a sentence.")


class BoardRequest(BaseModel):
    """A board read's body: ignored (send `{}` or nothing)."""

    model_config = ConfigDict(extra="allow", title="BoardRequest")


class BoardReply(Reply):
    """A whole board of one shard, in board order (name or title, then id)."""

    model_config = ConfigDict(title="BoardReply", extra="allow", json_schema_extra={"examples": [
        {"status": 200, "items": [{
            "kind": "guild.update", "id": 7, "name": "The Cartographers", "abbr": "MAP", "members": 2, "online": 1,
            "roster": [{"serial": "0x1", "name": "Ada"}, {"serial": "0x2", "name": "Bo"}]}]},
        {"status": 404, "error": "no board named 'ruleset'; boards: champions, guilds, houses, market, news"},
    ]})

    status: int = Field(description="200; 400 the shard token is not a shard id; 404 no such board; "
                                    "503 the bucket cannot be read now.")
    items: list[dict[str, Any]] | None = Field(default=None, description="Each item is the frame the shard "
                                               "sent (guilds: the snapshot, with the roster as roster).")
    error: str | None = None


class NewsItem(BaseModel):
    """A news item the website adds; every field besides `id` is the website's. The shard
    receives it as `news.add` with `announce` (true now, false when replayed after a hello)."""

    model_config = ConfigDict(extra="allow", title="NewsItem", json_schema_extra={"examples": [
        {"id": "n17", "title": "Server restart at 04:00", "body": "…"},
    ]})

    id: str | int = Field(description="Letters and digits; an item with the same id is replaced.")


class NewsReply(Reply):
    """The stored item, or why not."""

    model_config = ConfigDict(title="NewsReply", extra="allow")

    status: int = Field(description="200 stored; 400 not an object, or no usable id.")
    item: NewsItem | None = None
    error: str | None = None


class StatusRequest(BaseModel):
    """``gateway.status``'s body: ignored."""

    model_config = ConfigDict(extra="allow", title="GatewayStatusRequest")


class ShardLinkStatus(BaseModel):
    """One connected shard, as the replica holding it sees it."""

    model_config = ConfigDict(extra="allow", title="ShardLinkStatus")

    shard: str
    protocol: int
    connectedAt: int = Field(description="Epoch ms of the hello.")
    lastLineAt: int = Field(description="Epoch ms of the shard's last line.")
    silentForS: float = Field(description="Seconds since that line.")
    frames: int
    deadLetters: int
    unpublished: int = Field(description="Frames taken but not yet stored in JetStream.")
    boardWritesPending: int


class StatusReply(Reply):
    """Every shard this replica holds (each replica answers; gather the replies), or 503 while it
    is starting."""

    model_config = ConfigDict(title="GatewayStatusReply", extra="allow")

    shards: list[ShardLinkStatus] | None = None


# --- frames and dead letters (the gateway publishes; for its AsyncAPI document, not parsed) ---


class Frame(BaseModel):
    """A line the shard sent, published verbatim (`server.hello` without its `token`).
    Every field besides `kind` is the shard's; see docs/gateway.md, "Frames", for every
    kind a seed shard sends."""

    model_config = ConfigDict(extra="allow", title="Frame", json_schema_extra={"examples": [
        {"t": 1733000000000, "kind": "server.hello", "shard": "uo1", "protocol": 7},
        {"kind": "guild.update", "id": 7, "name": "The Cartographers", "abbr": "MAP", "members": 2, "online": 1},
        {"kind": "guild.roster", "id": 7, "seq": 0, "more": False,
         "members": [{"serial": "0x1", "name": "Ada"}, {"serial": "0x2", "name": "Bo"}]},
    ]})

    kind: str = Field(description="The frame's kind: the subject's last tokens (e.g. guild.update).")
    t: int | None = Field(default=None, description="Shard time in ms, when the shard sent it.")


class DeadLetter(RootModel[str]):
    """A line the gateway could not publish as a frame (malformed JSON, not an object, no or an
    unsafe `kind`), or a board frame whose id is unusable (also published as a frame): the
    line's bytes as received, with the reason in the `Shardbus-Reason` header."""

    model_config = ConfigDict(title="DeadLetter")


CONTRACTS: tuple[Contract, ...] = (
    Contract(subjects.command("{shard}", "{verb}"), "gateway", CommandRequest, CommandReply),
    Contract(subjects.board("{shard}", "{name}"), "gateway", BoardRequest, BoardReply, BOARDS_QUEUE),
    Contract(subjects.news_add("{shard}"), "gateway", NewsItem, NewsReply, NEWS_QUEUE),
    Contract(subjects.GATEWAY_STATUS, "gateway", StatusRequest, StatusReply),
)
"""Every request/reply subject the gateway answers. A command is answered by the one replica
holding the shard's connection (no queue group: it alone subscribes); ``gateway.status`` by
every replica."""
