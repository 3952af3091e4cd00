"""The web door on a host of its own (docs/reliability.md, "Hosts"): ``shardbus run web`` listing
every NATS node, serving HTTPS on its host's address with a certificate of a CA made for the run
(its bearer token crosses hosts: never in plain HTTP, docs/web.md), returning once healthy. The
website host calls it beside NATS (``website_host.py --door``)."""

from __future__ import annotations

import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

import trustme

from tests.hosts import harness
from tests.hosts.net import Host

DOOR_PORT = 8443

REQUEST_TIMEOUT_S = 3.0
"""The door's ``SHARDBUS_WEB_REQUEST_TIMEOUT_S`` here: above the gateway's command timeout (2 s,
so the shard's 504 is the gateway's) and below the website's wait (4 s, so the door's own 504
arrives before the website gives up)."""


@dataclass
class Door:
    url: str
    ca: Path
    token: str
    handle: harness.Started


def start_door(processes: harness.Processes, host: Host, nodes: list[harness.Node], workdir: Path,
               timeout: float = 60.0) -> Door:
    folder = workdir / "door-tls"
    folder.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    leaf = ca.issue_cert(host.address)
    cert, key = folder / "door.pem", folder / "door.key"
    cert.write_bytes(b"".join(pem.bytes() for pem in leaf.cert_chain_pems))
    key.write_bytes(leaf.private_key_pem.bytes())
    token = secrets.token_hex(16)
    health = workdir / "door.health"
    env = {**os.environ, "SHARDBUS_NATS_URL": ",".join(n.url for n in nodes), "SHARDBUS_HEALTH_FILE": str(health),
           "SHARDBUS_WEB_HOST": host.address, "SHARDBUS_WEB_PORT": str(DOOR_PORT), "SHARDBUS_WEB_TOKEN": token,
           "SHARDBUS_WEB_TLS_CERT": str(cert), "SHARDBUS_WEB_TLS_KEY": str(key),
           "SHARDBUS_WEB_REQUEST_TIMEOUT_S": str(REQUEST_TIMEOUT_S), "SHARDBUS_JETSTREAM_REPLICAS": "3",
           "SHARDBUS_RECONNECT_WAIT_S": "0.2", "SHARDBUS_RECONNECT_WAIT_MAX_S": "1", "SHARDBUS_METRICS_PORT": "0"}
    started = processes.start("door", host, [sys.executable, "-m", "shardbus", "run", "web"], env)
    harness.wait_healthy(started, health, timeout)
    return Door(f"https://{host.address}:{DOOR_PORT}", folder / "ca.pem", token, started)
