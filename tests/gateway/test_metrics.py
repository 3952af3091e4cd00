"""The gateway's /metrics (services/gateway/metrics.py, counts.py): the app as ``shardbus run gateway`` builds
it, scraped over HTTP while a simulated shard sends frames, hostile lines and answers commands."""

from __future__ import annotations

import asyncio
import json

from services.gateway import counts as gateway_counts
from services.gateway.app import create_app
from services.gateway.boards.rules import BOARD_RULES
from services.gateway.settings import GatewaySettings
from services.gateway.shard_link.wire import DeadLetter, sort_line
from shardbus.embedded import free_port, port_is_free
from simulator import seed_wire
from simulator.shard import ShardSimulator
from tests.gateway.conftest import INTEREST_SETTLE_S, TOKEN
from tests.scrape import label_values, names, scrape, value

FRAMES_IN = "shardbus_gateway_frames_in_total"


async def test_frames_commands_and_dead_letters_move_their_series(nats_url, nc, unique) -> None:
    metrics_port, shard_port = free_port(), free_port()
    settings = GatewaySettings(nats_url=nats_url, shard_token=TOKEN, shard_host="127.0.0.1", shard_port=shard_port,
                               metrics_port=metrics_port)
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    shard = f"m{unique[:8]}"
    async with create_app(settings):
        before = await scrape(url)
        assert value(before, "shardbus_service_info", service="gateway", version=_version(before)) == 1
        assert value(before, "shardbus_nats_connected", service="gateway") == 1
        assert "process_cpu_seconds_total" in names(before)
        assert value(before, "shardbus_gateway_shards_connected") == 0

        sim = ShardSimulator("127.0.0.1", shard_port, shard, TOKEN)
        try:
            await sim.connect()
            await _until_connected(url)
            for n in range(3):
                await sim.send("mob.killed", serial=f"0x{n}")
            await sim.send("zz.not.a.seed.kind", x=1)  # hostile: a kind no seed names
            await sim.send_raw(b"this is not json\n")
            await sim.send_raw(b'{"kind":"bad kind!"}\n')
            reply = json.loads((await nc.request(f"shard.{shard}.cmd.lease.list", b"{}", timeout=5)).data)
            assert reply["status"] == 200

            async def moved() -> dict:
                while True:
                    after = await scrape(url)
                    if value(after, FRAMES_IN, kind="mob.killed") - value(before, FRAMES_IN, kind="mob.killed") >= 3 \
                            and value(after, "shardbus_gateway_deadletters_total", reason="unsafe_kind") >= 1:
                        return after
                    await asyncio.sleep(0.05)

            after = await asyncio.wait_for(moved(), 10)
            assert value(after, "shardbus_gateway_shards_connected") == 1
        finally:
            await sim.close()

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta(FRAMES_IN, kind="server.hello") == 1
    assert delta(FRAMES_IN, kind="other") == 1  # the unknown kind: counted, not named
    assert "zz.not.a.seed.kind" not in label_values(after, FRAMES_IN, "kind")
    assert label_values(after, FRAMES_IN, "kind") == label_values(before, FRAMES_IN, "kind")
    assert delta(FRAMES_IN, kind="lease.list.ok") == 1
    assert delta("shardbus_gateway_deadletters_total", reason="malformed_json") == 1
    assert delta("shardbus_gateway_frames_out_total", kind="lease.list") == 1
    assert delta("shardbus_gateway_commands_total", status="200") == 1
    assert delta("shardbus_gateway_command_duration_seconds_count") == 1
    assert value(after, "shardbus_gateway_shard_last_frame_timestamp_seconds", shard=shard) > 0


async def test_a_stopped_gateway_no_longer_serves_metrics(nats_url) -> None:
    metrics_port = free_port()
    settings = GatewaySettings(nats_url=nats_url, shard_token=TOKEN, shard_host="127.0.0.1", shard_port=0,
                               metrics_port=metrics_port)
    async with create_app(settings):
        assert "shardbus_gateway_frames_in_total" in names(await scrape(f"http://127.0.0.1:{metrics_port}/metrics"))
    # The port is free again: the endpoint stopped with the app (and another may take it).
    assert free_port_is(metrics_port)


async def _until_connected(url: str) -> None:
    async with asyncio.timeout(10):
        while value(await scrape(url), "shardbus_gateway_shards_connected") < 1:
            await asyncio.sleep(0.02)
    await asyncio.sleep(INTEREST_SETTLE_S)  # the gateway's command subscription, seen by the server


def free_port_is(port: int) -> bool:
    return port_is_free(port)


def _version(samples) -> str:
    return label_values(samples, "shardbus_service_info", "version").pop()


def test_the_kind_labels_are_the_seeds_vocabulary() -> None:
    seed_kinds = set(seed_wire.FORWARDED_KINDS) | set(seed_wire.ANSWER_KINDS) | {"server.hello", "gateway.pong"}
    board_kinds = {rule.kind for rule in BOARD_RULES}
    assert seed_kinds | board_kinds == gateway_counts.FRAME_KINDS
    assert set(seed_wire.COMMAND_BODIES) == gateway_counts.COMMAND_VERBS


def test_dead_letter_reasons_and_hostile_kinds_map_to_known_labels() -> None:
    lines = [b"\xff\xfe", "\ufeff{}".encode(), b"{nope", b"[1]", b'{"a":1}', b'{"kind":"a b"}']
    labels = []
    for line in lines:
        item = sort_line(line)
        assert isinstance(item, DeadLetter)
        labels.append(gateway_counts.reason_label(item.reason))
    assert labels == ["not_utf8", "byte_order_mark", "malformed_json", "not_an_object", "no_kind", "unsafe_kind"]
    counts = gateway_counts.GatewayCounts()
    known = set(counts.frames_in)
    for kind in ("mob.killed", "zz.evil", "other", "x" * 1000):
        counts.frame_in(kind)
    assert set(counts.frames_in) == known
    assert counts.frames_in["other"] == 3 and counts.frames_in["mob.killed"] == 1


def test_gone_shards_are_forgotten_after_a_day_and_beyond_the_cap() -> None:
    counts = gateway_counts.GatewayCounts()
    now = 1_000_000.0
    counts.remember("old", now - gateway_counts.SHARD_KEPT_S - 1)
    for n in range(gateway_counts.SHARDS_KEPT + 5):
        counts.remember(f"s{n}", now - gateway_counts.SHARDS_KEPT - 5 + n)
    counts.forget_old(now)
    assert len(counts.last_line_at) == gateway_counts.SHARDS_KEPT
    assert "old" not in counts.last_line_at and "s0" not in counts.last_line_at and "s5" in counts.last_line_at
