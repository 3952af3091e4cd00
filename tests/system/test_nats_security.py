"""The NATS users and permissions of the deployment (deploy/nats/nats.conf), proven on a real
nats-server started with that very file on a free loopback port, passwords from the
environment as compose gives them:

- a game module can end (expire) and reconcile only its own rows: its publish to another
  module's subject is refused by the server, and the other module's row stays as it was;
- the website cannot forge a frame, a sweep transition or an expiry, but reads frames (live,
  replayed, boards) and sends commands and ledger requests;
- nor can it forge a ledger or cleanup request through a JetStream push consumer delivering
  its news item to ledger.sweep.claim (the services refuse what JetStream delivered, and any
  request whose reply is a ``$`` subject, the gateway's own nats-py subscriptions too), while
  its own kv.watch works; its JetStream API reaches only frames, dead letters and the boards,
  not the installer's lock bucket;
- every service does its job under its own user (real processes): a shard's hello and frames
  reach the website, a run is created, cleanup gives a creature back through the gateway,
  the installer lists, the web door answers, and ``shardbus status`` runs as the operator;
- the WebSocket listener (browser pages, nats.ws) admits the website only: over ``ws://`` it
  requests and hears what it may and is refused what it may not; every other user is refused;
- the web door's own user relays a module's report and the operator's sweeps, builds its feed
  stream WEB_FEED from SHARD_FRAMES, and can neither forge a frame nor touch another stream;
- with per-shard tokens a shard cannot say hello as another shard;
- each user has its own inbox prefix, ``_INBOX_<user>``: no other user may subscribe to it, so
  a client connecting with its prefix has replies nobody else hears (even a listener on the
  shared ``_INBOX.>``); the ledger's one question is JetStream's, to create its events stream;
- the config fsyncs every JetStream write (``sync_interval: always``, asked of the running
  server), and a 3-node cluster started from deploy/nats/cluster-node.conf has the same users
  and rules on every node.

A permission the server refuses arrives at the client as an asynchronous
``Permissions Violation`` error (the publish itself does not fail), so each refusal is
detected through the error callback AND by a subscriber that never gets the message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.js.api import DeliverPolicy, StreamSource
from nats.js.errors import NotFoundError

from shardbus import embedded, registry
from shared import subjects
from shared.nats_connect import inbox_prefix
from simulator.shard import ShardSimulator
from tests.processes import ServiceProcesses
from tests.streams import publish_when_led

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "nats" / "nats.conf"
NODE_CONFIG = ROOT / "deploy" / "nats" / "cluster-node.conf"
USERS = (*registry.NAMES, "website", "operator", "module-events")
"""Every user of the config (module-events: the example game module ``events``; web: the web door)."""

REFUSAL_WAIT_S = 3.0
"""Longest wait for the server's permissions-violation error."""

NOT_DELIVERED_WAIT_S = 0.3
"""How long a subscriber is watched for a message that must not arrive."""


def password_variable(user: str) -> str:
    """The environment variable the config reads ``user``'s password from."""
    return f"{user.upper().replace('-', '_')}_NATS_PASSWORD"


def own_inbox(user: str) -> str:
    """The inbox prefix only ``user`` may subscribe under (nats.conf)."""
    return f"_INBOX_{user}"


def config_text(websocket_port: int) -> str:
    """nats.conf with its WebSocket listener moved to 127.0.0.1:``websocket_port``: the one
    address no command-line flag sets (compose uses the file as it is, on 9222)."""
    text, count = re.subn(r"(^websocket \{\n)(.*?^\s*port:\s*)9222$",
                          rf'\g<1>  host: "127.0.0.1"\n\g<2>{websocket_port}',
                          CONFIG.read_text(), count=1, flags=re.M | re.S)
    assert count == 1, "nats.conf has no websocket block on port 9222"
    return text


@dataclass
class SecureNats:
    """The nats-server running the deployment config, and each user's password."""

    port: int
    passwords: dict[str, str]
    monitoring: str = ""
    ws_port: int = 0

    def url(self, user: str) -> str:
        return f"nats://{user}:{self.passwords[user]}@127.0.0.1:{self.port}"

    def ws_url(self, user: str) -> str:
        """The user on the WebSocket listener, as a browser page's nats.ws would connect."""
        return f"ws://{user}:{self.passwords[user]}@127.0.0.1:{self.ws_port}"


def monitoring_url(server: embedded.NatsServer, state: Path) -> str:
    """The monitoring URL a server started with ``-m -1`` wrote to its ports file."""
    ports = json.loads((state / "ports" / f"{Path(server.args[0]).name}_{server.proc.pid}.ports").read_text())
    return ports["monitoring"][0]


@pytest.fixture(scope="module")
def secure_nats() -> Iterator[SecureNats]:
    """nats-server -c deploy/nats/nats.conf on loopback (free client and monitoring ports)."""
    # nats-server parses a $VARIABLE's value as a config value: one starting with "-" or a
    # digit can fail to parse or become a number, so passwords start with a letter (as the
    # docs ask of operators).
    passwords = {user: f"p{secrets.token_hex(16)}" for user in USERS}
    state = Path(tempfile.mkdtemp(prefix="shardbus-secure-nats-"))
    ws_port = embedded.free_port()
    config = state / "deploy-nats.conf"
    config.write_text(config_text(ws_port))
    with pytest.MonkeyPatch.context() as env:  # the server reads $<USER>_NATS_PASSWORD at start
        for user, password in passwords.items():
            env.setenv(password_variable(user), password)
        server = embedded.start_nats(state, extra_args=("-c", str(config), "-m", "-1"))
    try:
        assert server.ws_url == f"ws://127.0.0.1:{ws_port}"
        yield SecureNats(server.port, passwords, monitoring_url(server, state), ws_port)
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
        return await self._violation("publish to", subject)

    async def refused_subscription(self, subject: str) -> bool:
        """True when the server refuses a subscription to ``subject`` (a permissions violation)."""
        await self.nc.subscribe(subject)
        return await self._violation("subscription to", subject)

    async def _violation(self, what: str, subject: str) -> bool:
        """Whether the server reports a permissions violation for ``what`` ``subject``."""
        await self.nc.flush(timeout=5)
        needle = f'permissions violation for {what} "{subject.lower()}"'
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

    async def open_as(name: str, url: str | list[str] = "") -> User:
        """Each user hears its replies under its own inbox prefix, as the config expects."""
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc))

        servers = url or secure_nats.url(name)
        # The prefix the product derives from the URL's user, which the config must allow.
        nc = await nats.connect(servers, connect_timeout=5, allow_reconnect=False,
                                max_reconnect_attempts=1, error_cb=on_error, inbox_prefix=inbox_prefix(servers))
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
    reply = await _reads_a_frame_and_sends_a_command(website, gateway, "x")
    assert reply["status"] == 200
    assert website.errors == [] and gateway.errors == []


async def _reads_a_frame_and_sends_a_command(website: Any, gateway: Any, shard: str) -> dict[str, Any]:
    """``website`` hears a frame the gateway publishes for ``shard`` and asks ``shard`` a
    command that the gateway answers; returns the reply."""
    frames = await listen(website, f"shard.{shard}.frame.>")
    await gateway.nc.publish(subjects.frame(shard, "guild.update"), b'{"kind":"guild.update"}')
    await frames.wait_for(1)
    assert frames.got[0].subject == f"shard.{shard}.frame.guild.update"

    async def answer(msg: Any) -> None:  # the gateway replica holding the shard
        await msg.respond(json.dumps({"status": 200, "body": {"kind": "item.catalog"}}).encode())

    await gateway.nc.subscribe(subjects.command_wildcard(shard), cb=answer)
    await gateway.nc.flush(timeout=5)
    await asyncio.sleep(0.05)
    return await website.ask(subjects.command(shard, "item.catalog"))


# --- the WebSocket listener (browser pages) --------------------------------------------------

async def test_the_website_over_websocket_requests_what_it_may_and_is_refused_what_it_may_not(connect, secure_nats):
    page = await connect("website", url=secure_nats.ws_url("website"))  # a browser page's nats.ws
    gateway = await connect("gateway")
    assert page.nc.connected_url.scheme == "ws"

    reply = await _reads_a_frame_and_sends_a_command(page, gateway, "wsx")  # its reply on _INBOX_website, over ws
    assert reply == {"status": 200, "body": {"kind": "item.catalog"}}
    assert page.errors == []

    forged = (subjects.frame("wsx", "y"), subjects.LEDGER_SWEEP_CLAIM, subjects.ledger_expired("events"),
              "$KV.BOARD_GUILDS.wsx.1.guild", "$JS.API.STREAM.DELETE.SHARD_FRAMES")
    assert [subject for subject in forged if not await page.refused(subject)] == []
    assert await page.refused_subscription(f"{own_inbox('gateway')}.>")
    assert await page.refused_subscription("_INBOX.>")


@pytest.mark.parametrize("user", [user for user in USERS if user != "website"])
async def test_only_the_website_may_log_in_over_websocket(secure_nats, user):
    with pytest.raises(Exception, match="Authorization Violation"):
        await nats.connect(secure_nats.ws_url(user), connect_timeout=3, allow_reconnect=False,
                           max_reconnect_attempts=1, error_cb=_quiet)
    nc = await nats.connect(secure_nats.url(user), connect_timeout=3, allow_reconnect=False,
                            max_reconnect_attempts=1, error_cb=_quiet, inbox_prefix=own_inbox(user))
    await nc.close()  # the same password on the client port is fine


async def test_a_wrong_website_password_is_refused_over_websocket(secure_nats):
    wrong = secure_nats.ws_url("website").replace(secure_nats.passwords["website"], "wrong")
    with pytest.raises(Exception, match="Authorization Violation"):
        await nats.connect(wrong, connect_timeout=3, allow_reconnect=False, max_reconnect_attempts=1, error_cb=_quiet)


# --- inboxes ------------------------------------------------------------------------------

async def test_no_user_may_subscribe_to_another_users_inbox(connect):
    users = {name: await connect(name) for name in USERS}
    allowed = [(name, other) for name, user in users.items() for other in USERS
               if other != name and not await user.refused_subscription(f"{own_inbox(other)}.>")]
    assert allowed == []
    # Nor around it: the whole subject space, or any first token.
    website = users["website"]
    assert await website.refused_subscription(">") and await website.refused_subscription("*.>")


async def test_each_user_may_subscribe_to_its_own_inbox(connect):
    users = [await connect(name) for name in USERS]
    refused = await asyncio.gather(*(user.refused_subscription(f"{own_inbox(user.name)}.x") for user in users))
    assert {user.name: was for user, was in zip(users, refused, strict=True)} == {name: False for name in USERS}


async def test_the_ledger_creates_its_events_stream_relays_into_it_and_touches_no_other(connect):
    """Its JetStream is LEDGER_EVENTS alone: create (or bring forward) at start, and what the
    outbox relay does — the stream's last sequence, a publish with its message id, and a
    message read back at a takeover."""
    ledger = await connect("ledger")
    js = ledger.nc.jetstream()
    from services.ledger.events.event_stream import declare_events_stream
    from services.ledger.events.outbox_relay import message_id

    await declare_events_stream(js)
    await declare_events_stream(js)  # again, as every replica does at start
    before = (await js.stream_info(subjects.LEDGER_EVENTS_STREAM)).state.last_seq
    ack = await js.publish(subjects.ledger_run_events("security"), b'{"eventId":1}',
                           stream=subjects.LEDGER_EVENTS_STREAM, headers={"Nats-Msg-Id": message_id("test", 1)})
    assert ack.seq > before
    assert (await js.get_msg(subjects.LEDGER_EVENTS_STREAM, ack.seq)).data == b'{"eventId":1}'
    assert ledger.errors == []
    # A website replays a run's events from it (read-only: an ordered consumer).
    website = await connect("website")
    replay = await website.nc.jetstream().subscribe(subjects.ledger_run_events("security"), ordered_consumer=True,
                                                    deliver_policy=DeliverPolicy.ALL)
    assert (await replay.next_msg(timeout=5)).data == b'{"eventId":1}'
    await replay.unsubscribe()
    assert website.errors == []
    assert await website.refused(subjects.ledger_run_events("security"))  # it cannot forge one
    assert [s for s in ("$JS.API.STREAM.CREATE.OTHER", "$JS.API.STREAM.DELETE.LEDGER_EVENTS",
                        "$JS.API.STREAM.PURGE.LEDGER_EVENTS", "$JS.API.STREAM.UPDATE.SHARD_FRAMES")
            if not await ledger.refused(s)] == []


async def test_replies_on_a_users_own_inbox_reach_that_user_only(connect):
    """A client with its own prefix gets its replies (JetStream's and a service's) where no
    other user hears them, even one listening on the whole shared inbox."""
    spy = await connect("website")
    shared_inbox = await listen(spy, "_INBOX.>")
    gateway, ledger, module = await connect("gateway"), await connect("ledger"), await connect("module-events")

    async def answer(msg: Any) -> None:
        assert msg.reply.startswith(f"{own_inbox('module-events')}.")
        await msg.respond(json.dumps({"status": 200, "expired": 0}).encode())

    await ledger.nc.subscribe(subjects.ledger_expired("events"), cb=answer)
    await ledger.nc.flush(timeout=5)
    await asyncio.sleep(0.05)

    info = await gateway.nc.jetstream().account_info()  # $JS.API.INFO, answered by the server
    assert info.streams >= 0
    assert (await module.ask(subjects.ledger_expired("events"), {"kind": "zone", "ref": "z"}))["status"] == 200
    stream = await gateway.nc.jetstream().add_stream(name="INBOX_PROOF", subjects=["shard.inboxproof.frame.>"])
    ack = await gateway.nc.jetstream().publish("shard.inboxproof.frame.x", b"{}")  # acknowledged on its inbox
    assert ack.stream == stream.config.name
    await gateway.nc.jetstream().delete_stream("INBOX_PROOF")
    await asyncio.sleep(NOT_DELIVERED_WAIT_S)
    assert shared_inbox.got == []
    assert await spy.refused_subscription(f"{own_inbox('gateway')}.>")
    assert gateway.errors == [] and module.errors == [] and ledger.errors == []


@pytest.mark.parametrize("user", USERS)
async def test_no_user_may_listen_on_the_shared_inbox(connect, user):
    """Every client hears its replies under its own prefix, so nobody needs ``_INBOX.>`` —
    and whoever had it could read the replies of any client on the libraries' default."""
    assert await (await connect(user)).refused_subscription("_INBOX.>")


# --- durability and the cluster --------------------------------------------------------------

def test_the_deployment_config_fsyncs_every_jetstream_write(secure_nats):
    with urllib.request.urlopen(f"{secure_nats.monitoring}/varz", timeout=5) as reply:
        assert json.load(reply)["jetstream"]["config"].get("sync_always") is True


@pytest.fixture(scope="module")
def secure_cluster(secure_nats: SecureNats) -> Iterator[embedded.NatsCluster]:
    """Three nodes started from deploy/nats/cluster-node.conf (which includes nats.conf),
    each in a directory of its own with copies of both files, on loopback: only the addresses
    (flags) and the store directory (rewritten in the copy) differ from compose's nodes."""
    state = Path(tempfile.mkdtemp(prefix="shardbus-secure-cluster-"))
    names = ["nats-1", "nats-2", "nats-3"]
    ports = {name: (embedded.free_port(), embedded.free_port(), embedded.free_port()) for name in names}
    routes = ",".join(f"nats-route://127.0.0.1:{route}" for _c, route, _h in ports.values())
    cluster = embedded.NatsCluster([], state)
    try:
        for name in names:
            node_dir = state / name
            node_dir.mkdir()
            (node_dir / "nats.conf").write_text(config_text(embedded.free_port()))
            node_config = NODE_CONFIG.read_text().replace("/data/jetstream", json.dumps(str(node_dir / "js"))[1:-1])
            (node_dir / "cluster-node.conf").write_text(node_config)
            client, route, http = ports[name]
            args = [embedded.nats_server_binary(), "-c", str(node_dir / "cluster-node.conf"),
                    "-a", "127.0.0.1", "-p", str(client), "-m", str(http),
                    "--cluster", f"nats://127.0.0.1:{route}", "--routes", routes,
                    "--ports_file_dir", str(node_dir / "ports")]
            with pytest.MonkeyPatch.context() as env:  # the node reads these at start, as compose gives them
                for user, password in secure_nats.passwords.items():
                    env.setenv(password_variable(user), password)
                env.setenv("NATS_SERVER_NAME", name)
                cluster.nodes.append(embedded._launch(args, node_dir, "nats-server.log", 20, name=name,
                                                      monitor_port=http))
        embedded.wait_for_meta_leader(cluster, 30)
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(state, ignore_errors=True)


async def test_every_cluster_node_has_the_same_users_and_rules(secure_cluster, secure_nats, connect):
    for node in secure_cluster.nodes:
        with urllib.request.urlopen(f"http://127.0.0.1:{node.monitor_port}/varz", timeout=5) as reply:  # noqa: ASYNC210  a local read, 5 s at most
            varz = json.load(reply)
        assert varz["server_name"] == node.name
        assert varz["jetstream"]["config"].get("sync_always") is True
        url = {name: f"nats://{name}:{secure_nats.passwords[name]}@127.0.0.1:{node.port}" for name in USERS}
        users = {name: await connect(name, url=url[name]) for name in USERS}  # each logs in on each node
        assert await users["website"].refused(subjects.frame("x", "y"))
        assert await users["website"].refused_subscription(f"{own_inbox('gateway')}.>")
        assert await users["module-events"].refused(subjects.ledger_expired("other"))
        with pytest.raises(Exception):  # noqa: B017  the error type is nats-py's choice; refused is the point
            await nats.connect(f"nats://website:wrong{secure_nats.passwords['website']}@127.0.0.1:{node.port}",
                               connect_timeout=3, allow_reconnect=False, max_reconnect_attempts=1, error_cb=_quiet)
    # JetStream is clustered: the gateway creates a stream on all three nodes.
    gateway = await connect("gateway", url=[f"nats://gateway:{secure_nats.passwords['gateway']}@127.0.0.1:{n.port}"
                                 for n in secure_cluster.nodes])
    js = gateway.nc.jetstream()
    info = await js.add_stream(name="R3_PROOF", subjects=["shard.r3proof.frame.>"], num_replicas=3)
    try:
        assert info.config.num_replicas == 3
        await publish_when_led(js, "shard.r3proof.frame.x", b"{}")
        info = await js.stream_info("R3_PROOF")
        assert info.state.messages == 1 and len(info.cluster.replicas or []) == 2
    finally:
        await js.delete_stream("R3_PROOF")
    assert gateway.errors == []


async def _quiet(_exc: Exception) -> None:
    """A refused login is expected; nats-py would print it."""


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
                ("installer", {"modules_dir": str(tmp_path / "modules")}),
                ("web", {"web_token": secrets.token_urlsafe(16), "web_port": "0"})):
            services.nats_url = secure_nats.url(name)
            services.start(name, **settings)
        website, operator, module = await connect("website"), await connect("operator"), await connect("module-events")

        # The shard plane: hello and frames reach the website live, replayed and on the board.
        frames = await listen(website, "shard.uoa.frame.>")
        sim = ShardSimulator("127.0.0.1", port, "uoa", own_tokens["uoa"])
        sims.append(sim)
        await sim.connect()
        await sim.send("guild.update", id=7, name="Knights")
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
        ref = spawned["body"]["serials"][0]
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
            "cleanup": 1, "gateway": 1, "installer": 1, "ledger": 1, "web": 1}
        web = (await operator.ask(subjects.health("web")))
        assert web["status"] == 200 and web["url"].startswith("http://127.0.0.1:"), web
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


# --- the website and JetStream (after the tests above: the services started here create the
# streams, whose subjects would overlap the test streams created above) ---------------------

WEBSITE_STREAMS = ("SHARD_FRAMES", "SHARD_DEADLETTER", "KV_BOARD_GUILDS", "KV_BOARD_MARKET",
                   "KV_BOARD_HOUSES", "KV_BOARD_CHAMPIONS", "KV_BOARD_NEWS")
"""The streams the website reads (frames, dead letters, the boards' buckets), and no other."""

BOARD_BUCKETS = ("BOARD_GUILDS", "BOARD_MARKET", "BOARD_HOUSES", "BOARD_CHAMPIONS", "BOARD_NEWS")

REFUSED_LINE = "refused a message not sent to this subject directly"
"""What a service logs when it drops a message JetStream (or a ``$`` reply) put on its subject."""


async def _push_consumer(user: User, stream: str, name: str, filter_subject: str, deliver_to: str,
                         group: str) -> dict[str, Any]:
    """Create a push consumer as ``user`` (the request nats.js would send), delivering to
    ``deliver_to`` in the queue group ``group``."""
    config = {"name": name, "deliver_subject": deliver_to, "deliver_group": group, "filter_subject": filter_subject,
              "ack_policy": "explicit", "deliver_policy": "all"}
    return await user.ask(f"$JS.API.CONSUMER.CREATE.{stream}.{name}", {"stream_name": stream, "config": config})


async def test_the_website_cannot_have_jetstream_deliver_its_news_as_ledger_or_cleanup_requests(
        secure_nats, connect, database_url, tmp_path):
    """The website writes a news item (shard.<s>.news.add: the gateway stores it in BOARD_NEWS)
    and creates a push consumer on KV_BOARD_NEWS delivering it to ledger.sweep.claim in the
    ledger's queue group, then to ledger.sweep.reverted, then to cleanup.sweep in cleanup's.
    nats-server does not check a consumer's deliver subject, so each arrives — with its stream
    subject and a $JS.ACK reply, which every service refuses: the confirmed row stays confirmed,
    nobody sweeps. Nor does a request whose reply is a $KV subject make the ledger write a
    board entry. The website's own kv.watch still works."""
    services = ServiceProcesses(tmp_path, "")
    try:
        for name, settings in (("gateway", {"shard_token": secrets.token_urlsafe(16), "shard_port": "0"}),
                               ("ledger", {"database_url": database_url}),
                               ("cleanup", {"sweep_period_s": "600", "reconcile_period_s": "600"})):
            services.nats_url = secure_nats.url(name)
            services.start(name, **settings)
        website = await connect("website")
        shard = f"f{secrets.token_hex(4)}"

        run_id = f"run{secrets.token_hex(6)}"
        changes = await listen(website, subjects.ledger_run_events(run_id))
        run = (await website.ask(subjects.LEDGER_RUN_CREATE,
                                 {"runId": run_id, "shard": shard, "event": "invasion"}))["run"]
        recorded = await website.ask(subjects.LEDGER_RESOURCE_RECORD, {
            "runId": run["runId"], "module": "events", "kind": "zone", "ref": "z1", "idempotencyKey": "rec-z1"})
        assert recorded["status"] == 200, recorded
        resource_id = recorded["resource"]["resourceId"]
        for status in ("running", "completed"):
            changed = await website.ask(subjects.LEDGER_RUN_STATUS, {"runId": run["runId"], "status": status})
            assert changed["status"] == 200
        for _ in range(100):  # the four changes' events (the relay sends them just after the replies)
            if len(changes.got) >= 4:
                break
            await asyncio.sleep(0.05)
        assert len(changes.got) == 4
        changes.got.clear()
        swept = await listen(website, subjects.CLEANUP_SWEPT)

        # The website's kv.watch (an ordered push consumer to its own inbox) works...
        news = await website.nc.jetstream().key_value("BOARD_NEWS")
        watcher = await news.watch(f"{shard}.>")
        assert await watcher.updates(timeout=5) is None  # nothing yet: the initial marker

        forgeries = (("claim", {"runId": run["runId"], "limit": 10}, subjects.LEDGER_SWEEP_CLAIM,
                      subjects.LEDGER_QUEUE),
                     ("reverted", {"resourceId": resource_id}, subjects.LEDGER_SWEEP_REVERTED, subjects.LEDGER_QUEUE),
                     ("sweep", {}, subjects.CLEANUP_SWEEP, "cleanup-workers"))
        consumers = []
        for news_id, body, deliver_to, group in forgeries:
            added = await website.ask(subjects.news_add(shard), {"id": news_id, "title": "hello", **body})
            assert added["status"] == 200, added
            entry = await watcher.updates(timeout=5)  # ...and sees each item
            assert entry is not None and entry.key == f"{shard}.{news_id}.item"
            name = f"forge{news_id}{secrets.token_hex(3)}"
            created = await _push_consumer(website, "KV_BOARD_NEWS", name, f"$KV.BOARD_NEWS.{shard}.{news_id}.item",
                                           deliver_to, group)
            assert "error" not in created, created  # the server lets it: the services must refuse
            consumers.append(name)
            await asyncio.sleep(1.0)  # delivered (and, unrefused, handled) before the next one
        await watcher.stop()

        # Not answered either: a request whose reply would make the ledger write a board entry.
        forged_key = f"{shard}.forged.item"
        await website.nc.publish(subjects.LEDGER_CONSOLE, json.dumps({"runId": run["runId"]}).encode(),
                                 reply=f"$KV.BOARD_NEWS.{forged_key}")
        await website.nc.flush(timeout=5)
        await asyncio.sleep(NOT_DELIVERED_WAIT_S)

        console = await website.ask(subjects.LEDGER_CONSOLE, {"runId": run["runId"]})
        assert {r["ref"]: r["status"] for r in console["resources"]} == {"z1": "confirmed"}, console
        assert changes.got == [] and swept.got == []
        with pytest.raises(Exception, match=r"[Kk]ey ?[Nn]ot ?[Ff]ound|not found"):
            await news.get(forged_key)
        for consumer in consumers:
            info = await website.nc.jetstream().consumer_info("KV_BOARD_NEWS", consumer)
            assert info.delivered.stream_seq > 0 and info.ack_floor.stream_seq == 0, consumer  # delivered, refused
            await website.nc.jetstream().delete_consumer("KV_BOARD_NEWS", consumer)
        logs = {handle.name: handle.log() for handle in services.started}
        assert REFUSED_LINE in logs["ledger"] and REFUSED_LINE in logs["cleanup"]
        assert website.errors == []
    finally:
        services.stop_all()


async def test_the_website_reads_its_streams_and_buckets_only(secure_nats, connect, tmp_path):
    """Its JetStream API reaches frames, dead letters and the five boards (stream info, watch,
    get, ordered replay) and nothing else: not the installer's lock bucket, not another stream."""
    services = ServiceProcesses(tmp_path, "")
    try:
        for name, settings in (("gateway", {"shard_token": secrets.token_urlsafe(16), "shard_port": "0"}),
                               ("installer", {"modules_dir": str(tmp_path / "modules")})):
            services.nats_url = secure_nats.url(name)
            services.start(name, **settings)
        website, gateway = await connect("website"), await connect("gateway")
        shard = f"r{secrets.token_hex(4)}"
        gjs, wjs = gateway.nc.jetstream(), website.nc.jetstream()

        # What it reads: every board (watch and get), frames and dead letters replayed.
        for bucket in BOARD_BUCKETS:
            await (await gjs.key_value(bucket)).put(f"{shard}.1.item", b'{"id":1}')
            kv = await wjs.key_value(bucket)
            assert (await kv.get(f"{shard}.1.item")).value == b'{"id":1}'
            watcher = await kv.watch(f"{shard}.>")
            entry = await watcher.updates(timeout=5)
            assert entry is not None and entry.key == f"{shard}.1.item", bucket
            await watcher.stop()
        await gjs.publish(subjects.frame(shard, "guild.update"), b'{"kind":"guild.update"}')
        await gjs.publish(subjects.deadletter(shard), b"not json")
        for subject, stream in ((f"shard.{shard}.frame.>", "SHARD_FRAMES"),
                                (subjects.deadletter(shard), "SHARD_DEADLETTER")):
            replay = await wjs.subscribe(subject, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL)
            assert (await replay.next_msg(timeout=5)).subject.startswith(f"shard.{shard}.")
            await replay.unsubscribe()
            assert (await wjs.stream_info(stream)).config.name == stream
        assert website.errors == []

        # What it does not: the installer's lock bucket, or a stream of nobody's boards.
        other = f"OTHER_{shard.upper()}"
        await gjs.add_stream(name=other, subjects=[f"other.{shard}.>"])
        try:
            refused = []
            for stream in ("KV_SHARDBUS_INSTALLER", other):
                for subject in (f"$JS.API.STREAM.INFO.{stream}", f"$JS.API.STREAM.MSG.GET.{stream}",
                                f"$JS.API.DIRECT.GET.{stream}",
                                f"$JS.API.DIRECT.GET.{stream}.$KV.SHARDBUS_INSTALLER.site",
                                f"$JS.API.CONSUMER.CREATE.{stream}", f"$JS.API.CONSUMER.CREATE.{stream}.peek",
                                f"$JS.API.CONSUMER.CREATE.{stream}.peek.other.{shard}.x",
                                f"$JS.API.CONSUMER.MSG.NEXT.{stream}.peek",
                                f"$JS.API.CONSUMER.INFO.{stream}.peek", f"$JS.API.CONSUMER.DELETE.{stream}.peek",
                                f"$JS.ACK.{stream}.peek.1.1.1.1.0", f"$JS.FC.{stream}.peek.x"):
                    refused.append((subject, await website.refused(subject)))
            assert [subject for subject, was in refused if not was] == []
        finally:
            await gjs.delete_stream(other)
    finally:
        services.stop_all()


async def test_the_gateways_own_subscriptions_refuse_what_the_website_cannot_send(secure_nats, connect, tmp_path):
    """The gateway's nats-py subscriptions (not FastStream's) refuse the same: a board read whose
    reply is a $KV subject (the gateway may write the boards, so its answer would be a board
    entry the website wrote), and frames JetStream delivers to shard.<s>.news.announce, which
    the website may not publish (the shard would get them as news)."""
    token, port = secrets.token_urlsafe(16), embedded.free_port()
    services = ServiceProcesses(tmp_path, secure_nats.url("gateway"))
    sim = None
    try:
        services.start("gateway", shard_token=token, shard_port=str(port))
        website = await connect("website")
        shard = f"g{secrets.token_hex(4)}"
        sim = ShardSimulator("127.0.0.1", port, shard, token)
        # Listening before the frame is sent: a core subscription made after it missed it whenever
        # the gateway was quicker than the test (seen once the gateway's publishing got faster).
        frames = await listen(website, f"shard.{shard}.frame.>")
        await sim.connect()
        await sim.send("guild.update", id=7, name="Knights")
        await frames.wait_for(2)  # the hello and the update

        await website.nc.publish(subjects.board(shard, "guilds"), b"{}", reply=f"$KV.BOARD_GUILDS.{shard}.forged.guild")
        name = f"announce{secrets.token_hex(3)}"
        config = {"name": name, "deliver_subject": subjects.news_announce(shard),
                  "filter_subject": f"shard.{shard}.frame.>", "ack_policy": "none", "deliver_policy": "all"}
        created = await website.ask(f"$JS.API.CONSUMER.CREATE.SHARD_FRAMES.{name}",
                                    {"stream_name": "SHARD_FRAMES", "config": config})
        assert "error" not in created, created
        await asyncio.sleep(1.0)
        await website.nc.jetstream().delete_consumer("SHARD_FRAMES", name)

        guilds = await website.nc.jetstream().key_value("BOARD_GUILDS")
        with pytest.raises(Exception, match=r"[Kk]ey ?[Nn]ot ?[Ff]ound|not found"):
            await guilds.get(f"{shard}.forged.guild")
        assert sim.news == []
    finally:
        if sim is not None:
            await sim.close()
        services.stop_all()


# --- the web door's own user (after the tests above: its feed sources their SHARD_FRAMES) -----

async def test_the_web_door_relays_reports_and_sweeps_and_builds_its_feed_but_forges_nothing(connect):
    web, gateway = await connect("web"), await connect("gateway")
    ledger, cleanup = await connect("ledger"), await connect("cleanup")
    gjs, wjs = gateway.nc.jetstream(), web.nc.jetstream()
    try:
        await gjs.stream_info("SHARD_FRAMES")
    except NotFoundError:  # this test alone: the gateway service has not made it
        await gjs.add_stream(name="SHARD_FRAMES", subjects=["shard.*.frame.>"])

    # What the door sends besides the website's list: a module's report, the operator's sweeps.
    reports, sweeps = await listen(ledger, "ledger.expired.*"), await listen(cleanup, "cleanup.sweep")
    await web.nc.publish(subjects.ledger_expired("events"), b"{}")
    await web.nc.publish(subjects.CLEANUP_SWEEP, b"{}")
    await reports.wait_for(1)
    await sweeps.wait_for(1)

    # Its feed: the stream WEB_FEED, sourcing SHARD_FRAMES and the ledger's LEDGER_EVENTS (which
    # the ledger creates), read through consumers of its own.
    from services.ledger.events.event_stream import declare_events_stream
    from services.web.feed.stream import FeedStream
    from services.web.settings import WebSettings

    await declare_events_stream(ledger.nc.jetstream())
    shard = f"w{secrets.token_hex(4)}"
    await wjs.add_stream(name="WEB_FEED", sources=[StreamSource(name="SHARD_FRAMES"),
                                                   StreamSource(name=subjects.LEDGER_EVENTS_STREAM)])
    try:
        await gjs.publish(subjects.frame(shard, "guild.update"), b'{"kind":"guild.update"}')
        await ledger.nc.publish(f"ledger.events.run.{shard}", b'{"runId":"x"}')
        for subject in (f"shard.{shard}.frame.>", f"ledger.events.run.{shard}"):
            feed = await wjs.subscribe(subject, stream="WEB_FEED", ordered_consumer=True,
                                       deliver_policy=DeliverPolicy.ALL)
            assert (await feed.next_msg(timeout=10)).subject.startswith(subject.rstrip(">"))
            await feed.unsubscribe()
        sources = {source.name for source in (await wjs.stream_info("WEB_FEED")).config.sources}
        assert sources == {"SHARD_FRAMES", subjects.LEDGER_EVENTS_STREAM}
        assert web.errors == []
        for subject in (subjects.health("web"), subjects.PING):  # it answers these
            assert not await web.refused_subscription(subject)

        # What it may not: forge a frame, a sweep transition or a board entry, touch another
        # stream or the installer's lock, delete or purge even its own feed, hear another inbox.
        refused = [subject for subject in (
            subjects.frame(shard, "x"), subjects.deadletter(shard), subjects.LEDGER_SWEEP_CLAIM,
            "$KV.BOARD_GUILDS.x.1.guild", "$JS.API.STREAM.CREATE.OTHER", "$JS.API.STREAM.UPDATE.SHARD_FRAMES",
            "$JS.API.STREAM.DELETE.WEB_FEED", "$JS.API.STREAM.PURGE.WEB_FEED",
            "$JS.API.STREAM.INFO.KV_SHARDBUS_INSTALLER", "$KV.SHARDBUS_INSTALLER.site")
            if not await web.refused(subject)]
        assert refused == []
        assert await web.refused_subscription(f"{own_inbox('website')}.>")
        assert await web.refused_subscription(subjects.LEDGER_SWEEP_CLAIM)

        # The door's own code declares it the same way: every JetStream request it makes is allowed.
        await gjs.delete_stream("WEB_FEED")
        web.errors.clear()  # the refusals just above
        feed_stream = FeedStream(web.nc, WebSettings(web_token="not-used-here"))
        await feed_stream.ensure()
        assert set(feed_stream.sources) - set(feed_stream.missing) >= {"SHARD_FRAMES", subjects.LEDGER_EVENTS_STREAM}
        assert web.errors == []
    finally:
        with contextlib.suppress(NotFoundError):
            await gjs.delete_stream("WEB_FEED")
