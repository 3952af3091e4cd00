"""The installer's /metrics (services/installer/metrics.py): a real installer process scraped over
HTTP while installs end installed, unchanged and refused."""

from __future__ import annotations

import json

from shardbus.embedded import free_port
from shared import subjects
from tests.installer.conftest import service_settings
from tests.scrape import scrape, value

INSTALLS = "shardbus_installer_installs_total"


async def _install(nc, url: str) -> dict:
    return json.loads((await nc.request(subjects.INSTALLER_INSTALL, json.dumps({"url": url}).encode(),
                                        timeout=30)).data)


async def test_installs_move_the_outcome_and_fetched_bytes_series(services, settings, releases, nc, unique) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    services.start("installer", **service_settings(settings), metrics_port=str(port))
    before = await scrape(url)
    assert value(before, "shardbus_nats_connected", service="installer") == 1

    release = releases.release(f"/{unique}", "uo-events", "1.4.0")
    assert (await _install(nc, release))["action"] == "installed"
    assert (await _install(nc, release))["action"] == "unchanged"
    other = releases.release(f"/{unique}", "uo-vendors", "1.0.0")
    assert (await _install(nc, other))["status"] == 409
    after = await scrape(url)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta(INSTALLS, outcome="installed") == 1
    assert delta(INSTALLS, outcome="unchanged") == 1
    assert delta(INSTALLS, outcome="refused") == 1
    assert delta(INSTALLS, outcome="failed") == 0
    # Three manifests and one artifact were read.
    artifact = len(releases.routes[f"/{unique}/uo-events-1.4.0.tar.gz"].body)
    assert delta("shardbus_installer_fetched_bytes_total") > artifact
