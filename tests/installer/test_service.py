"""The installer service over NATS (a real `shardbus run installer` process): the requests,
their status envelope, progress and change events, declared modules, and the CLI."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys

from shared import subjects
from tests.installer.conftest import service_settings
from tests.installer.releases import module_tar


async def _ask(nc, subject: str, body: dict) -> dict:
    return json.loads((await nc.request(subject, json.dumps(body).encode(), timeout=30)).data)


async def test_install_list_and_remove_over_nats_with_progress_and_events(services, settings, releases, nc,
                                                                          unique):
    services.start("installer", **service_settings(settings))
    events = await nc.subscribe(subjects.INSTALLER_EVENTS)
    progress = await nc.subscribe(subjects.installer_progress(unique))
    url = releases.release(f"/{unique}", "uo-events", "1.4.0")

    reply = await _ask(nc, subjects.INSTALLER_INSTALL, {"url": url, "requestId": unique})
    assert reply["status"] == 200 and reply["action"] == "installed"
    listed = await _ask(nc, subjects.INSTALLER_LIST, {})
    assert listed == {"status": 200, "modules": [{"id": "uo-events", "version": "1.4.0"}], "declared": []}
    other = await _ask(nc, subjects.INSTALLER_INSTALL, {"url": releases.release(f"/{unique}", "uo-vendors", "1.0.0")})
    assert other["status"] == 409 and "upgrade uo-events or remove it first" in other["error"]
    removed = await _ask(nc, subjects.INSTALLER_REMOVE, {"id": "uo-events"})
    assert removed["status"] == 200 and removed["removed"] == {"id": "uo-events", "version": "1.4.0"}

    stages: list[str] = []
    while not stages or stages[-1] != "done":
        stages.append(json.loads((await progress.next_msg(timeout=5)).data)["stage"])
    assert stages[0] == "manifest" and stages[-3:] == ["inspect", "unpack", "done"] and "download" in stages
    seen = [json.loads((await events.next_msg(timeout=5)).data) for _ in range(2)]
    assert [(e["type"], e["module"]["id"]) for e in seen] == [("installed", "uo-events"), ("removed", "uo-events")]


async def test_a_refused_install_leaves_a_trace_on_the_server(services, settings, releases, nc, unique):
    # A sha256 mismatch may be tampering: the reply tells the caller, and the log tells the operator.
    process = services.start("installer", **service_settings(settings))
    url = releases.release(f"/{unique}", "uo-events", "1.4.0")
    releases.routes[f"/{unique}/uo-events-1.4.0.tar.gz"].body += b"tampered"
    reply = await _ask(nc, subjects.INSTALLER_INSTALL, {"url": url})
    assert reply["status"] == 400 and "sha256" in reply["error"]
    logged = [json.loads(line) for line in process.log().splitlines() if '"install refused"' in line]
    assert [(e["level"], e["status"], e["url"]) for e in logged] == [("warning", 400, url)]
    assert "sha256" in logged[0]["reason"]


async def test_bad_requests_get_a_400_naming_the_field(services, settings, nc):
    services.start("installer", **service_settings(settings))
    no_url = await _ask(nc, subjects.INSTALLER_INSTALL, {})
    assert no_url["status"] == 400 and "url" in no_url["error"]
    bad_id = await _ask(nc, subjects.INSTALLER_INSTALL, {"url": "https://127.0.0.1/x", "requestId": "a.b"})
    assert bad_id["status"] == 400 and "requestId" in bad_id["error"]
    http = await _ask(nc, subjects.INSTALLER_INSTALL, {"url": "http://127.0.0.1/x"})
    assert http["status"] == 400 and "not https" in http["error"]
    missing = await _ask(nc, subjects.INSTALLER_REMOVE, {"id": "uo-events"})
    assert missing["status"] == 404


async def test_declared_modules_install_the_first_and_keep_the_refusals_for_the_list(services, settings,
                                                                                    releases, nc, unique):
    first = releases.release(f"/{unique}", "uo-events", "1.4.0")
    second = releases.release(f"/{unique}", "uo-vendors", "1.0.0")
    broken = f"https://127.0.0.1:{releases.port}/{unique}/missing.json"
    handle = services.start("installer", declared_modules=f"{first},{second},{broken}",
                            **service_settings(settings))
    for _ in range(100):
        listed = await _ask(nc, subjects.INSTALLER_LIST, {})
        if all(entry["state"] != "pending" for entry in listed["declared"]):
            break
        await asyncio.sleep(0.1)
    assert listed["modules"] == [{"id": "uo-events", "version": "1.4.0"}]
    states = {entry["url"]: entry for entry in listed["declared"]}
    assert states[first]["state"] == "installed"
    assert states[second]["state"] == "refused" and states[second]["status"] == 409
    assert "uo-events 1.4.0 is installed" in states[second]["error"]
    assert states[broken]["status"] == 400 and "no such release" in states[broken]["error"]
    assert releases.hits[f"/{unique}/uo-vendors-1.0.0.tar.gz"] == 0
    assert handle.proc.poll() is None and "declared module refused" in handle.log()
    assert (await _ask(nc, subjects.health("installer"), {}))["status"] == 200


def _cli(nats_url: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SHARDBUS_NATS_URL": nats_url}
    return subprocess.run([sys.executable, "-m", "shardbus", "module", *args], env=env, capture_output=True,
                          text=True, timeout=60)


async def test_the_cli_installs_showing_its_progress_lists_and_removes(services, settings, releases, nats_url,
                                                                        unique):
    services.start("installer", **service_settings(settings))
    artifact_files = {"big.bin": os.urandom(1024 * 1024)}
    url = releases.release(f"/{unique}", "uo-events", "1.4.0", module_tar("uo-events", "1.4.0", artifact_files))

    installed = await asyncio.to_thread(_cli, nats_url, "install", url)
    assert installed.returncode == 0, installed.stderr
    assert installed.stdout.strip() == "installed uo-events 1.4.0"
    # stderr is a pipe here, not a terminal: a plain line per stage, fed by the progress events
    # (the bar itself: tests/installer/test_cli_progress.py).
    lines = installed.stderr.splitlines()
    assert lines[0] == "fetching the manifest" and re.fullmatch(r"downloading \(1\.\d MB\)", lines[1]), lines
    assert lines[2:] == ["checking the archive", "unpacking"]
    listed = await asyncio.to_thread(_cli, nats_url, "list")
    assert listed.returncode == 0 and listed.stdout.strip() == "uo-events 1.4.0"
    refused = await asyncio.to_thread(_cli, nats_url, "install", releases.release(f"/{unique}", "uo-b", "1.0.0"))
    assert refused.returncode == 1 and "error 409" in refused.stderr and "remove it first" in refused.stderr
    removed = await asyncio.to_thread(_cli, nats_url, "remove", "uo-events")
    assert removed.returncode == 0 and removed.stdout.strip() == "removed uo-events"
