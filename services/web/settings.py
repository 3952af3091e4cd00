"""The web door's settings (environment variables with the ``SHARDBUS_`` prefix)."""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator, model_validator

from shared.contracts.ids import LEDGER_ID_PATTERN, is_ledger_id, is_shard_id
from shared.contracts.ledger import AWAY_ALERT_S, WAITING_LONGER_THAN_MAX_S
from shared.settings import CommonSettings


class WebSettings(CommonSettings):
    """Where the door listens, which shard the bare sidecar paths reach, and who may call."""

    web_host: str = Field(default="127.0.0.1", description="Address the HTTP listener binds to.")
    web_port: int = Field(default=8080, ge=0, le=65535,
                          description="HTTP port (0 picks a free one). Replicas share it (SO_REUSEPORT).")
    web_tls_cert: str = Field(default="", description="PEM certificate (with its chain) of the door; set with "
                              "SHARDBUS_WEB_TLS_KEY, it serves HTTPS and wss:// only (docs/security.md, \"TLS\"). "
                              "Read at start: a renewed one needs a restart (replicas one by one).")
    web_tls_key: str = Field(default="", description="PEM private key of SHARDBUS_WEB_TLS_CERT.")
    web_default_shard: str = Field(
        default="", description="The shard the sidecar's bare paths (/lease, /guilds, …) reach; "
        "empty: only /shards/{shard}/… paths.")
    web_token: SecretStr = Field(default=SecretStr(""),
                                 description="Bearer token of the website (required).")
    web_operator_token: SecretStr = Field(
        default=SecretStr(""), description="Bearer token of the operator: everything the website "
        "may call, plus sweeps and reconciles. Empty: no operator calls.")
    web_module_tokens: dict[str, SecretStr] = Field(
        default_factory=dict, description="Per-module bearer tokens as JSON ({\"events\": \"…\"}): "
        "a module may report its own expiries and reconciles, nothing else.")
    web_request_timeout_s: float = Field(
        default=8.0, gt=0, description="How long a route waits for the service behind it over NATS "
        "(longer than the gateway's command timeout, so the shard's 504 is the gateway's).")
    away_alert_s: float = Field(
        default=AWAY_ALERT_S, ge=0, le=WAITING_LONGER_THAN_MAX_S,
        description="The console flags a run waiting this long for its shard or module (it wants a person).")
    web_max_body_bytes: int = Field(default=1024 * 1024, ge=1024,
                                    description="Largest request body accepted (413 above).")

    # --- the live feed (feed/routes.py, feed/stream.py) ---
    frames_stream: str = Field(default="SHARD_FRAMES",
                               description="JetStream stream that keeps every frame.")
    board_bucket_prefix: str = Field(default="BOARD",
                                     description="Key-value buckets are named <prefix>_<BOARD>.")
    web_feed_boards: list[str] = Field(
        default=["guilds", "market", "houses", "champions", "news"],
        description="The boards whose buckets the feed carries (the gateway's boards, as JSON).")
    web_feed_stream: str = Field(
        default="WEB_FEED", description="JetStream stream the door creates, sourcing the frames, "
        "the boards' buckets and the ledger's events; its sequence is the feed's cursor.")
    web_feed_max_age_s: float = Field(
        default=24 * 3600.0, gt=0, description="How long the feed stream keeps an event: how far "
        "back a reconnecting client can resume (since / Last-Event-ID).")
    web_feed_max_bytes: int = Field(default=1024 ** 3, ge=1024 * 1024,
                                    description="Size cap of the feed stream (oldest events go first).")
    web_feed_max_clients: int = Field(default=1000, ge=1,
                                      description="Feed clients (WebSocket and SSE) one door serves at "
                                      "once; beyond, 503 (WebSocket: close 1013).")
    web_feed_queue_bytes: int = Field(
        default=1024 * 1024, ge=4096, description="Bytes of events held for one feed client; the "
        "door reads ahead from NATS only while there is room (one event larger than this is sent "
        "alone).")
    web_feed_queue_messages: int = Field(default=10_000, ge=16,
                                         description="Events held for one feed client.")
    web_feed_pull_bytes: int = Field(
        default=32 * 1024 * 1024, ge=4 * 1024 * 1024, description="Bytes all feed clients of one "
        "door may have asked NATS for and not yet received, together; keep it well under the NATS "
        "server's max_pending (64 MiB by default), which cuts off a connection that lags more.")
    web_feed_stall_s: float = Field(
        default=10.0, gt=0, description="A feed client that takes no event for this long while "
        "events wait (it stopped reading) is dropped with the reason.")

    @field_validator("web_default_shard")
    @classmethod
    def _shard_id(cls, value: str) -> str:
        if value and not is_shard_id(value):
            raise ValueError("web_default_shard must match [a-z0-9_-]{1,32}")
        return value

    @field_validator("web_feed_stream", "frames_stream", "board_bucket_prefix")
    @classmethod
    def _stream_name(cls, value: str) -> str:
        import re

        if re.fullmatch(r"[A-Za-z0-9_-]{1,64}", value) is None:  # it becomes a JetStream API subject
            raise ValueError(f"{value!r} must be 1-64 letters, digits, _ or -")
        return value

    @field_validator("web_feed_boards")
    @classmethod
    def _board_names(cls, value: list[str]) -> list[str]:
        import re

        for board in value:  # a board name becomes part of a bucket (stream) name
            if re.fullmatch(r"[a-z0-9_-]{1,32}", board) is None:
                raise ValueError(f"web_feed_boards: board {board!r} must match [a-z0-9_-]{{1,32}}")
        return value

    @model_validator(mode="after")
    def _tls_files(self) -> WebSettings:
        if bool(self.web_tls_cert) != bool(self.web_tls_key):
            raise ValueError("SHARDBUS_WEB_TLS_CERT and SHARDBUS_WEB_TLS_KEY go together: set both or neither")
        return self

    @model_validator(mode="after")
    def _tokens(self) -> WebSettings:
        if not self.web_token.get_secret_value():
            raise ValueError("SHARDBUS_WEB_TOKEN is required: the website's bearer token")
        for module in self.web_module_tokens:
            # The ledger's owner id, the last token of ``ledger.expired.<module>``.
            if not is_ledger_id(module):
                raise ValueError(f"web_module_tokens: module id {module!r} must match {LEDGER_ID_PATTERN}")
        secrets = [self.web_token, self.web_operator_token, *self.web_module_tokens.values()]
        values = [s.get_secret_value() for s in secrets if s.get_secret_value()]
        if len(values) != len(set(values)):
            raise ValueError("the website, operator and module tokens must all differ")
        return self
