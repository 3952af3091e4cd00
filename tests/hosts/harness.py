"""Real processes on the hosts of ``net.py`` (docs/reliability.md, "Hosts"): three nats-server
nodes clustered over their host addresses (JetStream, ``sync_interval: always``, R3 streams), a
gateway (``shardbus run gateway``) on a host of its own listing all three, and a shard host
(``shard_host.py``). Every process is started through :class:`Processes`, which stops each by
its own handle; the test process reaches every host over the bridge.

Given a :class:`Security`, the nodes run the shipped configuration instead (deploy/nats: the
users and passwords of nats.conf, and with certificates TLS on client connections and verified
TLS on the routes, as cluster-node-tls.conf; docs/security.md, "TLS"), and the gateway logs in
as its user, over TLS, with a TLS shard listener."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import nats.js.errors
import trustme
from nats.aio.client import Client

from shardbus.embedded import SYNC_ALWAYS, nats_server_binary, stop_process
from shared.health import health_file_is_fresh
from tests.hosts.net import Host

CLIENT_PORT, ROUTE_PORT, MONITOR_PORT, SHARD_PORT = 4222, 6222, 8222, 2593
"""Each host has an address of its own, so every node and gateway uses the same ports."""

TOKEN = "hosts-harness-token"

REPO = Path(__file__).resolve().parents[2]
DEPLOY_NATS = REPO / "deploy" / "nats"
NATS_USERS = ("gateway", "ledger", "cleanup", "installer", "web", "website", "operator", "module-events")
"""Every user of deploy/nats/nats.conf: the server refuses to start without each one's password."""


@dataclass
class Certificates:
    """trustme certificates as files (docs/security.md, "TLS"): the CA; the nodes' certificate,
    naming every node's address, for their client port and their routes (it serves and dials);
    the gateway's shard listener's, naming the gateway's address."""

    ca: Path
    node_cert: Path
    node_key: Path
    listener_cert: Path
    listener_key: Path

    @classmethod
    def issue(cls, folder: Path, nodes: list[Host], gateway: Host) -> Certificates:
        folder.mkdir(parents=True, exist_ok=True)
        ca = trustme.CA()
        ca.cert_pem.write_to_path(str(folder / "ca.pem"))
        written = []
        for name, leaf in (("node", ca.issue_cert(*(h.address for h in nodes))),
                           ("listener", ca.issue_cert(gateway.address))):
            cert, key = folder / f"{name}.pem", folder / f"{name}.key"
            cert.write_bytes(b"".join(pem.bytes() for pem in leaf.cert_chain_pems))
            key.write_bytes(leaf.private_key_pem.bytes())
            written += [cert, key]
        return cls(folder / "ca.pem", *written)


@dataclass
class Security:
    """The nodes' users and passwords (deploy/nats/nats.conf) and, with ``certificates``, TLS."""

    passwords: dict[str, str]
    certificates: Certificates | None = None

    @classmethod
    def new(cls, certificates: Certificates | None = None) -> Security:
        """A fresh password for every user (hex: safe inside a NATS URL)."""
        return cls({user: secrets.token_hex(12) for user in NATS_USERS}, certificates)

    def environment(self) -> dict[str, str]:
        """The variables nats.conf reads the passwords from (as compose gives them)."""
        return {f"{user.upper().replace('-', '_')}_NATS_PASSWORD": pw for user, pw in self.passwords.items()}


def deploy_config(folder: Path, security: Security, store: Path) -> Path:
    """deploy/nats copied to ``folder``, only what no flag sets rewritten: the certificates' paths
    (/etc/nats/tls/) and the JetStream store. Returns the node's file: cluster-node-tls.conf with
    certificates, else cluster-node.conf (the same users, no TLS). Listen addresses and routes are
    given as flags (:func:`start_cluster`), which win over the file's."""
    folder.mkdir(parents=True, exist_ok=True)
    certs = security.certificates
    files = {} if certs is None else {"server.pem": certs.node_cert, "server.key": certs.node_key,
                                      "ca.pem": certs.ca, "route.pem": certs.node_cert, "route.key": certs.node_key}
    for name in ("nats.conf", "nats-tls.conf", "cluster-node.conf", "cluster-node-tls.conf"):
        text = (DEPLOY_NATS / name).read_text()
        for file, path in files.items():
            text = text.replace(f"/etc/nats/tls/{file}", str(path))
        if "store_dir: /data/jetstream" in text:
            text = text.replace("store_dir: /data/jetstream", f"store_dir: {json.dumps(str(store))}")
        (folder / name).write_text(text)
    if certs is not None and any("/etc/nats/tls/" in line.split("#")[0]
                                 for n in ("nats-tls.conf", "cluster-node-tls.conf")
                                 for line in (folder / n).read_text().splitlines()):
        raise ValueError("deploy/nats names a certificate file the hosts harness does not rewrite")
    return folder / ("cluster-node-tls.conf" if certs is not None else "cluster-node.conf")


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


def start_cluster(processes: Processes, hosts: list[Host], workdir: Path, timeout: float = 60.0,
                  security: Security | None = None) -> list[Node]:
    """nats-1..N on ``hosts``, full-mesh routes over the host addresses; returns once every node
    names the same JetStream meta leader. With ``security``: deploy/nats's configuration
    (:func:`deploy_config`) on every node."""
    routes = ", ".join(f"nats-route://{h.address}:{ROUTE_PORT}" for h in hosts)
    nodes: list[Node] = []
    for index, host in enumerate(hosts, 1):
        name = f"nats-{index}"
        store = workdir / name / "jetstream"
        store.mkdir(parents=True, exist_ok=True)
        if security is not None:
            config = deploy_config(workdir / name / "deploy", security, store)
            # -a moves the client and monitoring ports to the host's address (nats.conf); the
            # cluster flags replace the file's listen and routes, keeping its tls block.
            argv = [nats_server_binary(), "-c", str(config), "-a", host.address,
                    "--cluster", f"nats://{host.address}:{ROUTE_PORT}", "--routes", routes.replace(" ", "")]
            env = {**os.environ, "NATS_SERVER_NAME": name, **security.environment()}
            nodes.append(Node(name, host, processes.start(name, host, argv, env)))
            continue
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
                  timeout: float = 60.0, security: Security | None = None, **settings: str) -> Started:
    """``shardbus run gateway`` on ``host``, listing every node; returns once healthy. With
    ``security``: as the user ``gateway`` and, with certificates, over TLS to the nodes
    (SHARDBUS_NATS_TLS_CA) and with a TLS shard listener (SHARDBUS_SHARD_TLS_CERT, _KEY)."""
    health = workdir / f"gateway-{host.name}.health"
    urls = [n.url for n in nodes]
    if security is not None:
        login = f"gateway:{security.passwords['gateway']}@"
        urls = [url.replace("nats://", f"nats://{login}") for url in urls]
        if security.certificates is not None:
            certs = security.certificates
            settings = {"nats_tls_ca": str(certs.ca), "shard_tls_cert": str(certs.listener_cert),
                        "shard_tls_key": str(certs.listener_key), **settings}
    env = {**os.environ, "SHARDBUS_NATS_URL": ",".join(urls), "SHARDBUS_HEALTH_FILE": str(health),
           "SHARDBUS_SHARD_TOKEN": TOKEN, "SHARDBUS_SHARD_HOST": host.address, "SHARDBUS_SHARD_PORT": str(SHARD_PORT),
           "SHARDBUS_JETSTREAM_REPLICAS": "3", "SHARDBUS_RECONNECT_WAIT_S": "0.2",
           "SHARDBUS_RECONNECT_WAIT_MAX_S": "1", "SHARDBUS_METRICS_PORT": "0"}
    env.update({f"SHARDBUS_{k.upper()}": v for k, v in settings.items()})
    started = processes.start(f"gateway-{host.name}", host, [sys.executable, "-m", "shardbus", "run", "gateway"], env)
    return wait_healthy(started, health, timeout)


def wait_healthy(started: Started, health: Path, timeout: float) -> Started:
    """``started`` once its health file is fresh; its log's end in the error when it exits first
    or is not healthy within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not health_file_is_fresh(str(health)):
        if started.proc.poll() is not None:
            raise RuntimeError(f"{started.name} exited with {started.proc.returncode}:\n{started.log()[-3000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{started.name} was not healthy within {timeout} s:\n{started.log()[-3000:]}")
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


def keep(workdir: Path, name: str) -> Path:
    """The run's logs, history and captures (pcap), kept where pytest's rotation of temporary
    directories (shared with every other run on the machine) cannot take them:
    ``SHARDBUS_HOSTS_OUT``, else ``.hosts-runs/`` in the checkout."""
    root = Path(os.environ.get("SHARDBUS_HOSTS_OUT") or REPO / ".hosts-runs")
    target = root / f"{time.strftime('%Y%m%dT%H%M%S')}-{name.replace(' ', '-')}"
    target.mkdir(parents=True, exist_ok=True)
    for path in workdir.iterdir():
        if path.is_file() and path.suffix in {".log", ".json", ".jsonl", ".pcap"}:
            shutil.copy2(path, target / path.name)
    return target
