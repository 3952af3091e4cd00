"""The gateway's settings (environment variables with the ``SHARDBUS_`` prefix)."""

from __future__ import annotations

from pydantic import Field, SecretStr, model_validator

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
    shard_tokens: dict[str, SecretStr] = Field(
        default_factory=dict,
        description="Per-shard tokens as JSON (e.g. {\"uo1\": \"…\"}); a shard listed here must "
        "present its own token, any other shard the common one.")
    max_line_bytes: int = Field(default=1024 * 1024, ge=1024,
                                description="Longest line a shard may send; longer ones are refused. "
                                "Lowered at start to what NATS's max_payload leaves after headers.")
    hello_timeout_s: float = Field(default=10.0, gt=0,
                                   description="Time a new connection has to send server.hello (on a TLS "
                                   "listener, to finish its handshake and send it).")
    shard_tls_cert: str = Field(default="", description="PEM certificate (with its chain) of the shard "
                                "listener; set with SHARDBUS_SHARD_TLS_KEY, shards must dial TLS. Reloaded "
                                "when the file changes or on SIGHUP.")
    shard_tls_key: str = Field(default="", description="PEM private key of SHARDBUS_SHARD_TLS_CERT.")
    shard_tls_ca: str = Field(default="", description="PEM CA file; when set, every shard must present a "
                              "client certificate it signed, or is refused before its hello is read.")
    ping_every_s: float = Field(default=10.0, gt=0,
                                description="How often the gateway pings a connected shard.")
    silence_timeout_s: float = Field(default=35.0, gt=0,
                                     description="A shard silent this long (no line at all) is disconnected.")
    frames_stream: str = Field(default="SHARD_FRAMES",
                               description="JetStream stream that keeps every frame.")
    deadletter_stream: str = Field(default="SHARD_DEADLETTER",
                                   description="JetStream stream that keeps lines that could not be frames.")
    duplicate_window_s: float = Field(default=120.0, gt=0,
                                      description="JetStream de-duplication window of the frames stream.")
    publish_window: int = Field(default=256, ge=1, le=4000,
                                description="JetStream acknowledgements in flight per shard.")
    fast_ingest: bool = Field(default=True,
                              description="Publish frames in JetStream fast-ingest batches where "
                              "nats-server allows them (2.14 and later), which keeps each shard's order "
                              "through a leader change; false: plain publishes.")
    publish_ack_timeout_s: float = Field(default=5.0, gt=0,
                                         description="How long one JetStream acknowledgement may take "
                                         "before the frame is published again.")
    buffer_frames: int = Field(default=10_000, ge=1,
                               description="Frames buffered per shard while NATS is away; when full "
                               "the gateway stops reading from the shard (back-pressure).")
    buffer_bytes: int = Field(default=64 * 1024 * 1024, ge=1024 * 1024,
                              description="Bytes of frames held per shard until JetStream has them; when "
                              "reached the gateway stops reading from the shard (back-pressure).")
    command_timeout_s: float = Field(default=5.0, gt=0,
                                     description="How long the shard has to answer a command (then 504).")
    max_pending_commands: int = Field(default=1000, ge=1,
                                      description="Commands one shard may have waiting for its answers; "
                                      "beyond them a command is refused at once (503).")
    board_bucket_prefix: str = Field(default="BOARD",
                                     description="Key-value buckets are named <prefix>_<BOARD>.")

    @model_validator(mode="after")
    def _tls_files(self) -> GatewaySettings:
        if bool(self.shard_tls_cert) != bool(self.shard_tls_key):
            raise ValueError("SHARDBUS_SHARD_TLS_CERT and SHARDBUS_SHARD_TLS_KEY go together: set both or neither")
        if self.shard_tls_ca and not self.shard_tls_cert:
            raise ValueError("SHARDBUS_SHARD_TLS_CA (client certificates) needs the listener's own "
                             "SHARDBUS_SHARD_TLS_CERT and SHARDBUS_SHARD_TLS_KEY")
        return self
