"""Installing, upgrading and removing the site's one module (domain logic over a real HTTPS
server and a real NATS lock): what a site operator relies on."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from services.installer.refusals import Refused
from tests.installer.conftest import snapshot
from tests.installer.releases import module_tar


async def test_a_module_installs_from_its_manifest_url(site, releases, unique):
    url = releases.release(f"/{unique}", "uo-events", "1.4.0")
    result = await site.install(url)
    assert result["action"] == "installed" and result["module"] == {"id": "uo-events", "version": "1.4.0"}
    installed = Path(site.settings.modules_dir) / "uo-events"
    assert json.loads((installed / "module.json").read_text()) == {"id": "uo-events", "version": "1.4.0"}
    assert (installed / "index.js").read_text() == "// uo-events 1.4.0\n"
    assert sorted(p.name for p in installed.parent.iterdir()) == ["uo-events"]  # no scratch left
    assert site.modules() == [{"id": "uo-events", "version": "1.4.0"}]


async def test_the_same_module_again_is_an_upgrade_that_replaces_every_file(site, releases, unique):
    await site.install(releases.release(f"/{unique}", "uo-events", "1.4.0",
                                        module_tar("uo-events", "1.4.0", {"old.js": b"old"})))
    result = await site.install(releases.release(f"/{unique}", "uo-events", "1.5.0",
                                                 module_tar("uo-events", "1.5.0", {"new.js": b"new"})))
    assert result["action"] == "upgraded" and result["previous"] == {"id": "uo-events", "version": "1.4.0"}
    modules = Path(site.settings.modules_dir)
    assert snapshot(modules).keys() == {"uo-events", "uo-events/module.json", "uo-events/lib",
                                        "uo-events/new.js"}


async def test_installing_the_installed_version_again_changes_nothing(site, releases, unique):
    url = releases.release(f"/{unique}", "uo-events", "1.4.0")
    await site.install(url)
    before = snapshot(Path(site.settings.modules_dir))
    artifact_path = f"/{unique}/uo-events-1.4.0.tar.gz"
    hits = releases.hits[artifact_path]
    assert (await site.install(url))["action"] == "unchanged"
    assert releases.hits[artifact_path] == hits
    assert snapshot(Path(site.settings.modules_dir)) == before


async def test_another_module_is_refused_with_409_before_its_artifact_is_fetched(site, releases, unique):
    await site.install(releases.release(f"/{unique}", "uo-events", "1.4.0"))
    before = snapshot(Path(site.settings.modules_dir))
    with pytest.raises(Refused) as refused:
        await site.install(releases.release(f"/{unique}", "uo-vendors", "2.0.0"))
    assert refused.value.status == 409
    message = refused.value.sentence
    assert "uo-events 1.4.0 is installed" in message and "upgrade uo-events or remove it first" in message
    assert releases.hits[f"/{unique}/uo-vendors-2.0.0.tar.gz"] == 0
    assert snapshot(Path(site.settings.modules_dir)) == before


async def test_removing_the_module_frees_the_site_for_another(site, releases, unique):
    await site.install(releases.release(f"/{unique}", "uo-events", "1.4.0"))
    assert (await site.remove("uo-events"))["removed"] == {"id": "uo-events", "version": "1.4.0"}
    assert snapshot(Path(site.settings.modules_dir)) == {}
    assert (await site.install(releases.release(f"/{unique}", "uo-vendors", "2.0.0")))["action"] == "installed"
    assert site.modules() == [{"id": "uo-vendors", "version": "2.0.0"}]


async def test_removing_a_module_that_is_not_installed_is_404_naming_what_is(site, releases, unique):
    await site.install(releases.release(f"/{unique}", "uo-events", "1.4.0"))
    with pytest.raises(Refused) as refused:
        await site.remove("uo-vendors")
    assert refused.value.status == 404
    assert "uo-vendors is not installed" in refused.value.sentence and "uo-events 1.4.0" in refused.value.sentence
    with pytest.raises(Refused) as bad:
        await site.remove("../etc")
    assert bad.value.status == 400


async def test_progress_is_reported_by_stage_while_installing(site, releases, unique):
    seen: list[tuple[str, int, int | None]] = []

    async def progress(stage: str, done: int, total: int | None) -> None:
        seen.append((stage, done, total))

    artifact = module_tar("uo-events", "1.4.0", {"big.bin": bytes(range(256)) * 4096})
    await site.install(releases.release(f"/{unique}", "uo-events", "1.4.0", artifact), progress)
    stages = [stage for stage, _, _ in seen]
    assert stages[0] == "manifest" and stages[-1] == "done"
    assert {"download", "inspect", "unpack"} <= set(stages)
    downloads = [(done, total) for stage, done, total in seen if stage == "download"]
    assert downloads[-1] == (len(artifact), len(artifact))


async def test_leftovers_of_a_crashed_install_are_not_modules_and_are_cleared_by_the_next_one(site, releases,
                                                                                             unique):
    volume = Path(site.settings.modules_dir)
    for leftover in (".install-uo-vendors-k1l2", "uo-vendors.replaced-0a1b"):
        (volume / leftover).mkdir(parents=True)
        (volume / leftover / "module.json").write_text('{"id": "uo-vendors", "version": "1.0.0"}')
    assert site.modules() == []
    await site.install(releases.release(f"/{unique}", "uo-events", "1.4.0"))
    assert sorted(p.name for p in volume.iterdir()) == ["uo-events"]


async def test_an_install_that_lost_the_site_lock_midway_changes_nothing(site, releases, unique):
    await site.install(releases.release(f"/{unique}/base", "uo-events", "1.0.0"))
    before = snapshot(Path(site.settings.modules_dir))
    url = releases.release(f"/{unique}", "uo-events", "1.1.0")
    artifact_path = f"/{unique}/uo-events-1.1.0.tar.gz"
    releases.routes[artifact_path].delay_s = 1.0  # the download hangs while the lock is taken away
    installing = asyncio.create_task(site.install(url))
    for _ in range(100):
        if releases.hits[artifact_path]:
            break
        await asyncio.sleep(0.02)
    await site.lock.kv.purge(site.lock.key)  # as if the lease had expired…
    await site.lock.kv.create(site.lock.key, b'{"purpose": "another replica"}')  # …and another replica took it
    with pytest.raises(Refused) as refused:
        await installing
    assert refused.value.status == 503 and "nothing was changed" in refused.value.sentence
    assert snapshot(Path(site.settings.modules_dir)) == before
