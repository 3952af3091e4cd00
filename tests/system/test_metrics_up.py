"""``shardbus up`` serves every process's Prometheus metrics at the ``METRICS_URLS`` it prints:
scraped over HTTP while a simulated shard sends frames and answers a command, the ledger answers a
request and the web door a page, the series of each service move."""

from __future__ import annotations

import asyncio
import json

import httpx
import nats
import pytest

from shardbus import registry
from simulator.shard import ShardSimulator
from tests.deploy.catalogue import HISTOGRAMS, OURS
from tests.scrape import Samples, label_values, names, scrape, value
from tests.system.up_process import start_up, stop_up


async def _scrape_all(urls: list[str]) -> dict[str, Samples]:
    """Every process's samples, by the service its ``shardbus_service_info`` names."""
    by_service: dict[str, Samples] = {}
    for url in urls:
        samples = await scrape(url)
        (service,) = label_values(samples, "shardbus_service_info", "service")
        by_service[service] = samples
    return by_service


async def _drive(found: dict[str, str]) -> tuple[dict[str, Samples], dict[str, Samples]]:
    urls = found["METRICS_URLS"].split(",")
    before = await _scrape_all(urls)
    host, port = found["SHARD_ADDR"].rsplit(":", 1)
    sim = ShardSimulator(host, int(port), "uo1", found["SHARD_TOKEN"])
    nc = await nats.connect(found["NATS_URL"], connect_timeout=5)
    try:
        await sim.connect()
        for n in range(3):
            await sim.send("mob.killed", serial=f"0x{n}")
        async with asyncio.timeout(20):  # the gateway subscribes the shard's commands once it said hello
            while True:
                try:
                    reply = json.loads((await nc.request("shard.uo1.cmd.lease.list", b"{}", timeout=5)).data)
                    break
                except nats.errors.NoRespondersError:
                    await asyncio.sleep(0.1)
        assert reply["status"] == 200, reply
        runs = json.loads((await nc.request("ledger.runs", b'{"limit": 1}', timeout=10)).data)
        assert runs["status"] == 200
        # A transition (a run created) and a whole sweep, each answered only once it is done.
        run = {"runId": "metrics-run", "shard": "uo1", "event": "invasion"}
        created = json.loads((await nc.request("ledger.run.create", json.dumps(run).encode(), timeout=10)).data)
        assert created["status"] == 200, created
        swept = json.loads((await nc.request("cleanup.sweep", b"{}", timeout=60)).data)
        assert swept["status"] == 200, swept
        async with httpx.AsyncClient(timeout=10) as client:
            assert (await client.get(f"{found['WEB_URL']}/health")).status_code == 200
        frames = "shardbus_gateway_frames_in_total"
        async with asyncio.timeout(20):
            while True:
                after = await _scrape_all(urls)
                if value(after["gateway"], frames, kind="mob.killed") >= 3:
                    return before, after
                await asyncio.sleep(0.1)
    finally:
        await sim.close()
        await nc.close()


@pytest.mark.timeout(240)
def test_up_serves_every_processs_metrics_and_they_move(state_dir):
    proc, found = start_up(state_dir)
    try:
        urls = found["METRICS_URLS"].split(",")
        assert len(urls) == len(registry.NAMES) and len(set(urls)) == len(urls)
        before, after = asyncio.run(_drive(found))
    finally:
        alive = stop_up(proc)
    assert alive == [], f"left running: {alive}"

    assert set(after) == set(registry.NAMES)
    for service, samples in after.items():
        assert value(samples, "shardbus_nats_connected", service=service) == 1
        assert "process_resident_memory_bytes" in names(samples)

    def delta(service: str, name: str, **labels: str) -> float:
        return value(after[service], name, **labels) - value(before[service], name, **labels)

    assert delta("gateway", "shardbus_gateway_frames_in_total", kind="mob.killed") == 3
    assert delta("gateway", "shardbus_gateway_frames_in_total", kind="server.hello") == 1
    assert delta("gateway", "shardbus_gateway_commands_total", status="200") >= 1
    assert value(after["gateway"], "shardbus_gateway_shards_connected") == 1
    assert delta("ledger", "shardbus_ledger_requests_total", subject="ledger.runs", status="200") >= 1
    assert delta("web", "shardbus_web_requests_total", route="/health", method="GET", status="200") == 1
    assert delta("ledger", "shardbus_ledger_requests_total", subject="ledger.run.create", status="200") == 1
    assert "shardbus_ledger_outbox_pending" in names(after["ledger"])
    assert delta("cleanup", "shardbus_cleanup_sweep_duration_seconds_count") >= 1
    assert "shardbus_installer_fetched_bytes_total" in names(after["installer"])

    # Every shardbus series the dashboard and the alerts may name (tests/deploy/catalogue.py)
    # is one a real stack serves, with the labels the catalogue gives it: a series renamed in a
    # service and not in deploy/ fails here.
    served: dict[str, set[str]] = {}
    for samples in after.values():
        for name, labels in samples:
            served.setdefault(name, set()).update(key for key, _ in labels)
    for series, labels in OURS.items():
        if not series.startswith("shardbus_"):
            continue
        shown = f"{series}_count" if series in HISTOGRAMS else series
        assert shown in served, f"{series} is catalogued for the dashboard and alerts but no service serves it"
        assert served[shown] <= set(labels) | {"le"}, f"{series}: served with labels {served[shown]}"
