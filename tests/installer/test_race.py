"""One module per site with replicas racing: two installer processes share a modules volume
and a NATS lock; each round, installs of two different modules arrive at the same instant.
Exactly one module wins every round, and the volume never holds two modules."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

from services.installer import modules_dir
from shared import subjects
from tests.installer.conftest import service_settings

ROUNDS = 20
"""Rounds of the race."""

REQUESTS_PER_MODULE = 3
"""Concurrent install requests per module each round (spread over both replicas by the queue group)."""


class VolumeWatcher:
    """Scans the volume the way a loader would, as fast as it can, and remembers the most modules seen."""

    def __init__(self, root: Path) -> None:
        self.root, self.most, self.scans = root, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                self.most = max(self.most, len(modules_dir.installed(self.root)))
            except FileNotFoundError:  # a directory vanished mid-scan (set aside): scan again
                pass
            self.scans += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


async def _install(nc, url: str) -> dict:
    return json.loads((await nc.request(subjects.INSTALLER_INSTALL, json.dumps({"url": url}).encode(),
                                        timeout=30)).data)


async def test_two_replicas_installing_two_modules_at_once_let_exactly_one_win(services, settings, releases,
                                                                              nc, unique):
    config = service_settings(settings)
    services.start("installer", **config)
    services.start("installer", **config)
    urls = {"uo-alpha": releases.release(f"/{unique}", "uo-alpha", "1.0.0"),
            "uo-beta": releases.release(f"/{unique}", "uo-beta", "1.0.0")}
    volume = Path(settings.modules_dir)
    watcher = VolumeWatcher(volume)
    winners, winning_replicas = [], set()
    try:
        for _ in range(ROUNDS):
            asks = [(module, _install(nc, url)) for module, url in urls.items() for _ in range(REQUESTS_PER_MODULE)]
            replies = await asyncio.gather(*(ask for _, ask in asks))
            won = {module for (module, _), reply in zip(asks, replies, strict=True) if reply["status"] == 200}
            assert len(won) == 1, replies
            winner = won.pop()
            for (module, _), reply in zip(asks, replies, strict=True):
                if module == winner:
                    assert reply["status"] == 200 and reply["action"] in ("installed", "unchanged")
                    winning_replicas.add(reply["replica"])
                else:
                    assert reply["status"] == 409 and f"{winner} 1.0.0 is installed" in reply["error"], reply
            assert [m.id for m in modules_dir.installed(volume)] == [winner]
            winners.append(winner)
            removed = json.loads((await nc.request(subjects.INSTALLER_REMOVE,
                                                   json.dumps({"id": winner}).encode(), timeout=30)).data)
            assert removed["status"] == 200
    finally:
        watcher.stop()
    assert watcher.most <= 1 and watcher.scans > ROUNDS
    assert len(winning_replicas) == 2, "both replicas should have served winning installs"
    assert sorted(p.name for p in volume.iterdir()) == []
