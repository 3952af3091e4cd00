"""Installer wiring: install, remove and list the site's module over NATS."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from faststream import FastStream
from pydantic import BaseModel, ConfigDict, Field

from services.installer.download import Fetcher
from services.installer.refusals import Refused
from services.installer.settings import InstallerSettings
from services.installer.site_installer import SiteInstaller
from services.installer.site_lock import SiteLock, open_bucket
from shared import replies, subjects
from shared.broker import add_health, make_app, make_broker
from shared.logs import redact
from shared.nats_connect import connection_name

log = logging.getLogger("shardbus.installer")


class InstallRequest(BaseModel):
    """``installer.install``: the manifest URL, and an id to publish progress under."""

    model_config = ConfigDict(populate_by_name=True)

    url: str = Field(min_length=1, max_length=2048)
    request_id: str | None = Field(default=None, alias="requestId",
                                   pattern=rf"^{subjects.REQUEST_ID_PATTERN}$")


class RemoveRequest(BaseModel):
    """``installer.remove``: the module to remove."""

    id: str = Field(min_length=1, max_length=64)


def _refused_reply(exc: Exception) -> dict[str, Any]:
    assert isinstance(exc, Refused)
    return replies.fail(exc.status, exc.message)


def create_app(settings: InstallerSettings | None = None) -> FastStream:
    """The installer as a FastStream app: run it with ``shardbus run installer``."""
    settings = settings or InstallerSettings()
    broker = make_broker(settings, "installer", error_replies={Refused: _refused_reply})
    app = make_app(broker, "installer")
    fetcher = Fetcher(settings.allowed_hosts(), ca_file=settings.installer_ca_file,
                      timeout_s=settings.fetch_timeout_s, attempts=settings.fetch_attempts,
                      retry_wait_s=settings.fetch_retry_wait_s)
    state: dict[str, Any] = {}
    replica = connection_name("installer")  # in every reply: which replica acted
    tasks: list[asyncio.Task[None]] = []

    def installer() -> SiteInstaller:
        if "installer" not in state:
            raise Refused(replies.UNAVAILABLE, "the installer is still starting; try again in a moment")
        return state["installer"]

    @app.on_startup
    async def ensure_modules_dir() -> None:
        Path(settings.modules_dir).mkdir(parents=True, exist_ok=True)

    @app.after_startup
    async def open_site() -> None:
        kv = await open_bucket(broker.connection.jetstream(), settings.installer_lock_bucket,
                               settings.installer_lock_lease_s, settings.jetstream_replicas)
        lock = SiteLock(kv, settings.installer_site, wait_s=settings.installer_lock_wait_s,
                        lease_s=settings.installer_lock_lease_s)
        state["installer"] = SiteInstaller(settings, fetcher, lock)
        # Declared modules are applied in the background: a slow or failing source never
        # keeps the service from starting.
        tasks.append(asyncio.create_task(installer().apply_declared(settings.declared_urls())))

    @app.on_shutdown
    async def close() -> None:
        for task in tasks:
            task.cancel()
        fetcher.close()

    @broker.subscriber(subjects.INSTALLER_INSTALL, queue="installer", max_workers=settings.install_concurrency)
    async def install(request: InstallRequest) -> dict[str, Any]:
        async def progress(stage: str, done: int, total: int | None) -> None:
            if request.request_id is not None:
                await broker.publish({"requestId": request.request_id, "stage": stage, "done": done,
                                      "total": total}, subjects.installer_progress(request.request_id))

        try:
            result = await installer().install(request.url, progress)
        except Refused as exc:
            # On the server too, not only in the reply: a sha256 mismatch may be tampering.
            log.warning("install refused", extra={"url": redact(request.url), "status": exc.status,
                                                  "reason": exc.message})
            raise
        if result["action"] != "unchanged":
            await broker.publish({"type": result["action"], "module": result["module"],
                                  "previous": result["previous"]}, subjects.INSTALLER_EVENTS)
        return replies.ok(**result, replica=replica)

    @broker.subscriber(subjects.INSTALLER_REMOVE, queue="installer", max_workers=settings.install_concurrency)
    async def remove(request: RemoveRequest) -> dict[str, Any]:
        try:
            result = await installer().remove(request.id)
        except Refused as exc:
            log.warning("remove refused", extra={"module_id": request.id[:64], "status": exc.status,
                                                 "reason": exc.message})
            raise
        await broker.publish({"type": "removed", "module": result["removed"]}, subjects.INSTALLER_EVENTS)
        return replies.ok(**result, replica=replica)

    @broker.subscriber(subjects.INSTALLER_LIST, queue="installer")
    async def list_modules() -> dict[str, Any]:
        return replies.ok(modules=installer().modules(), declared=installer().declared)

    add_health(app, broker, "installer", settings)
    return app
