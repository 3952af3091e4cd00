"""The payloads of the shard-plane subjects websites use, for the gateway's AsyncAPI document
only (``make docs``): nothing here parses or validates a message at runtime. The gateway
defines no schema for a frame's contents (the forwarder property), so these models name only
what is always there and show the sidecar seed's lines as examples (S004 =
``../shared/seeds/004_15575f6fbdbb98d9.txt``). The reference is docs/gateway.md and the
"Gateway command plane" section of docs/contracts.md.

FastStream documents a subscriber's request payload but not its reply, so
:class:`RequestReplyAsyncAPI` adds an AsyncAPI 3 ``reply`` to the operations of the request
subjects (commands, board reads, news), on a channel with no address: NATS delivers a reply to
the request's own reply subject.
"""

from __future__ import annotations

from typing import Any

from faststream.specification import AsyncAPI
from faststream.specification.asyncapi.utils import ref
from faststream.specification.asyncapi.v3_0_0.schema import Channel, Message, Reference
from pydantic import BaseModel, ConfigDict, Field, RootModel

# --- frames and dead letters (the gateway publishes) ------------------------------------


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


# --- commands (request/reply) -------------------------------------------------------------


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


class CommandReply(BaseModel):
    """`{status, body}` with the shard's answer, or `{status, error}` when the gateway
    answers by itself (400, 409, 503, 504). No gateway holding the shard: NATS "no responders"
    (the 503)."""

    model_config = ConfigDict(title="CommandReply")

    status: int = Field(description="200; 425 bridge.busy; 403, 404, 409, 429 or 400 by the answer's plane "
                                    "and reason; 409 protocol gate; 503 no shard; 504 no answer in time.")
    body: ShardAnswer | None = Field(default=None, description="The shard's answer.")
    error: str | None = Field(default=None, description="The gateway's own answer, a sentence.")


# --- boards and news (request/reply) ------------------------------------------------------


class BoardReply(BaseModel):
    """A whole board of one shard, in board order (name or title, then id)."""

    model_config = ConfigDict(title="BoardReply", json_schema_extra={"examples": [
        {"status": 200, "items": [{
            "kind": "guild.update", "id": 7, "name": "The Cartographers", "abbr": "MAP", "members": 2, "online": 1,
            "roster": [{"serial": "0x1", "name": "Ada"}, {"serial": "0x2", "name": "Bo"}]}]},
        {"status": 404, "error": "no board named 'ruleset'; boards: champions, guilds, houses, market, news"},
    ]})

    status: int = Field(description="200; 404 no such board; 503 the bucket cannot be read now.")
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


class NewsReply(BaseModel):
    """The stored item, or why not."""

    model_config = ConfigDict(title="NewsReply")

    status: int = Field(description="200 stored; 400 not an object, or no usable id.")
    item: NewsItem | None = None
    error: str | None = None


# --- the document -------------------------------------------------------------------------


class RequestReplyAsyncAPI(AsyncAPI):
    """FastStream's AsyncAPI 3 document, plus an operation ``reply`` for each request subject
    in ``replies`` (address → reply model)."""

    def __init__(self, *brokers: Any, replies: dict[str, type[BaseModel]], **options: Any) -> None:
        super().__init__(*brokers, **options)
        self.replies = replies

    def to_specification(self) -> Any:
        schema = super().to_specification()
        components = schema.components
        components.messages = components.messages or {}
        components.schemas = components.schemas or {}
        for key, channel in list(schema.channels.items()):
            model = self.replies.get(channel.address or "")
            if model is None:
                continue
            payload = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components.schemas.update(payload.pop("$defs", {}))
            components.schemas[model.__name__] = payload
            reply_key = f"{key}:Reply"
            components.messages[f"{reply_key}:Message"] = Message(
                title=f"{reply_key}:Message", payload=ref("components", "schemas", model.__name__))
            schema.channels[reply_key] = Channel(
                description=f"The reply to {channel.address}, on the request's own reply subject.",
                messages={"Message": Reference(**ref("components", "messages", f"{reply_key}:Message"))})
            for operation in schema.operations.values():
                if getattr(operation.channel, "ref", None) == ref("channels", key)["$ref"]:
                    operation.reply = {"channel": ref("channels", reply_key),
                                       "messages": [ref("channels", reply_key, "messages", "Message")]}
        return schema
