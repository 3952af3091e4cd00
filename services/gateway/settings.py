"""The gateway's settings (environment variables with the ``SHARDBUS_`` prefix)."""

from __future__ import annotations

from pydantic import Field, SecretStr

from shared.settings import CommonSettings

PROTOCOL_VERSION = 7
"""The shard protocol version this gateway speaks."""


class GatewaySettings(CommonSettings):
    """Where shards dial in, how they prove who they are, and the wire's limits."""

    shard_host: str = Field(default="127.0.0.1", description="Address the shard listener binds to.")
    shard_port: int = Field(default=2595, ge=0, le=65535,
                            description="TCP port shards dial (0 picks a free one).")
    shard_token: SecretStr = Field(default=SecretStr(""),
                                   description="Token every shard must present in server.hello.")
    max_line_bytes: int = Field(default=1024 * 1024, ge=1024,
                                description="Longest line a shard may send; longer ones are refused.")
    hello_timeout_s: float = Field(default=10.0, gt=0,
                                   description="Time a new connection has to send server.hello.")
    frames_stream: str = Field(default="SHARD_FRAMES",
                               description="JetStream stream that keeps every frame.")
