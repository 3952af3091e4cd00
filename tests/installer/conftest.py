"""Installer fixtures: a throw-away CA and an HTTPS release server on 127.0.0.1 (session),
and per test a site (its own modules directory and site lock) with a real NATS KV lock."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trustme

from services.installer.download import Fetcher
from services.installer.settings import InstallerSettings
from services.installer.site_installer import SiteInstaller
from services.installer.site_lock import SiteLock, open_bucket
from tests.installer.releases import ReleaseServer


@pytest.fixture(scope="session")
def ca_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, Path]]:
    """(CA bundle, server cert chain, server key) made for this test session only."""
    where = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca.cert_pem.write_to_path(str(where / "ca.pem"))
    cert.private_key_pem.write_to_path(str(where / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(where / "chain.pem"))
    for blob in cert.cert_chain_pems[1:]:
        blob.write_to_path(str(where / "chain.pem"), append=True)
    yield where / "ca.pem", where / "chain.pem", where / "key.pem"


@pytest.fixture(scope="session")
def releases(ca_file) -> Iterator[ReleaseServer]:
    """The HTTPS server test releases are served from."""
    _ca, chain, key = ca_file
    server = ReleaseServer(chain, key)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def settings(tmp_path, releases, ca_file, nats_url, unique) -> InstallerSettings:
    """Settings of a fresh site: its own modules dir and lock, the release server allowed."""
    return InstallerSettings(
        nats_url=nats_url, modules_dir=str(tmp_path / "modules"), installer_allowed_hosts="127.0.0.1",
        installer_ca_file=str(ca_file[0]), installer_site=f"t{unique}", fetch_retry_wait_s=0.01,
        fetch_timeout_s=5, installer_lock_wait_s=10, installer_lock_lease_s=5,
        manifest_max_bytes=4096, artifact_max_bytes=4 * 1024 * 1024, unpacked_max_bytes=16 * 1024 * 1024,
        archive_max_entries=100, archive_max_ratio=50,
    )


@pytest.fixture
async def site(settings, nc) -> AsyncIterator[SiteInstaller]:
    """The installer's domain logic for one site, with its lock in a real NATS KV bucket."""
    kv = await open_bucket(nc.jetstream(), settings.installer_lock_bucket, settings.installer_lock_lease_s)
    lock = SiteLock(kv, settings.installer_site, wait_s=settings.installer_lock_wait_s,
                    lease_s=settings.installer_lock_lease_s)
    fetcher = Fetcher(settings.allowed_hosts(), ca_file=settings.installer_ca_file,
                      timeout_s=settings.fetch_timeout_s, attempts=settings.fetch_attempts,
                      retry_wait_s=settings.fetch_retry_wait_s)
    try:
        yield SiteInstaller(settings, fetcher, lock)
    finally:
        fetcher.close()


def snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root`` with what it is: file hash, link target or dir (byte-for-byte view)."""
    if not root.exists():
        return {}
    seen = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            seen[rel] = "link:" + str(path.readlink())
        elif path.is_dir():
            seen[rel] = "dir"
        else:
            seen[rel] = "file:" + hashlib.sha256(path.read_bytes()).hexdigest()
    return seen


def service_settings(settings) -> dict[str, str]:
    """The ``settings`` as keyword arguments for ``services.start("installer", ...)``."""
    keys = ("modules_dir", "installer_allowed_hosts", "installer_ca_file", "installer_site", "fetch_retry_wait_s",
            "fetch_timeout_s", "installer_lock_wait_s", "installer_lock_lease_s", "manifest_max_bytes",
            "artifact_max_bytes", "unpacked_max_bytes", "archive_max_entries", "archive_max_ratio")
    return {key: str(getattr(settings, key)) for key in keys}
