"""The installer's settings (environment variables with the ``SHARDBUS_`` prefix)."""

from __future__ import annotations

from pydantic import Field

from shared.settings import CommonSettings

MIB = 1024 * 1024
"""Bytes in a mebibyte."""


class InstallerSettings(CommonSettings):
    """Where modules live, where they may come from, and the limits an artifact must keep."""

    modules_dir: str = Field(default="modules", description="Directory the site's module is installed in.")
    installer_allowed_hosts: str = Field(
        default="",
        description="Hosts manifests and artifacts may be fetched from, comma-separated (`host` or "
        "`host:port`). Empty: nothing can be installed.",
    )
    installer_ca_file: str = Field(
        default="", description="Extra CA certificates (PEM) trusted for HTTPS fetches, besides the system's."
    )
    declared_modules: str = Field(
        default="",
        description="Manifest URLs installed at start, comma-separated. Only the first different module "
        "can be installed; the rest are refused, logged and listed by `installer.list`.",
    )
    installer_site: str = Field(
        default="site", pattern=r"^[A-Za-z0-9_-]{1,64}$",
        description="Name of this site's lock in NATS: replicas sharing one modules volume share it.",
    )
    installer_lock_bucket: str = Field(
        default="SHARDBUS_INSTALLER", pattern=r"^[A-Za-z0-9_-]{1,64}$",
        description="JetStream key-value bucket holding the site locks.",
    )
    installer_lock_lease_s: float = Field(
        default=15.0, ge=1, description="A site lock whose holder stops renewing it expires after this."
    )
    installer_lock_wait_s: float = Field(
        default=60.0, ge=0, description="How long an install or removal waits for another one to finish."
    )
    manifest_max_bytes: int = Field(default=64 * 1024, gt=0, description="Largest manifest accepted.")
    artifact_max_bytes: int = Field(default=512 * MIB, gt=0, description="Largest artifact (tar.gz) accepted.")
    unpacked_max_bytes: int = Field(
        default=2048 * MIB, gt=0, description="Largest unpacked size of an artifact (counted while reading)."
    )
    archive_max_entries: int = Field(default=20000, gt=0, description="Most entries an artifact may hold.")
    archive_max_ratio: float = Field(
        default=200.0, gt=1, description="Highest unpacked/compressed ratio accepted (zip-bomb guard)."
    )
    fetch_timeout_s: float = Field(
        default=20.0, gt=0, description="Deadline of one whole fetch try (redirects, headers and body; "
        "raise it for large artifacts on slow links); a try past it is retried."
    )
    fetch_attempts: int = Field(
        default=3, ge=1, description="Tries of a fetch when the host is unreachable or answers 5xx."
    )
    fetch_retry_wait_s: float = Field(
        default=0.5, ge=0, description="First pause between fetch tries (doubles each time)."
    )
    install_concurrency: int = Field(
        default=4, ge=1, description="Requests one replica handles at once (the site lock orders them)."
    )

    def allowed_hosts(self) -> list[str]:
        """The allowlist as a list of lower-case ``host`` or ``host:port`` entries."""
        return [h.strip().lower() for h in self.installer_allowed_hosts.split(",") if h.strip()]

    def declared_urls(self) -> list[str]:
        """The declared manifest URLs, in order."""
        return [u.strip() for u in self.declared_modules.split(",") if u.strip()]
