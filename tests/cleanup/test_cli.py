"""``shardbus cleanup sweep|retry|reconcile``: an operator asks a running cleanup replica and
reads its answer; with nobody to ask, the command says so plainly."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

from tests.cleanup.conftest import start_cleanup


def _shardbus(nats_url: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SHARDBUS_NATS_URL": nats_url}
    return subprocess.run([sys.executable, "-m", "shardbus", "cleanup", *args], env=env, capture_output=True,
                          text=True, timeout=60)


async def test_an_operator_sweeps_from_the_command_line(nats_url, shard, ledger, services, unique):
    await start_cleanup(services)
    run = f"run-{unique}"
    await ledger.run(run, shard.id)
    (ref,) = (await shard.command("world.spawn", {"runId": run, "what": "npc"}))["body"]["serials"]
    await ledger.record(run, "npc", ref)
    await ledger.end(run, "completed")

    # In a thread: the simulated shard answering the despawn lives on this test's event loop.
    done = await asyncio.to_thread(_shardbus, nats_url, "sweep", "--run-id", run)

    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["status"] == 200 and answer["run"]["reverted"] == 1
    assert answer["run"]["cleanupStatus"] == "complete"


async def test_a_refused_retry_exits_non_zero_with_the_reason_on_one_line(nats_url, ledger, services, unique):
    await start_cleanup(services)
    done = await asyncio.to_thread(_shardbus, nats_url, "retry", "--run-id", f"nope-{unique}")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == f"error 404: no run 'nope-{unique}'\n"
    raw = await asyncio.to_thread(_shardbus, nats_url, "retry", "--run-id", f"nope-{unique}", "--json")
    assert raw.returncode == 1 and json.loads(raw.stdout) == {"status": 404, "error": f"no run 'nope-{unique}'"}


async def test_sweeping_a_run_that_does_not_exist_is_the_callers_typo_not_a_warning(nats_url, ledger, services,
                                                                                     unique):
    cleanup = await start_cleanup(services)
    done = await asyncio.to_thread(_shardbus, nats_url, "sweep", "--run-id", f"nope-{unique}")

    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == f"error 404: no run 'nope-{unique}'\n"
    raw = await asyncio.to_thread(_shardbus, nats_url, "sweep", "--run-id", f"nope-{unique}", "--json")
    assert json.loads(raw.stdout) == {"status": 404, "error": f"no run 'nope-{unique}'"}  # no zero-filled run
    said = [json.loads(line) for line in cleanup.log().splitlines() if f"nope-{unique}" in line]
    assert said and {entry["level"] for entry in said} == {"info"}, said
    assert all(entry["status"] == 404 for entry in said)


async def test_a_run_not_over_yet_is_refused_on_one_line_too(nats_url, ledger, services, unique):
    cleanup = await start_cleanup(services)
    await ledger.run(f"r{unique}", "uo1", "running")
    done = await asyncio.to_thread(_shardbus, nats_url, "sweep", "--run-id", f"r{unique}")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("error 409: run ") and done.stderr.count("\n") == 1
    assert "warning" not in {json.loads(line)["level"] for line in cleanup.log().splitlines() if f"r{unique}" in line}


def test_nats_out_of_reach_is_said_without_the_password():
    done = _shardbus("nats://ops:hunter2-secret@127.0.0.1:1", "sweep")
    assert done.returncode == 1
    assert "cannot reach NATS" in done.stderr and "hunter2-secret" not in done.stderr + done.stdout


def test_a_run_id_the_service_would_refuse_is_refused_before_anything_is_sent():
    # Nothing listens at this address: the refusal comes from the contract, not a connection.
    done = _shardbus("nats://127.0.0.1:1", "sweep", "--run-id", "a.b")
    assert done.returncode == 1
    assert done.stderr.strip() == ("error 400: invalid request: runId: String should match pattern "
                                   "'^[A-Za-z0-9_-]{1,64}$'")
