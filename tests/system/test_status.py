"""``shardbus status`` against real servers and real service processes: replicas counted
through ``shardbus.ping`` (two ledgers are two, the web door among the services), a connected
shard with its last line, stream and bucket sizes, a run whose cleanup is incomplete and a run
waiting for its shard; the table and ``--json``; and where it takes its NATS address from (``--nats-url``,
``SHARDBUS_NATS_URL``, the env file of the ``shardbus up`` running for the directory, the
default), never silently, refusing when the env file's stack is not running.

It runs its own nats-server, so the replicas it counts are exactly the ones it started
(the session's server may be shared with other test runs)."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from nats.errors import TimeoutError as NatsTimeoutError

from shardbus import embedded
from shared import subjects
from simulator.shard import ShardSimulator
from tests.processes import ServiceProcesses

TOKEN = "status-test-token-1234"


@pytest.fixture
def own_nats() -> Iterator[str]:
    state = Path(tempfile.mkdtemp(prefix="shardbus-status-nats-"))
    server = embedded.start_nats(state)
    try:
        yield server.url
    finally:
        server.stop()
        shutil.rmtree(state, ignore_errors=True)


def status(url: str, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shardbus", "status", "--nats-url", url, *extra],
                          capture_output=True, text=True, timeout=30,
                          env=None if env is None else {**os.environ, **env})


async def ask(nc: nats.NATS, subject: str, body: dict) -> dict:
    reply = json.loads((await nc.request(subject, json.dumps(body).encode(), timeout=10)).data)
    assert reply["status"] == 200, (subject, reply)
    return reply


async def held_shards(nc: nats.NATS) -> set[str]:
    """The shards every gateway replica says it holds (each answers ``gateway.status``)."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.publish(subjects.GATEWAY_STATUS, b"{}", reply=inbox)
    held: set[str] = set()
    try:
        while True:
            held |= {s["shard"] for s in json.loads((await sub.next_msg(timeout=0.3)).data).get("shards", [])}
    except NatsTimeoutError:
        pass
    finally:
        await sub.unsubscribe()
    return held


async def make_incomplete_run(nc: nats.NATS, shard: str) -> str:
    """A finished run whose only resource's give-back was refused: cleanup incomplete."""
    run_id = (await ask(nc, subjects.LEDGER_RUN_CREATE, {"shard": shard, "event": "storm"}))["run"]["runId"]
    await ask(nc, subjects.LEDGER_RESOURCE_RECORD, {"runId": run_id, "module": "events", "kind": "creature",
                                                    "ref": "c1", "idempotencyKey": "k1"})
    for step in ("running", "completed"):
        await ask(nc, subjects.LEDGER_RUN_STATUS, {"runId": run_id, "status": step})
    claimed = await ask(nc, subjects.LEDGER_SWEEP_CLAIM, {"runId": run_id, "maxAttempts": 3, "limit": 10,
                                                          "claimTimeoutS": 60})
    for row in claimed["resources"]:
        await ask(nc, subjects.LEDGER_SWEEP_FAILED, {"resourceId": row["resourceId"], "error": "refused",
                                                     "transient": False})
    finished = await ask(nc, subjects.LEDGER_SWEEP_FINISH, {"runId": run_id, "maxAttempts": 3, "summary": {}})
    assert finished["run"]["cleanupStatus"] == "incomplete"
    return run_id


async def test_status_counts_replicas_and_shows_shards_streams_and_incomplete_runs(own_nats, database_url, tmp_path):
    services = ServiceProcesses(tmp_path, own_nats)
    sims: list[ShardSimulator] = []
    nc = await nats.connect(own_nats, connect_timeout=5, max_reconnect_attempts=1)
    try:
        services.start("ledger", database_url=database_url)
        services.start("ledger", database_url=database_url, migrate_on_start="false")
        # Two gateway replicas, one shard each: gateway.status must be asked of both.
        for shard in ("uos", "uot"):
            port = embedded.free_port()
            services.start("gateway", shard_token=TOKEN, shard_port=str(port))
            sims.append(ShardSimulator("127.0.0.1", port, shard, TOKEN))
            await sims[-1].connect()
        await sims[0].send("guild.update", id=1, name="A")
        run_id = await make_incomplete_run(nc, "uos")
        async with asyncio.timeout(10):  # each shard is held once its gateway says so
            while {"uos", "uot"} - await held_shards(nc):
                await asyncio.sleep(0.05)

        done = await asyncio.to_thread(status, own_nats, "--json")
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["errors"] == []
        replicas = {name: s["replicas"] for name, s in report["services"].items()}
        assert replicas == {"gateway": 2, "ledger": 2, "cleanup": 0, "installer": 0, "web": 0}
        ledger_pids = {i["pid"] for i in report["services"]["ledger"]["instances"]}
        assert ledger_pids == {h.proc.pid for h in services.started if h.name == "ledger"}
        assert [s["shard"] for s in report["shards"]] == ["uos", "uot"]
        shard = report["shards"][0]
        assert shard["protocol"] == 7 and shard["lastLineAt"] > 0 and shard["frames"] >= 1
        frames = next(s for s in report["streams"] if s["name"] == "SHARD_FRAMES")
        assert frames["messages"] >= 2 and frames["bytes"] > 0  # the hello and the guild
        guilds = next(b for b in report["buckets"] if b["name"] == "BOARD_GUILDS")
        assert guilds["messages"] >= 1
        assert [r["runId"] for r in report["incompleteRuns"]] == [run_id]

        table = await asyncio.to_thread(status, own_nats)
        assert table.returncode == 0, table.stderr
        rows = {line.split()[0]: line.split() for line in table.stdout.splitlines() if line.strip()}
        assert rows["ledger"][1] == "2" and rows["gateway"][1] == "2" and rows["cleanup"][1] == "0"
        assert {"uos", "uot", run_id, "SHARD_FRAMES", "BOARD_GUILDS"} <= set(rows)
    finally:
        for sim in sims:
            await sim.close()
        await nc.close()
        services.stop_all()


async def test_status_shows_a_run_waiting_for_its_shard_and_a_lease_past_its_deadline(own_nats, database_url,
                                                                                      tmp_path):
    """A finished run whose shard no gateway holds: the sweep's give-back meets nobody, spends
    no attempt, and ``shardbus status`` lists the run as waiting for its shard (not incomplete).
    A running run's lease still confirmed an hour after its deadline is listed too."""
    services = ServiceProcesses(tmp_path, own_nats)
    nc = await nats.connect(own_nats, connect_timeout=5, max_reconnect_attempts=1)
    try:
        services.start("ledger", database_url=database_url)
        await asyncio.to_thread(services.start, "cleanup", sweep_period_s="3600", reconcile_period_s="3600",
                                away_backoff_s="600", away_backoff_max_s="600")
        run_id = (await ask(nc, subjects.LEDGER_RUN_CREATE, {"shard": "uow", "event": "storm"}))["run"]["runId"]
        for ref in ("c1", "c2"):
            await ask(nc, subjects.LEDGER_RESOURCE_RECORD, {"runId": run_id, "module": "events", "kind": "creature",
                                                            "ref": ref, "idempotencyKey": ref})
        for step in ("running", "completed"):
            await ask(nc, subjects.LEDGER_RUN_STATUS, {"runId": run_id, "status": step})
        swept = json.loads((await nc.request(subjects.CLEANUP_SWEEP, b"{}", timeout=30)).data)
        assert (swept["away"], swept["failed"], swept["transient"]) == (2, 0, 0), swept
        leasing = (await ask(nc, subjects.LEDGER_RUN_CREATE, {"shard": "uol", "event": "fair"}))["run"]["runId"]
        await ask(nc, subjects.LEDGER_RUN_STATUS, {"runId": leasing, "status": "running"})
        lease = (await ask(nc, subjects.LEDGER_RESOURCE_RECORD, {
            "runId": leasing, "module": "events", "kind": "lease", "ref": "spawn.rate", "idempotencyKey": "l1",
            "leaseDeadline": int((time.time() - 3600) * 1000)}))["resource"]

        done = await asyncio.to_thread(status, own_nats, "--json", "--wait", "0.3")
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["errors"] == []
        assert report["incompleteRuns"] == []
        (waiting,) = report["waitingRuns"]
        assert {k: waiting[k] for k in ("runId", "shard", "rows", "away")} == {
            "runId": run_id, "shard": "uow", "rows": 2, "away": 1}
        assert waiting["retryAt"]
        assert report["overdueLeases"]["count"] == 1
        assert [r["resourceId"] for r in report["overdueLeases"]["resources"]] == [lease["resourceId"]]

        table = (await asyncio.to_thread(status, own_nats, "--wait", "0.3")).stdout
        assert "RUNS WAITING FOR THEIR SHARD (1; cleanup pending, no attempt spent)" in table
        assert "LEASES PAST THEIR DEADLINE, STILL CONFIRMED (1; the shard should have let go)" in table
        assert next(line for line in table.splitlines() if line.startswith(leasing)).split()[2:5] == [
            "events", "lease", "spawn.rate"]
        (line,) = [line for line in table.splitlines() if line.startswith(run_id)]
        assert line.split()[1:3] == ["uow", "2"] and "(in " in line and line.split()[-1] == "1"
        assert "wants a person" not in table  # waiting less than SHARDBUS_AWAY_ALERT_S (900 s)
        assert waiting["waitingSince"] and waiting["waitingTooLong"] is False and report["awayAlertS"] == 900

        # Past the alert (0 s here): flagged in words, in the table and in JSON.
        alert = {"SHARDBUS_AWAY_ALERT_S": "0"}
        flagged = json.loads((await asyncio.to_thread(status, own_nats, "--json", "--wait", "0.3", env=alert)).stdout)
        assert [(r["runId"], r["waitingTooLong"]) for r in flagged["waitingRuns"]] == [(run_id, True)]
        table = (await asyncio.to_thread(status, own_nats, "--wait", "0.3", env=alert)).stdout
        assert "RUNS WAITING FOR THEIR SHARD (1; cleanup pending, no attempt spent; 1 longer than 0 s" in table
        (line,) = [line for line in table.splitlines() if line.startswith(run_id)]
        assert "!! waiting " in line and "for its shard: wants a person" in line
    finally:
        await nc.close()
        services.stop_all()


async def test_status_with_nothing_running_says_so_and_status_without_nats_fails_cleanly(own_nats):
    done = await asyncio.to_thread(status, own_nats, "--json", "--wait", "0.3")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert all(s["replicas"] == 0 for s in report["services"].values()) and report["shards"] == []
    assert any(error.startswith("incomplete runs") for error in report["errors"])  # no ledger answers

    url = f"nats://someone:hunter2secret@127.0.0.1:{embedded.free_port()}"
    failed = await asyncio.to_thread(status, url)
    assert failed.returncode == 1 and "cannot reach NATS" in failed.stderr
    assert "hunter2secret" not in failed.stderr + failed.stdout


# --- where the NATS address comes from ---------------------------------------------------------

def status_in(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``shardbus status`` typed in ``cwd``, with no SHARDBUS_ variable but ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SHARDBUS_")}
    return subprocess.run([sys.executable, "-m", "shardbus", "status", *args], cwd=cwd, env={**clean, **env},
                          capture_output=True, text=True, timeout=30)


def write_env_file(project: Path, nats_url: str) -> Path:
    """The env file a ``shardbus up`` in ``project`` would leave (its lock not held yet)."""
    state = project / ".shardbus"
    state.mkdir()
    (state / "up.lock").write_text("4242")
    (state / "env").write_text(f"# test\nNATS_URL={nats_url}\nSHARD_TOKEN=t\n")
    return state / "env"


async def test_status_asks_the_running_stack_of_its_directory_and_says_so(own_nats, tmp_path):
    env_file = write_env_file(tmp_path, own_nats)
    with open(env_file.parent / "up.lock", "a+") as lock:  # as a running `shardbus up` holds it
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        done = await asyncio.to_thread(status_in, tmp_path, "--json", "--wait", "0.3")
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["nats"] == own_nats
        assert report["natsSource"] == f"{env_file}, written by the shardbus up running there (pid 4242)"

        # An explicit address wins, and says so; so does --nats-url.
        url = f"nats://127.0.0.1:{embedded.free_port()}"
        failed = await asyncio.to_thread(status_in, tmp_path, "--wait", "0.3", SHARDBUS_NATS_URL=url)
        assert failed.returncode == 1
        assert f"cannot reach NATS at {url} (the address came from SHARDBUS_NATS_URL, which wins over {env_file}" \
            in failed.stderr
        named = await asyncio.to_thread(status_in, tmp_path, "--json", "--wait", "0.3", "--nats-url", own_nats)
        assert json.loads(named.stdout)["natsSource"] == "--nats-url"

        # SHARDBUS_STATE_DIR finds the same stack from anywhere.
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        found = await asyncio.to_thread(status_in, elsewhere, "--json", "--wait", "0.3",
                                        SHARDBUS_STATE_DIR=str(env_file.parent))
        assert json.loads(found.stdout)["nats"] == own_nats

    # The lock released: that stack is not running, and status will not ask anything else.
    stale = await asyncio.to_thread(status_in, tmp_path, "--wait", "0.3")
    assert stale.returncode == 1 and stale.stdout == ""
    assert f"the shardbus up of {env_file.parent} is not running" in stale.stderr
    assert own_nats in stale.stderr


async def test_status_without_any_address_says_it_asked_the_default(tmp_path):
    done = await asyncio.to_thread(status_in, tmp_path, "--json", "--wait", "0.3")
    said = done.stdout + done.stderr
    # Whatever listens on 127.0.0.1:4222 (or nothing), the default is named as such.
    assert "the default: no --nats-url, no SHARDBUS_NATS_URL, and no running shardbus up here" in said
    if done.returncode == 0:
        assert json.loads(done.stdout)["nats"] == "nats://127.0.0.1:4222"
    else:
        assert "cannot reach NATS at nats://127.0.0.1:4222" in done.stderr
