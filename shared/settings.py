"""Settings every service reads from the environment (prefix ``SHARDBUS_``).

Each service extends :class:`CommonSettings` with its own fields in its own
``settings.py``; ``docs/settings.md`` and the README list them all.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "SHARDBUS_"
"""Every setting is read from an environment variable with this prefix."""


class CommonSettings(BaseSettings):
    """Connection and logging settings shared by all services."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    nats_url: str = Field(
        default="nats://127.0.0.1:4222",
        description="NATS server(s) to connect to; several may be given comma-separated.",
    )
    database_url: str = Field(
        default="postgresql+asyncpg://postgres@127.0.0.1:5432/shardbus",
        description="PostgreSQL URL (SQLAlchemy form, asyncpg driver). Used by the ledger.",
    )
    nats_tls_ca: str = Field(
        default="",
        description="PEM CA file that signed the NATS servers' certificates; set, every NATS "
        "connection is TLS and verifies the server's certificate and name (docs/security.md, \"TLS\").",
    )
    nats_tls_cert: str = Field(
        default="", description="PEM client certificate for NATS servers that verify clients (with "
        "SHARDBUS_NATS_TLS_CA).")
    nats_tls_key: str = Field(default="", description="PEM key of SHARDBUS_NATS_TLS_CERT, if not in that file.")
    nats_tls_hostname: str = Field(
        default="", description="The name the NATS servers' certificates must carry, when it is not "
        "the host of SHARDBUS_NATS_URL (e.g. servers dialled by IP address).")
    nats_tls_handshake_first: bool = Field(
        default=True, description="Start TLS before NATS says a word, so no password can go out in the "
        "clear to a server (or impostor) that offers no TLS; the server's tls block needs "
        "handshake_first (deploy/nats/nats-tls.conf). false: TLS after the server's INFO.")
    log_level: str = Field(default="INFO", description="Log level: DEBUG, INFO, WARNING, ERROR.")
    reconnect_wait_s: float = Field(
        default=1.0, gt=0, description="First pause between NATS reconnect attempts (doubles, capped)."
    )
    reconnect_wait_max_s: float = Field(
        default=10.0, gt=0, description="Longest pause between NATS reconnect attempts."
    )
    nats_ping_interval_s: float = Field(
        default=2.0, gt=0,
        description="How often a service pings its NATS server; a link silent for "
        "(SHARDBUS_NATS_MAX_OUTSTANDING_PINGS + 1) pings is dropped and the next listed server tried "
        "(nats-py's default, 120 s, kept a cut-off connection 'connected' for minutes).",
    )
    nats_max_outstanding_pings: int = Field(
        default=2, ge=1,
        description="Pings to NATS left unanswered before a service drops the connection as stale "
        "and reconnects (to another listed server when its own is unreachable).",
    )
    jetstream_replicas: int = Field(
        default=1, ge=1, le=5,
        description="Replicas of every JetStream stream and key-value bucket a service creates "
        "(3 on a 3-node NATS cluster, so losing one node loses nothing).",
    )
    health_file: str = Field(
        default="",
        description="If set, the service touches this file every few seconds while its NATS "
        "connection is up (compose health checks read it).",
    )

    metrics_port: int = Field(
        default=0, ge=0, le=65535,
        description="Port of the service's Prometheus endpoint (http://<metrics_host>:<port>/metrics); "
        "0 = no endpoint. `shardbus up` gives each process its own.",
    )
    metrics_host: str = Field(
        default="127.0.0.1",
        description="Address the Prometheus endpoint listens on (0.0.0.0 in a container).",
    )

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        level = value.upper()
        if level not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
            raise ValueError(f"log_level must be DEBUG, INFO, WARNING, ERROR or CRITICAL, not {value!r}")
        return level

    @model_validator(mode="after")
    def _nats_tls_files(self) -> CommonSettings:
        if (self.nats_tls_cert or self.nats_tls_key) and not self.nats_tls_ca:
            raise ValueError("SHARDBUS_NATS_TLS_CERT and SHARDBUS_NATS_TLS_KEY need SHARDBUS_NATS_TLS_CA "
                             "(the CA that signed the NATS servers' certificates)")
        if self.nats_tls_key and not self.nats_tls_cert:
            raise ValueError("SHARDBUS_NATS_TLS_KEY needs SHARDBUS_NATS_TLS_CERT")
        return self

    def nats_tls(self) -> dict[str, Any]:
        """nats-py's TLS options (``tls``, ``tls_hostname``, ``tls_handshake_first``), or none
        without a CA: a plain connection, as on loopback."""
        if not self.nats_tls_ca:
            return {}
        from shared.tls import client_context

        options: dict[str, Any] = {"tls": client_context(self.nats_tls_ca, self.nats_tls_cert, self.nats_tls_key),
                                   "tls_handshake_first": self.nats_tls_handshake_first}
        if self.nats_tls_hostname:
            options["tls_hostname"] = self.nats_tls_hostname
        return options

    def nats_servers(self) -> list[str]:
        """The NATS URLs as a list (the setting may hold several, comma-separated)."""
        return [url.strip() for url in self.nats_url.split(",") if url.strip()]
