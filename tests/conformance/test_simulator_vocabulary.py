"""The simulator says nothing the seeds do not: every line it sends the gateway — frames and
answers alike, read back from the gateway's own stream — has a kind the sidecar seed names and,
when it gives a reason, one of the seed's sentences. Every verb a seed route reaches is driven,
its refusals included. A refused hello is told why, and the simulator stops dialling."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

from shared import subjects
from simulator.seed_wire import ANSWER_KINDS, FORWARDED_KINDS, is_seed_reason
from simulator.shard import ShardSimulator
from simulator.world import ShardWorld
from tests.gateway.conftest import TOKEN
from tests.gateway.test_command_plane import ask
from tests.gateway.test_listener import stored_frames

SEED_KINDS = {"server.hello", "guild.update", "guild.roster", "guild.remove", *FORWARDED_KINDS, *ANSWER_KINDS}
HEARTBEAT = "gateway.pong"
"""The shard's answer to a ping: never stored (pongs are a sign of life; docs/gateway.md, "Wire")."""


async def drive_every_verb(nc, sim: ShardSimulator) -> int:
    """Every verb a seed route reaches, with its refusals; how many commands were sent."""
    shard, calls = sim.shard, []
    calls += [("admin.ban", {"actor": "gm", "account": "alice"}), ("admin.ban", {"actor": "gm", "account": "admin"}),
              ("admin.unban", {"actor": "gm", "account": "zed"}), ("admin.broadcast", {"actor": "gm", "text": "hi"}),
              ("lease.list", {}), ("lease.list", {"key": "Loot.MaxProps"}),
              ("lease.apply", {"key": "PlayerCaps.SkillCap", "value": "1300", "holdMs": 60_000, "runId": "42"}),
              ("lease.apply", {"key": "PlayerCaps.SkillCap", "value": "1", "holdMs": -1}),
              ("lease.release", {"key": "PlayerCaps.SkillCap", "expected": "1300", "baseline": "1200"}),
              ("lease.release", {"key": "Weather.Season", "expected": "x", "baseline": "y"}),
              ("participation.snapshot", {"runId": "42"}), ("participation.open", {"runId": "42"}),
              ("participation.snapshot", {"runId": "42", "idempotencyKey": "s"}),
              ("participation.close", {"runId": "42"}), ("participation.close", {"runId": "43"}),
              ("world.spawn", {"runId": "42", "what": "creature", "count": 2}),
              ("world.spawn", {"runId": "42", "what": "creature", "count": 80}),
              ("world.owned", {"runId": "42"}), ("world.despawn", {"runId": "42", "serials": ["0x1"]}),
              ("world.despawn", {"runId": "42"}), ("item.catalog", {}),
              ("item.grant", {"runId": "42", "item": "gold", "amount": 1}),
              ("item.grant", {"runId": "44", "item": "gold", "amount": 1}),
              ("item.grant", {"runId": "42", "item": "castle", "amount": 1}),
              ("world.save", {}), ("world.save", {}),
              ("account.create", {"account": "alice"}), ("account.create", {"account": "dee"}),
              ("account.unlink", {"account": "dee"}), ("account.link", {"account": "zed"}),
              ("account.link", {"account": "dee", "userId": 5}), ("pages.list", {}),
              ("pages.respond", {"id": "p1", "actor": "gm", "text": "done"})]
    sim.world.page("p1", "bob", "help")
    for verb, body in calls:
        reply = await ask(nc, shard, verb, body)
        assert reply["status"] < 500, (verb, reply)
    # A repeat under a key still in flight: bridge.busy (docs/gateway.md, "Statuses").
    sim.answer_delay_s["participation.snapshot"] = 0.3
    body = {"runId": "42", "idempotencyKey": "walk"}
    slow = asyncio.create_task(ask(nc, shard, "participation.snapshot", body))
    await asyncio.sleep(0.1)
    assert (await ask(nc, shard, "participation.snapshot", body))["status"] == 425
    assert (await slow)["status"] == 200
    return len(calls) + 2


async def test_every_kind_and_sentence_the_simulator_sends_is_the_seeds(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"v{unique}", world=ShardWorld(save_interval_s=300))
    await sim.send_guild(7, "The Cartographers", [{"serial": "0x1", "name": "Ada"}], abbr="MAP")
    commands = await drive_every_verb(nc, sim)
    # hello + guild.update + guild.roster + one answer per command + world.save.before/after
    got = await stored_frames(nc, sim.shard, 3 + commands + 2)
    kinds = {m.subject[len(subjects.frame(sim.shard, "")):] for m in got}
    assert kinds - SEED_KINDS == set()
    assert {"bridge.busy", "lease.drifted", "world.error", "oneshot.error", "admin.error", "account.error",
            "participation.error", "lease.error"} <= kinds  # the refusals were reached
    reasons = [json.loads(m.data)["reason"] for m in got if "reason" in json.loads(m.data)]
    assert reasons and [r for r in reasons if not is_seed_reason(r)] == []


async def test_the_simulator_sends_no_lease_frame_of_its_own_at_a_deadline(gateway, shard_sims, nc, unique):
    # The seed's shard restores the baseline silently and lists the hold expired
    # (docs/contracts.md, "Gateway command plane").
    sim = await shard_sims(gateway, f"v{unique}")
    await ask(nc, sim.shard, "lease.apply", {"key": "Loot.RareChance", "value": "2", "holdMs": 50})
    await asyncio.sleep(0.3)
    got = await stored_frames(nc, sim.shard, 2)
    assert [m.subject.rsplit(".frame.", 1)[1] for m in got] == ["server.hello", "lease.ok"]


async def test_a_refused_hello_is_told_why_and_the_simulator_stops_dialling(gateway, unique):
    sim = ShardSimulator("127.0.0.1", gateway.port, f"w{unique}", "not-the-token")
    try:
        await asyncio.wait_for(sim.run_forever(retry_s=0.05), 5)
    finally:
        await sim.close()
    assert sim.refused == "server.hello: wrong or missing token"


def test_shard_sim_without_a_token_says_so_and_exits():
    env = {k: v for k, v in os.environ.items() if k != "SHARDBUS_SHARD_TOKEN"}
    done = subprocess.run([sys.executable, "-m", "shardbus", "shard-sim", "--addr", "127.0.0.1:9"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "SHARDBUS_SHARD_TOKEN is not set" in done.stderr


def test_shard_sim_with_a_refused_token_says_why_and_exits(gateway_port_for_cli):
    port = gateway_port_for_cli
    env = {**os.environ, "SHARDBUS_SHARD_TOKEN": "wrong-" + TOKEN}
    done = subprocess.run([sys.executable, "-m", "shardbus", "shard-sim", "--addr", f"127.0.0.1:{port}",
                           "--shard", "cli1"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "the gateway refused the hello: server.hello: wrong or missing token" in done.stderr
    assert TOKEN not in done.stderr + done.stdout
