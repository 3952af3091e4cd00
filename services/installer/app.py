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
    fetcher = Fetcher(settings.allowed_hosts(), ca_file=settings.installer_ca_file,
                      timeout_s=settings.fetch_timeout_s, attempts=settings.fetch_attempts,
                      retry_wait_s=settings.fetch_retry_wait_s)
    state: dict[str, SiteInstaller] = {}
    replica = connection_name("installer")  # in every reply: which replica acted
    tasks: list[asyncio.Task[None]] = []

    def installer() -> SiteInstaller:
        if "installer" not in state:
            raise Refused(HTTPStatus.SERVICE_UNAVAILABLE, "the installer is still starting; try again in a moment")
        return state["installer"]

    @app.on_startup
    async def ensure_modules_dir() -> None:
        await asyncio.to_thread(Path(settings.modules_dir).mkdir, parents=True, exist_ok=True)

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

    @broker.subscriber(subjects.INSTALLER_INSTALL, queue=c.QUEUE, max_workers=settings.install_concurrency)
    async def install(request: InstallRequest) -> dict[str, Any]:
        async def progress(stage: c.Stage, done: int, total: int | None) -> None:
            if request.request_id is not None:
                await broker.publish(_wire(c.ProgressEvent, request_id=request.request_id, stage=stage, done=done,
                                           total=total), subjects.installer_progress(request.request_id))

        try:
            result = await installer().install(request.url, progress)
        except Refused as exc:
            # On the server too, not only in the reply: a sha256 mismatch may be tampering.
            log.warning("install refused", extra={"url": redact(request.url), "status": exc.status,
                                                  "reason": exc.sentence})
            raise
        if result["action"] != "unchanged":
            await broker.publish(_wire(c.InstalledEvent, type=result["action"], module=result["module"],
                                       previous=result["previous"]), subjects.INSTALLER_EVENTS)
        return _wire(c.InstallReply, status=HTTPStatus.OK, **result, replica=replica)

    @broker.subscriber(subjects.INSTALLER_REMOVE, queue=c.QUEUE, max_workers=settings.install_concurrency)
    async def remove(request: RemoveRequest) -> dict[str, Any]:
        try:
            result = await installer().remove(request.id)
        except Refused as exc:
            log.warning("remove refused", extra={"module_id": request.id[:64], "status": exc.status,
                                                 "reason": exc.sentence})
            raise
        await broker.publish(_wire(c.RemovedEvent, type="removed", module=result["removed"]), subjects.INSTALLER_EVENTS)
        return _wire(c.RemoveReply, status=HTTPStatus.OK, **result, replica=replica)

    # installer.list reads no body (c.ListRequest has no field): whatever is sent is answered.
    @broker.subscriber(subjects.INSTALLER_LIST, queue=c.QUEUE)
    async def list_modules() -> dict[str, Any]:
        return _wire(c.ListReply, status=HTTPStatus.OK, modules=installer().modules(),
                     declared=installer().declared)

    add_health(app, broker, "installer", settings)
    serve_metrics(app, broker, "installer", settings, metrics.collector(lambda: state.get("installer"), fetcher))
    return app
