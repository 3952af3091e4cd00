"""Installing, upgrading and removing the site's one module (the installer's domain logic).

An install: fetch and check the manifest; under the site lock, refuse (409) if another
module is installed — before the artifact is fetched; otherwise stream the artifact,
computing its sha256 and inspecting it in full as it arrives (the inspection writes the
decompressed tar into a scratch directory beside the modules: the artifact is on disk,
never whole in memory, and the only copy written is the one unpacked), check the hash,
unpack, and swap in. Whatever fails, the scratch is removed and the previous version is
left exactly in place.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable, Coroutine
from http import HTTPStatus
from pathlib import Path
from typing import Any

from services.installer import archive, modules_dir
from services.installer.download import Fetcher, check_url
from services.installer.live_inspection import LiveInspection
from services.installer.manifest import Manifest, parse_manifest
from services.installer.refusals import BAD_INPUT, NOT_INSTALLED, SITE_TAKEN, Refused
from services.installer.settings import InstallerSettings
from services.installer.site_lock import Lease, LockLost, SiteLock
from shared.contracts.ids import is_module_id
from shared.contracts.installer import PROGRESS_EVERY_S, Stage

log = logging.getLogger("shardbus.installer")

LOCK_LOST = HTTPStatus.SERVICE_UNAVAILABLE
"""The site lock expired mid-install (the replica stalled); nothing changed, try again."""

StageProgress = Callable[[Stage, int, int | None], Coroutine[Any, Any, None]]
"""Called with (stage, bytes done, bytes expected or None) as an install goes on; download
reports come at most every :data:`shared.contracts.installer.PROGRESS_EVERY_S`."""


async def _no_progress(_stage: Stage, _done: int, _total: int | None) -> None:
    return None


class _DownloadProgress:
    """The download's progress callback, called in the fetching thread: hands at most one report
    per :data:`PROGRESS_EVERY_S` (and the last) to ``progress`` on the event loop."""

    def __init__(self, progress: StageProgress, expected: int | None) -> None:
        self._progress, self._expected = progress, expected
        self._loop = asyncio.get_running_loop()
        self._last_s = 0.0
        self._sent: concurrent.futures.Future[None] | None = None

    def __call__(self, done: int, total: int | None) -> None:
        total = total or self._expected
        now = time.monotonic()
        if now - self._last_s < PROGRESS_EVERY_S and done != total:
            return
        self._last_s = now
        self._sent = asyncio.run_coroutine_threadsafe(self._progress("download", done, total), self._loop)

    async def settled(self) -> None:
        """Wait until the last report went out, so the next stage's report comes after it."""
        if self._sent is not None:
            await asyncio.wrap_future(self._sent)


def one_module_refusal(installed: modules_dir.InstalledModule, wanted: str) -> Refused:
    """The 409 for installing ``wanted`` while ``installed`` holds the site."""
    return Refused(SITE_TAKEN, f"module {installed.describe()} is installed on this site and a site runs "
                               f"one module: upgrade {installed.id} or remove it first, then install {wanted}")


def _module(m: modules_dir.InstalledModule | Manifest) -> dict[str, Any]:
    """A module as the wire carries it (:class:`shared.contracts.installer.Module`)."""
    return {"id": m.id, "version": m.version}


def _maybe_module(m: modules_dir.InstalledModule | None) -> dict[str, Any] | None:
    return None if m is None else _module(m)


OUTCOMES = ("installed", "upgraded", "unchanged", "refused", "failed")
"""What an install ends in: its action, a refusal (any status) or an unexpected failure."""


class SiteInstaller:
    """Installs, upgrades, removes and lists the module of one site (one modules directory)."""

    def __init__(self, settings: InstallerSettings, fetcher: Fetcher, lock: SiteLock) -> None:
        self.settings, self.fetcher, self.lock = settings, fetcher, lock
        self.dir = Path(settings.modules_dir)
        self.limits = archive.Limits(max_entries=settings.archive_max_entries,
                                     max_unpacked_bytes=settings.unpacked_max_bytes,
                                     max_ratio=settings.archive_max_ratio)
        self.declared: list[dict[str, Any]] = []
        """What became of each declared module at start (for ``installer.list``)."""
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        """Installs by outcome since the service started (its metrics)."""

    def modules(self) -> list[dict[str, Any]]:
        """The installed modules as a loader sees them (normally none or one)."""
        return [_module(m) for m in modules_dir.installed(self.dir)]

    async def install(self, url: str, progress: StageProgress | None = None) -> dict[str, Any]:
        """Install or upgrade from the manifest at ``url``; the result, or :class:`Refused`."""
        try:
            result = await self._install(url, progress)
        except Refused:
            self.outcomes["refused"] += 1
            raise
        except Exception:
            self.outcomes["failed"] += 1
            raise
        self.outcomes[result["action"]] += 1
        return result

    async def _install(self, url: str, progress: StageProgress | None) -> dict[str, Any]:
        progress = progress or _no_progress
        await progress("manifest", 0, None)
        body = await asyncio.to_thread(self.fetcher.fetch_manifest, url, self.settings.manifest_max_bytes)
        manifest = parse_manifest(body, url)
        check_url(manifest.artifact_url, self.fetcher.allowed_hosts, "artifact")
        if manifest.size is not None and manifest.size > self.settings.artifact_max_bytes:
            raise Refused(BAD_INPUT, f"the artifact of {manifest.id} {manifest.version} is {manifest.size} "
                                     f"bytes, over the cap of {self.settings.artifact_max_bytes} bytes")
        async with self.lock.hold(f"install {manifest.id} {manifest.version}") as lease:
            await asyncio.to_thread(self._clear_leftovers)
            present = modules_dir.installed(self.dir)
            for other in present:
                if other.id != manifest.id:
                    raise one_module_refusal(other, manifest.id)
            previous = present[0] if present else None
            if previous is not None and previous.version == manifest.version:
                await progress("done", 0, None)
                return {"action": "unchanged", "module": _module(manifest), "previous": _module(previous)}
            stats = await self._fetch_and_swap(manifest, lease, progress)
        log.info("module installed", extra={"module_id": manifest.id, "version": manifest.version,
                                             "previous": previous.version if previous else None})
        await progress("done", stats["bytes"], stats["bytes"])
        return {"action": "upgraded" if previous else "installed", "module": _module(manifest),
                "previous": _maybe_module(previous), **stats}

    async def _fetch_and_swap(self, manifest: Manifest, lease: Lease, progress: StageProgress) -> dict[str, Any]:
        scratch = await asyncio.to_thread(modules_dir.make_scratch, self.dir, manifest.id)
        try:
            tar = scratch / "artifact.tar"
            inspections: list[LiveInspection] = []

            def inspection() -> LiveInspection:
                inspections.append(LiveInspection(manifest.id, manifest.version, self.limits, tar))
                return inspections[-1]

            downloading = _DownloadProgress(progress, manifest.size)
            sha256, size = await asyncio.to_thread(
                self.fetcher.fetch_artifact, manifest.artifact_url, self.settings.artifact_max_bytes, inspection,
                downloading)
            await downloading.settled()
            if sha256 != manifest.sha256:
                raise Refused(BAD_INPUT, f"the artifact's sha256 is {sha256}, but the manifest says "
                                         f"{manifest.sha256}; it was not installed")
            await progress("inspect", size, size)
            found = await asyncio.to_thread(inspections[-1].result)
            await progress("unpack", size, size)
            unpacked = scratch / "module"
            unpacked.mkdir()
            await asyncio.to_thread(archive.unpack, tar, unpacked, self.limits)
            try:
                await lease.confirm()
            except LockLost as exc:
                raise Refused(LOCK_LOST, f"{exc}; nothing was changed, try again") from None
            await asyncio.to_thread(modules_dir.swap_in, unpacked, self.dir, manifest.id)
            return {"sha256": sha256, "bytes": size, "entries": found.entries,
                    "unpackedBytes": found.unpacked_bytes}
        finally:
            await asyncio.to_thread(modules_dir.remove_tree, scratch)

    async def remove(self, module_id: str) -> dict[str, Any]:
        """Remove the module ``module_id``, freeing the site; 404 if it is not installed."""
        if not is_module_id(module_id):
            raise Refused(BAD_INPUT, f"{module_id!r} is not a module id")
        async with self.lock.hold(f"remove {module_id}"):
            await asyncio.to_thread(self._clear_leftovers)
            present = {m.id: m for m in modules_dir.installed(self.dir)}
            if module_id not in present:
                installed = ", ".join(m.describe() for m in present.values()) or "none"
                raise Refused(NOT_INSTALLED, f"module {module_id} is not installed (installed: {installed})")
            await asyncio.to_thread(modules_dir.set_aside, self.dir, module_id)
        log.info("module removed", extra={"module_id": module_id})
        return {"removed": _module(present[module_id])}

    async def apply_declared(self, urls: list[str]) -> None:
        """Install the declared modules in order; a refusal is logged and kept, never raised."""
        self.declared = [{"url": url, "state": "pending"} for url in urls]
        for entry in self.declared:
            try:
                result = await self.install(entry["url"])
                entry.update(state=result["action"], module=result["module"])
            except Refused as exc:
                entry.update(state="refused", status=exc.status, error=exc.sentence)
                log.warning("declared module refused", extra={"url": entry["url"], "status": exc.status,
                                                              "reason": exc.sentence})
            except Exception as exc:  # a bug must not stop the service from starting
                entry.update(state="failed", status=HTTPStatus.INTERNAL_SERVER_ERROR,
                             error=f"internal error ({type(exc).__name__})")
                log.exception("declared module failed", extra={"url": entry["url"]})

    def _clear_leftovers(self) -> None:
        """Remove scratch and set-aside directories a dead holder of the lock left behind."""
        for path in modules_dir.leftovers(self.dir):
            log.warning("removing a leftover of an interrupted install", extra={"path": str(path)})
            modules_dir.remove_tree(path)
