"""The NATS users and permissions of the deployment (deploy/nats/nats.conf), proven on a real
nats-server started with that very file on a free loopback port, passwords from the
environment as compose gives them:

- a game module can end (expire) and reconcile only its own rows: its publish to another
  module's subject is refused by the server, and the other module's row stays as it was;
- the website cannot forge a frame, a sweep transition or an expiry, but reads frames (live,
  replayed, boards) and sends commands and ledger requests;
- every service does its job under its own user (real processes): a shard's hello and frames
  reach the website, a run is created, cleanup gives a creature back through the gateway,
  the installer lists, and ``shardbus status`` runs as the operator;
- with per-shard tokens a shard cannot say hello as another shard.

A permission the server refuses arrives at the client as an asynchronous
``Permissions Violation`` error (the publish itself does not fail), so each refusal is
detected through the error callback AND by a subscriber that never gets the message.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.js.api import DeliverPolicy

from shardbus import embedded
from shared import subjects
from simulator.shard import ShardSimulator
from tests.processes import ServiceProcesses

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "nats" / "nats.conf"
USERS = ("gateway", "ledger", "cleanup", "installer", "website", "operator", "module-events")
"""Every user of the config (module-events: the example game module ``events``)."""

REFUSAL_WAIT_S = 3.0
"""Longest wait for the server's permissions-violation error."""

NOT_DELIVERED_WAIT_S = 0.3
"""How long a subscriber is watched for a message that must not arrive."""


def password_variable(user: str) -> str:
    """The environment variable the config reads ``user``'s password from."""
    return f"{user.upper().replace('-', '_')}_NATS_PASSWORD"


@dataclass
class SecureNats:
    """The nats-server running the deployment config, and each user's password."""

    port: int
    passwords: dict[str, str]

    def url(self, user: str) -> str:
        return f"nats://{user}:{self.passwords[user]}@127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def secure_nats() -> Iterator[SecureNats]:
    """nats-server -c deploy/nats/nats.conf on loopback (free client and monitoring ports)."""
    # nats-server parses a $VARIABLE's value as a config value: one starting with "-" or a
    # digit can fail to parse or become a number, so passwords start with a letter (as the
    # docs ask of operators).
    passwords = {user: f"p{secrets.token_hex(16)}" for user in USERS}
    state = Path(tempfile.mkdtemp(prefix="shardbus-secure-nats-"))
    with pytest.MonkeyPatch.context() as env:  # the server reads $<USER>_NATS_PASSWORD at start
        for user, password in passwords.items():
            env.setenv(password_variable(user), password)
        server = embedded.start_nats(state, extra_args=("-c", str(CONFIG), "-m", "-1"))
    try:
        yield SecureNats(server.port, passwords)
    finally:
        server.stop()
        shutil.rmtree(state, ignore_errors=True)


@dataclass
class User:
    """One client connection as a user, with the errors the server sent it."""

    name: str
    nc: nats.NATS
    errors: list[str] = field(default_factory=list)

    async def refused(self, subject: str) -> bool:
        """True when the server answers a publish to ``subject`` with a permissions violation."""
        await self.nc.publish(subject, b"{}")
        await self.nc.flush(timeout=5)
        needle = f'permissions violation for publish to "{subject.lower()}"'
        try:
            async with asyncio.timeout(REFUSAL_WAIT_S):
                while not any(needle in error.lower() for error in self.errors):
                    await asyncio.sleep(0.01)
        except TimeoutError:
            return False
        return True

    async def ask(self, subject: str, body: dict[str, Any] | None = None, timeout: float = 10) -> dict[str, Any]:
        msg = await self.nc.request(subject, json.dumps(body or {}).encode(), timeout=timeout)
        return json.loads(msg.data)


@pytest.fixture
async def connect(secure_nats: SecureNats) -> AsyncIterator[Any]:
    """Connect as a user (``await connect("website")``); every connection is closed after."""
    opened: list[User] = []

    async def open_as(name: str) -> User:
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc))

        nc = await nats.connect(secure_nats.url(name), connect_timeout=5, allow_reconnect=False,
                                max_reconnect_attempts=1, error_cb=on_error)
        opened.append(User(name, nc, errors))
        return opened[-1]

    yield open_as
    for user in opened:
        await user.nc.close()


class Inbox:
    """A subscription that records what it receives."""

    def __init__(self) -> None:
        self.got: list[Any] = []

    async def on_msg(self, msg: Any) -> None:
        self.got.append(msg)

    async def wait_for(self, count: int, timeout: float = 5.0) -> None:
        async with asyncio.timeout(timeout):
            while len(self.got) < count:
                await asyncio.sleep(0.01)


async def listen(user: User, subject: str) -> Inbox:
    inbox = Inbox()
    await user.nc.subscribe(subject, cb=inbox.on_msg)
    await user.nc.flush(timeout=5)
    await asyncio.sleep(0.05)  # interest seen by the server before another connection publishes
    return inbox


# --- modules ------------------------------------------------------------------------------

async def test_a_module_can_expire_and_reconcile_only_its_own_rows(connect):
    ledger, module = await connect("ledger"), await connect("module-events")
    expiries = await listen(ledger, "ledger.expired.*")
    reconciles = await listen(ledger, "ledger.reconcile.*")

    assert await module.refused(subjects.ledger_expired("other"))
    assert await module.refused(subjects.ledger_reconcile("other"))
    await asyncio.sleep(NOT_DELIVERED_WAIT_S)
    assert expiries.got == [] and reconciles.got == []

    await module.nc.publish(subjects.ledger_expired("events"), b"{}")
    await module.nc.publish(subjects.ledger_reconcile("events"), b"{}")
    await expiries.wait_for(1)
    await reconciles.wait_for(1)
    assert [m.subject for m in expiries.got + reconciles.got] == ["ledger.expired.events", "ledger.reconcile.events"]


async def test_a_module_cannot_send_frames_sweeps_or_commands(connect):
    module = await connect("module-events")
    allowed = [subject for subject in (subjects.frame("uo1", "guild.update"), subjects.LEDGER_SWEEP_CLAIM,
                                       subjects.command("uo1", "admin.ban"), subjects.LEDGER_RUN_CREATE)
               if not await module.refused(subject)]
    assert allowed == []


async def test_a_module_answers_its_own_revert_subject(connect):
    cleanup, module = await connect("cleanup"), await connect("module-events")

    async def answer(msg: Any) -> None:
        await msg.respond(json.dumps({"status": 200, "result": "removed"}).encode())

    await module.nc.subscribe(subjects.module_revert("events"), cb=answer)
    await module.nc.flush(timeout=5)
    await asyncio.sleep(0.05)
    assert (await cleanup.ask(subjects.module_revert("events"), {"ref": "z1"}))["result"] == "removed"
    assert module.errors == []


# --- the website --------------------------------------------------------------------------

async def test_the_website_cannot_forge_a_frame_a_sweep_an_expiry_or_a_board(connect):
    website, ledger = await connect("website"), await connect("ledger")
    frames = await listen(website, subjects.FRAMES_WILDCARD)  # it may read frames...
    sweeps = await listen(ledger, "ledger.sweep.*")
    forged = (subjects.frame("x", "y"),  # ...but not write one
              subjects.LEDGER_SWEEP_CLAIM, subjects.LEDGER_SWEEP_REVERTED,
              subjects.ledger_expired("events"), subjects.ledger_reconcile("events"),
              subjects.deadletter("x"), "$KV.BOARD_GUILDS.x.1.guild",
              "$JS.API.STREAM.DELETE.SHARD_FRAMES", "$JS.API.STREAM.PURGE.SHARD_FRAMES")
    allowed = [subject for subject in forged if not await website.refused(subject)]
    assert allowed == []
    await asyncio.sleep(NOT_DELIVERED_WAIT_S)
    assert frames.got == [] and sweeps.got == []


async def test_the_website_reads_frames_and_sends_commands(connect):
    website, gateway = await connect("website"), await connect("gateway")
    frames = await listen(website, subjects.FRAMES_WILDCARD)
    await gateway.nc.publish(subjects.frame("x", "y"), b'{"kind":"y"}')
    await frames.wait_for(1)
    assert frames.got[0].subject == "shard.x.frame.y"

    async def answer(msg: Any) -> None:  # the gateway replica holding shard x
        await msg.respond(json.dumps({"status": 200, "body": {"kind": "item.catalog"}}).encode())

    await gateway.nc.subscribe(subjects.command_wildcard("x"), cb=answer)
    await gateway.nc.flush(timeout=5)
    await asyncio.sleep(0.05)
    assert (await website.ask(subjects.command("x", "item.catalog")))["status"] == 200
    assert website.errors == [] and gateway.errors == []


# --- every service under its own user -----------------------------------------------------

async def until(check: Any, timeout: float = 10.0, pause: float = 0.05) -> Any:
    """Call the async ``check`` until it returns something true; TimeoutError after ``timeout``."""
    async with asyncio.timeout(timeout):
        while not (result := await check()):
            await asyncio.sleep(pause)
    return result


async def test_every_service_does_its_job_under_its_own_user(secure_nats, connect, database_url, tmp_path):
    own_tokens = {"uoa": secrets.token_urlsafe(16), "uob": secrets.token_urlsafe(16)}
    port = embedded.free_port()
    services = ServiceProcesses(tmp_path, "")
    sims: list[ShardSimulator] = []
    try:
        for name, settings in (
                ("gateway", {"shard_token": secrets.token_urlsafe(16), "shard_tokens": json.dumps(own_tokens),
                             "shard_port": str(port)}),
                ("ledger", {"database_url": database_url}),
                ("cleanup", {"sweep_period_s": "600"}),
                ("installer", {"modules_dir": str(tmp_path / "modules")})):
            services.nats_url = secure_nats.url(name)
            services.start(name, **settings)
        website, operator, module = await connect("website"), await connect("operator"), await connect("module-events")

        # The shard plane: hello and frames reach the website live, replayed and on the board.
        frames = await listen(website, "shard.uoa.frame.>")
        sim = ShardSimulator("127.0.0.1", port, "uoa", own_tokens["uoa"])
        sims.append(sim)
        await sim.connect()
        await sim.send("guild.update", guild={"id": 7, "name": "Knights"})
        await frames.wait_for(2)
        assert [m.subject for m in frames.got[:2]] == ["shard.uoa.frame.server.hello", "shard.uoa.frame.guild.update"]
        board = await until(lambda: _board(website))
        assert board[0]["name"] == "Knights"
        js = website.nc.jetstream()
        replay = await js.subscribe("shard.uoa.frame.>", ordered_consumer=True, deliver_policy=DeliverPolicy.ALL)
        assert (await replay.next_msg(timeout=5)).subject == "shard.uoa.frame.server.hello"
        await replay.unsubscribe()
        guilds = await js.key_value("BOARD_GUILDS")
        watcher = await guilds.watch("uoa.>")
        entry = await watcher.updates(timeout=5)
        assert entry is not None and entry.key.startswith("uoa.7")
        await watcher.stop()

        # The ledger, as the website: a run, a creature spawned through the gateway, recorded.
        run = (await website.ask(subjects.LEDGER_RUN_CREATE, {"shard": "uoa", "event": "invasion"}))["run"]
        spawned = await website.ask(subjects.command("uoa", "world.spawn"),
                                    {"runId": run["runId"], "what": "creature", "idempotencyKey": "spawn-1"})
        assert spawned["status"] == 200, spawned
        ref = spawned["body"]["refs"][0]
        for module_id, kind, target in (("events", "creature", ref), ("events", "zone", "z-own"),
                                        ("other", "zone", "z-other")):
            recorded = await website.ask(subjects.LEDGER_RESOURCE_RECORD, {
                "runId": run["runId"], "module": module_id, "kind": kind, "ref": target,
                "idempotencyKey": f"rec-{module_id}-{target}"})
            assert recorded["status"] == 200, recorded

        # A module closes its own row, never another module's.
        assert await module.refused(subjects.ledger_expired("other"))
        assert (await module.ask(subjects.ledger_expired("events"), {"kind": "zone", "ref": "z-own"}))["expired"] == 1
        console = await website.ask(subjects.LEDGER_CONSOLE, {"runId": run["runId"]})
        by_ref = {r["ref"]: r["status"] for r in console["resources"]}
        assert by_ref == {ref: "confirmed", "z-own": "expired", "z-other": "confirmed"}

        # Cleanup gives the creature back through the gateway (its command verbs, the ledger's
        # sweep subjects), asked by the operator.
        for status in ("running", "completed"):
            moved = await website.ask(subjects.LEDGER_RUN_STATUS, {"runId": run["runId"], "status": status})
            assert moved["status"] == 200, moved
        swept = await operator.ask(subjects.CLEANUP_SWEEP, {"runId": run["runId"]}, timeout=30)
        assert swept["status"] == 200 and swept["run"]["reverted"] == 1, swept
        assert sim.executed["world.despawn"] == 1

        # The installer answers; a removal takes and releases the site lock in its bucket.
        listed = await website.ask(subjects.INSTALLER_LIST)
        assert listed["status"] == 200 and listed["modules"] == []
        removed = await website.ask(subjects.INSTALLER_REMOVE, {"id": "nothing-here"})  # under the lock
        assert removed["status"] == 404 and "not installed" in removed["error"], removed

        # Per-shard tokens: uoa's token does not let a shard say hello as uob.
        impostor = ShardSimulator("127.0.0.1", port, "uob", own_tokens["uoa"])
        sims.append(impostor)
        await impostor.connect()
        await asyncio.wait_for(impostor.disconnected.wait(), 5)
        held = {s["shard"] for s in (await operator.ask(subjects.GATEWAY_STATUS))["shards"]}
        assert held == {"uoa"}

        # The operator's view works under the operator's permissions.
        done = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "shardbus", "status", "--json",
                                                        "--nats-url", secure_nats.url("operator")],
                                       capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        status = json.loads(done.stdout)
        assert status["errors"] == []
        assert {name: s["replicas"] for name, s in status["services"].items()} == {
            "cleanup": 1, "gateway": 1, "installer": 1, "ledger": 1}
        assert [s["shard"] for s in status["shards"]] == ["uoa"]
        assert "SHARD_FRAMES" in {s["name"] for s in status["streams"]}
        assert {"BOARD_GUILDS", "SHARDBUS_INSTALLER"} <= {b["name"] for b in status["buckets"]}
        assert secure_nats.passwords["operator"] not in done.stdout + done.stderr

        # No service hit a permission it lacks, and nobody here did by accident.
        for handle in services.started:
            assert "ermissions violation" not in handle.log().lower(), handle.name
            for password in secure_nats.passwords.values():
                assert password not in handle.log(), f"{handle.name} logged a password"
        assert website.errors == [] and operator.errors == []
    finally:
        for sim in sims:
            await sim.close()
        services.stop_all()


async def _board(website: User) -> list[dict[str, Any]]:
    reply = await website.ask(subjects.board("uoa", "guilds"))
    return reply.get("items") or []
