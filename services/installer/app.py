"""Installer wiring: install, remove and list the site's module over NATS. What each subject
takes and answers, and what the events carry, is the installer's contract
(:mod:`shared.contracts.installer`)."""

from __future__ import annotations

import asyncio
import logging
from http import HTTPStatus
from pathlib import Path
from typing import Any

from faststream import FastStream
from faststream.nats import NatsBroker
from pydantic import ValidationError

from services.installer import metrics
from services.installer.download import Fetcher
from services.installer.refusals import Refused
from services.installer.settings import InstallerSettings
from services.installer.site_installer import SiteInstaller
from services.installer.site_lock import SiteLock, open_bucket
from shared import subjects
from shared.broker import make_app, make_broker
from shared.contracts import installer as c

# The handlers' request types by their own names: FastStream (fast_depends) resolves a handler's
# annotations against the locals of every frame that builds the app as well as this module's
# globals, so a short alias (``c.InstallRequest``) could meet a caller's own ``c``.
from shared.contracts.installer import InstallRequest, RemoveRequest
from shared.errors import ShardbusError
from shared.health import add_health
from shared.logs import redact
from shared.metrics import serve_metrics
from shared.nats_connect import connection_name

log = logging.getLogger("shardbus.installer")


class BrokenContract(ShardbusError, RuntimeError):
    """A reply or event the installer was about to send does not fit its own contract: a bug,
    answered 500 (never the 400 of a request that fails validation)."""


def _wire(model: type[c.InstallerReply] | type[c.Event], **fields: Any) -> dict[str, Any]:
    """``fields`` as ``model`` sends them (:meth:`~shared.contracts.installer.InstallerReply.wire`)."""
    try:
        return model.model_validate(fields).wire()
    except ValidationError as exc:
        raise BrokenContract(f"{model.__name__} does not fit the installer's contract: {exc}") from None


def _refused_reply(exc: Exception) -> dict[str, Any]:
    assert isinstance(exc, Refused)
    return c.ErrorReply(status=exc.status, error=exc.sentence).wire()


def create_app(settings: InstallerSettings | None = None) -> FastStream:
    """The installer as a FastStream app: run it with ``shardbus run installer``."""
    settings = settings or InstallerSettings()
    broker = make_broker(settings, "installer", error_replies={Refused: _refused_reply})
    app = make_app(broker, "installer")
    service = InstallerService(broker, settings)
    app.on_startup(service.ensure_modules_dir)
    app.after_startup(service.open_site)
    app.on_shutdown(service.close)
    workers = settings.install_concurrency
    broker.subscriber(subjects.INSTALLER_INSTALL, queue=c.QUEUE, max_workers=workers)(service.install)
    broker.subscriber(subjects.INSTALLER_REMOVE, queue=c.QUEUE, max_workers=workers)(service.remove)
    # installer.list reads no body (c.ListRequest has no field): whatever is sent is answered.
    broker.subscriber(subjects.INSTALLER_LIST, queue=c.QUEUE)(service.list_modules)
    add_health(app, broker, "installer", settings)
    serve_metrics(app, broker, "installer", settings, metrics.collector(lambda: service.site, service.fetcher))
    return app


class InstallerService:
    """The installer's three requests and its life: the site opened once NATS is connected (its
    lock bucket), the declared modules applied in the background, the fetcher closed at the end."""

    def __init__(self, broker: NatsBroker, settings: InstallerSettings) -> None:
        self.broker, self.settings = broker, settings
        self.fetcher = Fetcher(settings.allowed_hosts(), ca_file=settings.installer_ca_file,
                               timeout_s=settings.fetch_timeout_s, attempts=settings.fetch_attempts,
                               retry_wait_s=settings.fetch_retry_wait_s)
        self.site: SiteInstaller | None = None
        self.replica = connection_name("installer")  # in every reply: which replica acted
        self.tasks: list[asyncio.Task[None]] = []

    def installer(self) -> SiteInstaller:
        if self.site is None:
            raise Refused(HTTPStatus.SERVICE_UNAVAILABLE, "the installer is still starting; try again in a moment")
        return self.site

    async def ensure_modules_dir(self) -> None:
        await asyncio.to_thread(Path(self.settings.modules_dir).mkdir, parents=True, exist_ok=True)

    async def open_site(self) -> None:
        settings = self.settings
        kv = await open_bucket(self.broker.connection.jetstream(), settings.installer_lock_bucket,
                               settings.installer_lock_lease_s, settings.jetstream_replicas)
        lock = SiteLock(kv, settings.installer_site, wait_s=settings.installer_lock_wait_s,
                        lease_s=settings.installer_lock_lease_s)
        self.site = SiteInstaller(settings, self.fetcher, lock)
        # Declared modules are applied in the background: a slow or failing source never
        # keeps the service from starting.
        self.tasks.append(asyncio.create_task(self.site.apply_declared(settings.declared_urls())))

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        self.fetcher.close()

    async def install(self, request: InstallRequest) -> dict[str, Any]:
        async def progress(stage: c.Stage, done: int, total: int | None) -> None:
            if (request_id := request.request_id) is not None:
                event = _wire(c.ProgressEvent, request_id=request_id, stage=stage, done=done, total=total)
                await self.broker.publish(event, subjects.installer_progress(request_id))

        try:
            result = await self.installer().install(request.url, progress)
        except Refused as exc:
            # On the server too, not only in the reply: a sha256 mismatch may be tampering.
            log.warning("install refused", extra={"url": redact(request.url), "status": exc.status,
                                                  "reason": exc.sentence})
            raise
        if result["action"] != "unchanged":
            await self.broker.publish(_wire(c.InstalledEvent, type=result["action"], module=result["module"],
                                            previous=result["previous"]), subjects.INSTALLER_EVENTS)
        return _wire(c.InstallReply, status=HTTPStatus.OK, **result, replica=self.replica)

    async def remove(self, request: RemoveRequest) -> dict[str, Any]:
        try:
            result = await self.installer().remove(request.id)
        except Refused as exc:
            log.warning("remove refused", extra={"module_id": request.id[:64], "status": exc.status,
                                                 "reason": exc.sentence})
            raise
        await self.broker.publish(_wire(c.RemovedEvent, type="removed", module=result["removed"]),
                                  subjects.INSTALLER_EVENTS)
        return _wire(c.RemoveReply, status=HTTPStatus.OK, **result, replica=self.replica)

    async def list_modules(self) -> dict[str, Any]:
        return _wire(c.ListReply, status=HTTPStatus.OK, modules=self.installer().modules(),
                     declared=self.installer().declared)
