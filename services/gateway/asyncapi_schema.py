"""The payloads of the shard-plane subjects websites use, for the gateway's AsyncAPI document
only (``make docs``): nothing here parses or validates a message at runtime. The gateway
defines no schema for a frame's contents (the forwarder property), so these models name only
what is always there and show the sidecar seed's lines as examples (docs/gateway.md, "Frames"
says what the seed is). The reference is docs/gateway.md and the "Gateway command plane"
section of docs/contracts.md.

FastStream documents a subscriber's request payload but not its reply, so
:class:`RequestReplyAsyncAPI` adds an AsyncAPI 3 ``reply`` to the operations of the request
subjects (commands, board reads, news), on a channel with no address: NATS delivers a reply to
the request's own reply subject.
"""

from __future__ import annotations

from typing import Any

from faststream.specification import AsyncAPI
from faststream.specification.asyncapi.utils import ref
from faststream.specification.asyncapi.v3_0_0.schema import ApplicationSchema, Channel, Components, Message, Reference
from faststream.specification.base import Specification
from pydantic import BaseModel

# Commands, board reads, news and status are the gateway's contract (shared/contracts/gateway.py),
# the models the web door reads the replies with, and so are the frames and dead letters it
# publishes; documented here under their own names.
from shared.contracts.gateway import BoardReply as BoardReply
from shared.contracts.gateway import CommandReply as CommandReply
from shared.contracts.gateway import CommandRequest as CommandRequest
from shared.contracts.gateway import DeadLetter as DeadLetter
from shared.contracts.gateway import Frame as Frame
from shared.contracts.gateway import NewsItem as NewsItem
from shared.contracts.gateway import NewsReply as NewsReply
from shared.contracts.gateway import ShardAnswer as ShardAnswer

# --- the document -------------------------------------------------------------------------


class RequestReplyAsyncAPI(AsyncAPI):
    """FastStream's AsyncAPI 3 document, plus an operation ``reply`` for each request subject
    in ``replies`` (address → reply model)."""

    def __init__(self, *brokers: Any, replies: dict[str, type[BaseModel]], **options: Any) -> None:
        super().__init__(*brokers, **options)
        self.replies = replies

    def to_specification(self) -> Specification:
        schema = super().to_specification()
        if not isinstance(schema, ApplicationSchema):  # a reply is AsyncAPI 3's: other versions as they are
            return schema
        components = schema.components = schema.components or Components()
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
                    # Operation allows extra fields; FastStream does not model AsyncAPI 3's reply.
                    operation.reply = {"channel": ref("channels", reply_key),  # type: ignore[attr-defined]
                                       "messages": [ref("channels", reply_key, "messages", "Message")]}
        return schema
