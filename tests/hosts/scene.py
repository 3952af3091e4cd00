"""One hosts scenario from start to verdict (docs/reliability.md, "Hosts"), shared by every
scenario file: the hosts, the cluster, the gateway, the shard host, the web door and the website
host commanding the shards through NATS and through the door; a nemesis acting on them
once frames flow; the shards' drain, the streams read through their leader, and the checker.

A scenario given a :class:`~tests.hosts.nemesis.Schedule` (the seeded ones of
``test_nemesis.py``) has it printed, and written beside the run's logs, with the seed that
replays it; on a failure the seed and every step taken are printed with the failure."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nats.aio.client import Client

from shared import subjects
from tests.hosts import harness
from tests.hosts.checker import CALM_COMMANDS, check, check_commands
from tests.hosts.door import Door, start_door
from tests.hosts.net import Host, Hosts
from tests.hosts.shard_host import KIND as TICK
from tests.hosts.website_host import DOOR_TOKEN_VARIABLE

if TYPE_CHECKING:
    from tests.hosts.nemesis import Schedule

SHARDS, RATE, SECONDS = 3, 50.0, 30.0
"""Three shards at 50 frames/s each for 30 s: 4,500 frames, a partition in the middle."""

SHARD_NAMES = [f"h{i}" for i in range(SHARDS)]
"""The shard host's shards (its default ``--prefix`` ``h``), shard ``i`` dialling gateway ``i`` mod
the number of gateways first."""

CUT_HELD_S = 10.0
"""How long the partition is held once the majority has elected a new leader."""


def progress(path: Path) -> dict[str, dict[str, int]]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def flowing(now: dict[str, dict[str, int]]) -> bool:
    """Every shard has had frames acknowledged (the stream takes them before the cut)."""
    return len(now) == SHARDS and all(v["acked"] >= 100 for v in now.values())


def done(now: dict[str, dict[str, int]]) -> bool:
    """Every shard's drain is over (the shard host's progress)."""
    return len(now) == SHARDS and all(shard.get("done") for shard in now.values())


def acked(path: Path) -> int:
    """Acknowledgements received so far, every shard together."""
    return sum(v["acked"] for v in progress(path).values())


async def wait_for(what: str, condition: Callable[[], object], timeout: float, every: float = 0.2) -> None:
    """Make the scenario's precondition happen: poll until ``condition()`` (sync or async) holds,
    every ``every`` seconds; a TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout} s: {what}")
        await asyncio.sleep(every)


async def leader(nc: Client, stream: str = subjects.FRAMES_STREAM) -> str:
    try:
        return str((await harness.stream_info(nc, stream)).get("cluster", {}).get("leader", ""))
    except Exception:
        return ""


async def put_leader_on(nc: Client, node: harness.Node, stream: str) -> None:
    """Step the stream's leader down, preferring ``node``, until ``node`` leads it."""
    for _ in range(30):
        current = await leader(nc, stream)
        if current == node.name:
            return
        if current:
            try:
                await nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}",
                                 json.dumps({"placement": {"preferred": node.name}}).encode(), timeout=5)
            except Exception:
                pass
        await asyncio.sleep(1.0)
    raise TimeoutError(f"{node.name} never became the leader of {stream}")


def seqs_by_shard(messages: list[tuple[str, bytes]], kind: str) -> dict[str, list[int]]:
    """Each shard's ``seq`` numbers in stream order, from its ``shard.<shard>.<kind>`` messages
    (-1 for a message without one): the shard host's frames (``frame.hosts.tick``; its hellos and
    its answers to commands, frames too, left out) or its dead letters (``deadletter``)."""
    found: dict[str, list[int]] = {}
    for subject, data in messages:
        parts = subject.split(".", 2)
        if len(parts) < 3 or parts[0] != "shard" or parts[2] != kind:
            continue
        try:
            seq = int(json.loads(data).get("seq", -1))
        except (ValueError, AttributeError, TypeError):
            seq = -1
        found.setdefault(parts[1], []).append(seq)
    return found


class Wiring:
    """How the gateway and the shards reach what they talk to. This one: directly (the gateway
    lists every node's own address, the shards dial the gateway's); ``proxy.py`` puts proxies
    in between."""

    def start(self, hosts: Hosts, nodes: list[harness.Node], gw_host: Host) -> None:
        """Called once the cluster is up, before the gateway starts."""

    def gateway_urls(self, nodes: list[harness.Node]) -> list[str]:
        return [n.url for n in nodes]

    def shard_target(self, gw_host: Host) -> str:
        return f"{gw_host.address}:{harness.SHARD_PORT}"

    def stop(self) -> None:
        """Called once every process is stopped."""

    def notes(self) -> dict[str, object]:
        return {}


@dataclass
class Scene:
    """What a nemesis acts on: the hosts, the nodes, the gateway and the node it publishes to."""

    hosts: Hosts
    nodes: list[harness.Node]
    gw_host: Host
    gw_node: harness.Node
    nc: Client
    progress: Path
    notes: dict[str, object]
    processes: harness.Processes | None = None
    gateway: harness.Started | None = None
    schedule: Schedule | None = None
    wiring: Wiring = field(default_factory=Wiring)
    gw_hosts: list[Host] = field(default_factory=list)
    """Every gateway's host, ``gw_host`` first (more than one with ``run_scenario(gateways=2)``)."""

    def node(self, name: str) -> harness.Node:
        return next(n for n in self.nodes if n.name == name)


Nemesis = Callable[[Scene], Awaitable[None]]

GATEWAY_STARTS = 25
"""Starts of the gateway at most until nats-py's shuffle of the listed nodes connects it to the
one the seed chose (a third of starts do): (2/3)^25, about 4 in 100,000, misses them all."""


async def start_gateway_on(processes: harness.Processes, gw_host: Host, nodes: list[harness.Node], workdir: Path,
                           wanted: str | None, notes: dict[str, object],
                           settings: dict[str, str]) -> tuple[harness.Started, harness.Node]:
    """The gateway, started (and stopped by its handle, and started again) until it is connected
    to the node named ``wanted``, so that a seed replays where it publishes; any node when None.
    Made to happen, not hoped for: a scenario fails here only when every start missed it."""
    seen: list[str] = []
    for _ in range(GATEWAY_STARTS):
        gateway = harness.start_gateway(processes, gw_host, nodes, workdir, **settings)
        await wait_for("the gateway connected to a node",
                       lambda: harness.connected_node(nodes, "shardbus-gateway") is not None, 30)
        node = harness.connected_node(nodes, "shardbus-gateway")
        assert node is not None
        seen.append(node.name)
        if wanted is None or node.name == wanted:
            notes["gateway starts until placed"] = len(seen)
            return gateway, node
        processes.stop(gateway)
        await wait_for("the stopped gateway's connection gone",
                       lambda: harness.connected_node(nodes, "shardbus-gateway") is None, 30)
    raise TimeoutError(f"the gateway never connected to {wanted} in {GATEWAY_STARTS} starts: {seen}")


SILENCE_S = 3.0
"""With two gateways: how long a shard hears nothing (no ping, no ack) before it drops the link and
dials the other (docs/gateway.md, "What a shard may rely on": "a few" pings, 1 s apart here)."""

COMMAND_TIMEOUT_S = 2.0
"""The gateway's ``SHARDBUS_COMMAND_TIMEOUT_S`` here: a command the shard does not answer in time
gets the 504."""

COMMAND_EVERY_S, COMMAND_WAIT_S, CALM_WAIT_S = 0.1, 4.0, 60.0
"""The website host's pace (a shard's next command 0.1 s after the last one's outcome), how long it
awaits a reply (above ``COMMAND_TIMEOUT_S``, so the gateway's 504 arrives first), and how long it
may take, once the shards are done, until each shard's last commands are answered 200 (the
checker's calm ones; longer is a command stuck)."""


def start_website(processes: harness.Processes, host: Host, nodes: list[harness.Node],
                  workdir: Path, door: Door) -> tuple[harness.Started, Path]:
    """The website host (``website_host.py``) on ``host``, commanding every shard through every
    node and through the web door; its outcomes go to the returned file, line by line."""
    out = workdir / "commands.jsonl"
    handle = processes.start("website", host, [
        sys.executable, "-m", "tests.hosts.website_host", "--nats", ",".join(n.url for n in nodes),
        "--shards", ",".join(SHARD_NAMES), "--every", str(COMMAND_EVERY_S),
        "--timeout", str(COMMAND_WAIT_S), "--door", door.url, "--door-ca", str(door.ca), "--out", str(out)],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), DOOR_TOKEN_VARIABLE: door.token})
    return handle, out


def calm(outcomes: list[dict[str, Any]], since: float) -> bool:
    """Each shard's last ``CALM_COMMANDS`` commands, through NATS and through the door, were sent
    after ``since`` (the machine's monotonic clock) and answered 200."""
    for shard in SHARD_NAMES:
        for via in ("nats", "door"):
            last = [o for o in outcomes if o.get("shard") == shard and o.get("via", "nats") == via][-CALM_COMMANDS:]
            if len(last) < CALM_COMMANDS or not all(o.get("status") == 200 and o.get("at", 0) >= since
                                                    for o in last):
                return False
    return True


def read_outcomes(path: Path) -> list[dict[str, Any]]:
    """The website host's outcomes, in the order they were written."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def run_scenario(tmp_path: Path, name: str, nemesis: Nemesis, *, schedule: Schedule | None = None,
                       leader_on: str | None = None, gateway_on: str | None = None,
                       wiring: Wiring | None = None, gateways: int = 1, **gateway_settings: str) -> None:
    """Hosts, cluster, gateway, shards streaming; ``nemesis`` once frames flow; then the shards'
    drain, the streams read and the checker. The frames stream is led by the gateway's node, or
    by the node named ``leader_on``; the gateway connected to the node named ``gateway_on`` (else
    wherever nats-py's shuffle of the listed nodes puts it). With ``gateways=2`` a second gateway
    runs on a host of its own, shard ``i`` dials gateway ``i`` mod 2 first, and a shard that hears
    nothing for ``SILENCE_S`` moves to the other (both ping every second). With ``schedule``, its
    seed and steps are printed and kept, and shown with any failure."""
    started_at = time.monotonic()
    processes = harness.Processes(tmp_path)
    notes: dict[str, object] = {}
    wiring = wiring or Wiring()
    if schedule is not None:
        print(f"\n{schedule.header()}")
    kept: Path | None = None
    try:
        with Hosts(tmp_path) as hosts:
            try:
                nats_hosts = [hosts.add(f"nats{i}") for i in (1, 2, 3)]
                gw_host, shard_host, web_host = hosts.add("gw"), hosts.add("shards"), hosts.add("website")
                door_host = hosts.add("door")
                gw_hosts = [gw_host, *(hosts.add(f"gw{k + 1}") for k in range(1, gateways))]
                if gateways > 1:
                    gateway_settings = {"ping_every_s": "1", **gateway_settings}
                nodes = harness.start_cluster(processes, nats_hosts, tmp_path)
                # Precondition of the gateway's start (it creates its streams and buckets, R3, and
                # exits when JetStream refuses): the meta group settled, seen twice 1 s apart.
                # Once, nodes that had just agreed on a meta leader lost it 2 s later and the
                # gateway exited on "no suitable peers for placement, peer offline" (seed 65440).
                for _ in range(2):
                    await wait_for("every node names one meta leader, whose peers are all current",
                                   lambda: meta_settled(nodes), 60)
                    await asyncio.sleep(1.0)
                wiring.start(hosts, nodes, gw_host)
                settings = {"log_level": "DEBUG", "nats_url": ",".join(wiring.gateway_urls(nodes)),
                            "command_timeout_s": str(COMMAND_TIMEOUT_S), **gateway_settings}
                gateway, gw_node = await start_gateway_on(processes, gw_host, nodes, tmp_path, gateway_on, notes,
                                                          settings)
                for other in gw_hosts[1:]:
                    harness.start_gateway(processes, other, nodes, tmp_path, **settings)
                nc = await harness.connect(nodes)
                try:
                    # Precondition: the frames stream is led where the scenario wants it (by default
                    # the node the gateway publishes to).
                    await wait_for("the frames stream has a leader", lambda: leader(nc), 30)
                    wanted = gw_node if leader_on is None else next(n for n in nodes if n.name == leader_on)
                    await put_leader_on(nc, wanted, subjects.FRAMES_STREAM)
                    notes["gateway on"], notes["leader on"] = gw_node.name, wanted.name

                    out, prog, linger = tmp_path / "history.json", tmp_path / "progress.json", tmp_path / "linger.done"
                    shards = processes.start("shards", shard_host, [
                        sys.executable, "-m", "tests.hosts.shard_host",
                        "--gateway", ",".join(wiring.shard_target(h) for h in gw_hosts),
                        "--silence-seconds", str(SILENCE_S if gateways > 1 else 0),
                        "--token", harness.TOKEN, "--shards", str(SHARDS), "--rate", str(RATE),
                        "--seconds", str(SECONDS), "--out", str(out), "--progress", str(prog),
                        "--linger-until", str(linger)],
                        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
                    await wait_for("frames acknowledged on every shard", lambda: flowing(progress(prog)), 60)
                    door = start_door(processes, door_host, nodes, tmp_path)
                    website, commands_out = start_website(processes, web_host, nodes, tmp_path, door)

                    if schedule is not None:
                        schedule.begin()
                    await nemesis(Scene(hosts, nodes, gw_host, gw_node, nc, prog, notes, processes, gateway,
                                        schedule, wiring, gw_hosts))

                    await wait_for("every shard drained (every frame acknowledged, or its drain ran out)",
                                   lambda: done(progress(prog)) or shards.proc.poll() is not None, SECONDS + 180)
                    # Commands once healed and drained, the shards still there: the checker's calm ones,
                    # waited for (a route that was cut resends on TCP's backed-off timer: seconds; seen
                    # 4 in a row time out after a heal, seed 558168's pause).
                    drained_at = time.monotonic()
                    try:
                        await wait_for(f"each shard's last {CALM_COMMANDS} commands answered 200",
                                       lambda: calm(read_outcomes(commands_out), drained_at), CALM_WAIT_S)
                        notes["commands answered 200 again after the drain (s)"] = round(
                            time.monotonic() - drained_at, 1)
                    except TimeoutError:
                        pass  # the checker names what was not answered
                    processes.stop(website)
                    linger.touch()
                    await wait_for("the shard host finished", lambda: shards.proc.poll() is not None, 30)
                    history = json.loads(out.read_text())["shards"]
                    if gateways > 1:
                        notes["shards moved"] = {shard: h["moves"] for shard, h in history.items() if h.get("moves")}
                    # Read through the stream's leader, message by message: a consumer may be placed on
                    # the node that was cut off, which can stay behind long after the heal (seen: 318
                    # of 4,503 messages 60 s later; docs/reliability.md, "Hosts").
                    healed_at = time.monotonic()
                    frames = await read_settled(nc, nodes, subjects.FRAMES_STREAM, notes)
                    letters = await read_settled(nc, nodes, subjects.DEADLETTER_STREAM, notes)
                    stored = seqs_by_shard(frames, f"frame.{TICK}")
                    dead = seqs_by_shard(letters, "deadletter")
                    # What the checker was given, kept with the run: a violation's evidence.
                    (tmp_path / "stored.json").write_text(json.dumps({"frames": stored, "deadletters": dead}))
                    verdict = check(history, stored, dead)
                    check_commands(verdict, read_outcomes(commands_out), sorted(history))
                    notes["stream per node at the read"] = stream_per_node(nodes)
                    try:
                        await wait_for("every node holds the whole frames stream", lambda: caught_up(nodes), 30)
                        notes["every replica caught up within (s)"] = round(time.monotonic() - healed_at, 1)
                    except TimeoutError:
                        notes["a replica still behind 30 s after the read"] = stream_per_node(nodes)
                finally:
                    await nc.close()
            finally:
                processes.stop_all()
                wiring.stop()
                kept = harness.keep(tmp_path, name)
                if schedule is not None:
                    schedule.write(kept)
    except BaseException:
        if schedule is not None:
            print(f"\nhosts, {name}: FAILED\n{schedule.describe()}", file=sys.stderr)
        raise
    elapsed = time.monotonic() - started_at
    log = gateway.log()
    # A replica stuck catching up logs this every 3-4 s (NATS's raft; docs/reliability.md, "Hosts").
    stuck = sum(node.started.log().count("Expected first catchup entry to be a snapshot") for node in nodes)
    if stuck:
        notes["raft catch-up retries logged"] = stuck
    notes.update(wiring.notes())
    shown = "".join(f"; {key} {value}" for key, value in notes.items())
    line = (f"hosts, {name}: {verdict.summary()}; {verdict.resent_deduplicated} acks repeated; "
            f"resends answered 409 in process: {log.count('duplicate message id is in process')}{shown}; "
            f"{elapsed:.0f} s")
    if schedule is not None:
        line += f"; seed {schedule.seed}"
    print(f"\n{line}")
    assert kept is not None
    (kept / "summary.txt").write_text(line + "\n" + "\n".join(verdict.violations) + "\n")
    assert hosts.leftovers() == []
    failure = "\n".join(verdict.violations)
    if schedule is not None and (verdict.violations or verdict.sent < SHARDS * RATE * SECONDS * 0.9):
        print(f"\nhosts, {name}: FAILED\n{schedule.describe()}", file=sys.stderr)
        failure += f"\n{schedule.describe()}"
    assert not verdict.violations, failure
    assert verdict.sent >= SHARDS * RATE * SECONDS * 0.9, failure


def meta_settled(nodes: list[harness.Node]) -> bool:
    """Every node names the same JetStream meta leader, and the leader reports every other node
    as a current peer (its ``/jsz``)."""
    try:
        metas = [node.monitor("jsz").get("meta_cluster") or {} for node in nodes]
    except (OSError, ValueError):
        return False
    leaders = {meta.get("leader") or "" for meta in metas}
    if len(leaders) != 1 or "" in leaders:
        return False
    (name,) = leaders
    led = next((meta for node, meta in zip(nodes, metas, strict=True) if node.name == name), None)
    peers = (led or {}).get("replicas") or []
    return len(peers) == len(nodes) - 1 and all(peer.get("current") for peer in peers)


async def read_settled(nc: Client, nodes: list[harness.Node], stream: str, notes: dict[str, object],
                       timeout: float = 120.0) -> list[tuple[str, bytes]]:
    """``stream`` read through its leader, read again until the read holds at least as many
    messages as a majority of the nodes report holding (their ``/jsz``; nothing is deleted from
    these streams). A node still catching up after a heal has answered the leader's requests
    with its own short history (seen: 543 of 4,503 messages, a kill during a partition, seed
    314134; docs/reliability.md, "Hosts"): each such read is noted, never taken as the stream."""
    deadline = time.monotonic() + timeout
    while True:
        messages = await harness.read_through_leader(nc, stream, timeout=max(1.0, deadline - time.monotonic()))
        counts = sorted(view["messages"] or 0 for view in stream_per_node(nodes, stream).values()
                        if isinstance(view, dict))
        majority = counts[len(counts) - (len(nodes) // 2 + 1)] if len(counts) > len(nodes) // 2 else 0
        if len(messages) >= majority:
            return messages
        short = notes.setdefault(f"short reads of {stream} (read < what a majority holds)", [])
        assert isinstance(short, list)
        short.append(f"{len(messages)} < {majority} (nodes: {counts})")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{stream}: every read within {timeout} s was shorter than a majority holds: {short}")
        await asyncio.sleep(1.0)


def stream_per_node(nodes: list[harness.Node], name: str = subjects.FRAMES_STREAM) -> dict[str, object]:
    """Each node's own view of stream ``name`` (its monitoring ``/jsz``): messages, last
    sequence, the leader it knows."""
    seen: dict[str, object] = {}
    for node in nodes:
        try:
            accounts = node.monitor("jsz?streams=true").get("account_details") or []
            for stream in (st for a in accounts for st in a.get("stream_detail") or []):
                if stream.get("name") == name:
                    state = stream.get("state") or {}
                    seen[node.name] = {"messages": state.get("messages"), "last_seq": state.get("last_seq"),
                                       "leader": (stream.get("cluster") or {}).get("leader")}
        except OSError as exc:
            seen[node.name] = repr(exc)
    return seen


def caught_up(nodes: list[harness.Node]) -> bool:
    """Every node reports the frames stream with the same messages and last sequence, and the
    same leader."""
    seen = stream_per_node(nodes)
    views = {json.dumps(view, sort_keys=True) for view in seen.values()}
    return len(seen) == len(nodes) and len(views) == 1 and all(isinstance(v, dict) for v in seen.values())


async def other_leader(nc: Client, old: str) -> bool:
    now = await leader(nc)
    return bool(now) and now != old
