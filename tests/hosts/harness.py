"""Real processes on the hosts of ``net.py`` (docs/reliability.md, "Hosts"): three nats-server
nodes clustered over their host addresses (JetStream, ``sync_interval: always``, R3 streams), a
gateway (``shardbus run gateway``) on a host of its own listing all three, and a shard host
(``shard_host.py``). Every process is started through :class:`Processes`, which stops each by
its own handle; the test process reaches every host over the bridge."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import nats.js.errors
from nats.aio.client import Client

from shardbus.embedded import SYNC_ALWAYS, nats_server_binary, stop_process
from shared.health import health_file_is_fresh
from tests.hosts.net import Host

CLIENT_PORT, ROUTE_PORT, MONITOR_PORT, SHARD_PORT = 4222, 6222, 8222, 2593
"""Each host has an address of its own, so every node and gateway uses the same ports."""

TOKEN = "hosts-harness-token"


@dataclass
class Started:
    name: str
    host: Host
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class Processes:
    """Starts processes on hosts; :meth:`stop_all` stops every one by its handle, newest first."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.started: list[Started] = []

    def start(self, name: str, host: Host, argv: list[str], env: dict[str, str] | None = None) -> Started:
        log_path = self.workdir / f"{name}.log"
        with open(log_path, "ab") as log:
            proc = host.popen(argv, log, env=env)
        handle = Started(name, host, proc, log_path)
        self.started.append(handle)
        return handle

    def stop(self, handle: Started, timeout: float = 10.0) -> int:
        return stop_process(handle.proc, timeout=timeout)

    def stop_all(self) -> None:
        for handle in reversed(self.started):
            stop_process(handle.proc, timeout=10.0)


def http_json(url: str, timeout: float = 2.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        return json.load(reply)


@dataclass
class Node:
    name: str
    host: Host
    started: Started

    @property
    def url(self) -> str:
        return f"nats://{self.host.address}:{CLIENT_PORT}"

    def monitor(self, path: str) -> Any:
        return http_json(f"http://{self.host.address}:{MONITOR_PORT}/{path}")


def start_cluster(processes: Processes, hosts: list[Host], workdir: Path, timeout: float = 60.0) -> list[Node]:
    """nats-1..N on ``hosts``, full-mesh routes over the host addresses; returns once every node
    names the same JetStream meta leader."""
    routes = ", ".join(f"nats-route://{h.address}:{ROUTE_PORT}" for h in hosts)
    nodes: list[Node] = []
    for index, host in enumerate(hosts, 1):
        name = f"nats-{index}"
        store = workdir / name / "jetstream"
        store.mkdir(parents=True, exist_ok=True)
        config = workdir / name / "nats.conf"
        config.write_text(
            f"server_name: {name}\n"
            f"listen: {host.address}:{CLIENT_PORT}\n"
            f"http: {host.address}:{MONITOR_PORT}\n"
            f"jetstream {{ store_dir: {json.dumps(str(store))}, {SYNC_ALWAYS} }}\n"
            f"cluster {{ name: hosts, listen: {host.address}:{ROUTE_PORT}, routes: [{routes}] }}\n")
        nodes.append(Node(name, host, processes.start(name, host, [nats_server_binary(), "-c", str(config)])))
    deadline = time.monotonic() + timeout
    while True:
        leaders = set()
        for node in nodes:
            if node.started.proc.poll() is not None:
                raise RuntimeError(f"{node.name} exited:\n{node.started.log()[-2000:]}")
            try:
                leaders.add((node.monitor("jsz").get("meta_cluster") or {}).get("leader", ""))
            except OSError:
                leaders.add("")
        if len(leaders) == 1 and "" not in leaders:
            return nodes
        if time.monotonic() > deadline:
            raise TimeoutError(f"no JetStream meta leader all nodes agree on within {timeout} s: {leaders}")
        time.sleep(0.2)


def start_gateway(processes: Processes, host: Host, nodes: list[Node], workdir: Path,
                  timeout: float = 60.0, **settings: str) -> Started:
    """``shardbus run gateway`` on ``host``, listing every node; returns once healthy."""
    health = workdir / f"gateway-{host.name}.health"
    env = {**os.environ, "SHARDBUS_NATS_URL": ",".join(n.url for n in nodes), "SHARDBUS_HEALTH_FILE": str(health),
           "SHARDBUS_SHARD_TOKEN": TOKEN, "SHARDBUS_SHARD_HOST": host.address, "SHARDBUS_SHARD_PORT": str(SHARD_PORT),
           "SHARDBUS_JETSTREAM_REPLICAS": "3", "SHARDBUS_RECONNECT_WAIT_S": "0.2",
           "SHARDBUS_RECONNECT_WAIT_MAX_S": "1", "SHARDBUS_METRICS_PORT": "0"}
    env.update({f"SHARDBUS_{k.upper()}": v for k, v in settings.items()})
    started = processes.start(f"gateway-{host.name}", host, [sys.executable, "-m", "shardbus", "run", "gateway"], env)
    deadline = time.monotonic() + timeout
    while not health_file_is_fresh(str(health)):
        if started.proc.poll() is not None:
            raise RuntimeError(f"the gateway exited with {started.proc.returncode}:\n{started.log()[-3000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the gateway was not healthy within {timeout} s:\n{started.log()[-3000:]}")
        time.sleep(0.1)
    return started


async def connect(nodes: list[Node]) -> Client:
    """The test's own connection (from the bridge's address), to every node."""
    return await nats.connect([n.url for n in nodes], name="hosts-test", max_reconnect_attempts=-1,
                              reconnect_time_wait=0.2, ping_interval=2, max_outstanding_pings=2)


async def stream_info(nc: Client, stream: str, timeout: float = 2.0) -> dict[str, Any]:
    """``$JS.API.STREAM.INFO`` as JSON (answered by the stream's leader)."""
    msg = await nc.request(f"$JS.API.STREAM.INFO.{stream}", b"", timeout=timeout)
    answer: dict[str, Any] = json.loads(msg.data)
    return answer


def connected_node(nodes: list[Node], name_part: str) -> Node | None:
    """The node holding a client connection whose name contains ``name_part`` (its ``/connz``)."""
    for node in nodes:
        try:
            connections = node.monitor("connz").get("connections") or []
        except OSError:
            continue
        if any(name_part in (c.get("name") or "") for c in connections):
            return node
    return None


async def read_through_leader(nc: Client, stream: str, timeout: float = 120.0) -> list[tuple[str, bytes]]:
    """Every message of ``stream`` as (subject, data), in stream order, each asked of the stream's
    leader (``$JS.API.STREAM.MSG.GET``): a consumer may be placed on a replica still behind after
    a heal, and would show a short history (docs/reliability.md, "Hosts")."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            info = await stream_info(nc, stream)
            if "error" not in info:
                break
        except TimeoutError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{stream} answered no stream info within {timeout} s")
        await asyncio.sleep(0.5)
    state = info.get("state") or {}
    first, last = int(state.get("first_seq") or 1), int(state.get("last_seq") or 0)

    async def one(seq: int) -> tuple[str, bytes] | None:
        while True:
            try:
                msg = await nc.request(f"$JS.API.STREAM.MSG.GET.{stream}", json.dumps({"seq": seq}).encode(),
                                       timeout=5)
                answer = json.loads(msg.data)
                if "message" in answer:
                    got = answer["message"]
                    return got["subject"], base64.b64decode(got.get("data") or "")
                if (answer.get("error") or {}).get("code") == 404:
                    return None  # deleted (none are, in these streams)
            except TimeoutError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{stream} seq {seq} not read within {timeout} s")
            await asyncio.sleep(0.2)

    found: list[tuple[str, bytes]] = []
    for start in range(first, last + 1, 100):
        batch = await asyncio.gather(*(one(seq) for seq in range(start, min(last, start + 99) + 1)))
        found.extend(m for m in batch if m is not None)
    return found
