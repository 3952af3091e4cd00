"""The TLS override files, compose.tls.yaml (one NATS node) and compose.cluster-tls.yaml (the
3-node cluster), with certificates made by deploy/tls-certs.sh (docs/security.md, "TLS";
docs/operations.md, "Compose with TLS"), marked ``needs_engine`` and run by ``make test-compose``:

- both combinations pass compose's own config check, and what it merges is what the files say:
  NATS on the TLS configuration with the certificates mounted read-only, every service given the
  CA (and the gateway and the web door their certificates) and no NATS key, every file named
  there made by the script, each certificate naming the hosts that dial it;
- compose.yaml + compose.tls.yaml up for real: a simulated shard dialing the gateway's host port
  over TLS has its frames stored, a command through the web door over HTTPS is answered, a NATS
  client over TLS is let in and one speaking plain text is refused, and the WebSocket port
  serves wss://;
- compose.yaml + compose.cluster.yaml + compose.cluster-tls.yaml up for real: the three nodes'
  routes formed over TLS (each node sees the other two; a route port refuses a peer without a
  certificate of the CA, and one speaking plain text) and a shard's frames stored on all three
  (R3, both followers current).

The engine, the stack and the shards are test_compose_up.py's; every stack is taken down with
its volumes, and the test fails when anything of it is left.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import nats
import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from tests.deploy import test_compose_up as up
from tests.deploy.conftest import ROOT

pytestmark = [pytest.mark.needs_engine, pytest.mark.timeout(1800)]

# test_compose_up.py's fixtures, shared: the engine (podman's Docker API or docker, the images,
# the shardbus image built) and the simulated shards, each stopped by its handle.
engine = up.engine
shards = up.shards

SERVICES = ("gateway", "ledger", "cleanup", "installer", "web")
COMBINATIONS = {
    "single": ["compose.yaml", "compose.tls.yaml"],
    "cluster": ["compose.yaml", "compose.cluster.yaml", "compose.cluster-tls.yaml"],
}
NODES = {"single": {"nats": "nats"}, "cluster": {"nats": "nats-1", "nats-2": "nats-2", "nats-3": "nats-3"}}
"""Each combination's NATS services and the host name each is dialed by."""
CONFIG_FILE = {"single": "/etc/nats/nats-tls.conf", "cluster": "/etc/nats/cluster-node-tls.conf"}
TLS_SETTINGS = {"SHARDBUS_NATS_TLS_CA", "SHARDBUS_SHARD_TLS_CERT", "SHARDBUS_SHARD_TLS_KEY",
                "SHARDBUS_SHARD_TLS_CA", "SHARDBUS_WEB_TLS_CERT", "SHARDBUS_WEB_TLS_KEY"}
WEBSITE = ("website", "website-dev")  # compose.yaml's default website user (deploy/nats/nats.conf)


@pytest.fixture(scope="module")
def tls_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trial's certificates, made as an operator makes them (make tls-certs)."""
    where = tmp_path_factory.mktemp("compose-tls") / "tls"
    up._run([str(ROOT / "deploy" / "tls-certs.sh"), str(where)], timeout=60)
    return where


def _compose_command() -> list[str]:
    if shutil.which("docker") and up._run(["docker", "compose", "version"], check=False).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    up._unavailable("neither docker compose nor docker-compose is installed (make engine)")
    raise AssertionError("unreachable")


def _mounts(service: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """target -> (source, read-only) of a merged service's volumes (v1 strings, v2 mappings)."""
    found = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            found[volume["target"]] = (str(volume["source"]), bool(volume.get("read_only")))
        else:
            source, target, *mode = volume.split(":")
            found[target] = (source, mode == ["ro"])
    return found


def _config(files: list[str], tls: Path) -> dict[str, Any]:
    """The files merged by compose's own config check, with the variables a trial sets."""
    args = [arg for name in files for arg in ("-f", str(ROOT / name))]
    done = up._run([*_compose_command(), *args, "config"], timeout=60,
                   env={**os.environ, **up.TOKENS, "TLS_DIR": str(tls)})
    return dict(yaml.safe_load(done.stdout)["services"])


def _names(cert: Path) -> set[str]:
    """The DNS names and addresses a certificate is valid for."""
    loaded = x509.load_pem_x509_certificate(cert.read_bytes())
    alt = loaded.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {*alt.get_values_for_type(x509.DNSName), *(str(ip) for ip in alt.get_values_for_type(x509.IPAddress))}


def _usages(cert: Path) -> set[x509.ObjectIdentifier]:
    loaded = x509.load_pem_x509_certificate(cert.read_bytes())
    return set(loaded.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


@pytest.mark.parametrize("combination", sorted(COMBINATIONS))
def test_compose_config_passes_with_tls_on(combination, tls_dir):
    merged = _config(COMBINATIONS[combination], tls_dir)
    named: set[str] = set()  # the files of TLS_DIR something reads, as nats/… or shardbus/…
    for service, host in NODES[combination].items():
        node = merged[service]
        assert node["command"][:2] == ["-c", CONFIG_FILE[combination]], node["command"]
        mounts = _mounts(node)
        assert mounts["/etc/nats/tls"] == (str(tls_dir / "nats"), True), mounts
        # The configuration and every file it includes, mounted beside each other.
        conf = CONFIG_FILE[combination]
        while conf:
            source, read_only = mounts[conf]
            assert read_only, (service, conf)
            text = Path(source).read_text()
            named |= {f"nats/{name}" for name in re.findall(r'"/etc/nats/tls/([^"]+)"', text)}
            included = re.search(r"^include \./(\S+)$", text, re.M)
            conf = f"/etc/nats/{included[1]}" if included else ""
        assert host in _names(tls_dir / "nats" / "server.pem")
    for service in SERVICES:
        env = merged[service]["environment"]
        # The services' folder only: no service can read a NATS key.
        assert _mounts(merged[service])["/etc/shardbus/tls"] == (str(tls_dir / "shardbus"), True)
        assert not any(target.startswith("/etc/nats") or source.startswith(str(tls_dir / "nats"))
                       for target, (source, _) in _mounts(merged[service]).items()), service
        assert env["SHARDBUS_NATS_TLS_CA"] == "/etc/shardbus/tls/ca.pem"
        named |= {"shardbus/" + value.removeprefix("/etc/shardbus/tls/") for key, value in env.items()
                  if key in TLS_SETTINGS and value}
        # The URLs stay nats://, TLS negotiated on the port, to hosts the server certificate names.
        hosts = {urlsplit(url.strip()).hostname for url in env["SHARDBUS_NATS_URL"].split(",")}
        assert hosts == set(NODES[combination].values())
    gateway, web = merged["gateway"]["environment"], merged["web"]["environment"]
    assert (gateway["SHARDBUS_SHARD_TLS_CERT"], gateway["SHARDBUS_SHARD_TLS_KEY"]) == (
        "/etc/shardbus/tls/gateway.pem", "/etc/shardbus/tls/gateway.key")
    assert gateway["SHARDBUS_SHARD_TLS_CA"] == ""  # client certificates only when SHARD_TLS_CA asks
    assert (web["SHARDBUS_WEB_TLS_CERT"], web["SHARDBUS_WEB_TLS_KEY"]) == (
        "/etc/shardbus/tls/web.pem", "/etc/shardbus/tls/web.key")
    # Every file named is one the script made; the host-side doors name what a shard or a website
    # on this host dials.
    assert named and {name for name in named if not (tls_dir / name).is_file()} == set()
    for door in ("shardbus/gateway", "shardbus/web", "nats/server"):
        assert {"localhost", "127.0.0.1"} <= _names(tls_dir / f"{door}.pem"), door
    assert (tls_dir / "nats" / "ca.pem").read_bytes() == (tls_dir / "shardbus" / "ca.pem").read_bytes()
    if combination == "cluster":
        route = tls_dir / "nats" / "route.pem"
        assert "nats/route.pem" in named
        assert set(NODES["cluster"].values()) <= _names(route)
        assert {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH} <= _usages(route)


def test_the_two_tls_files_give_the_services_the_same_settings(tls_dir):
    """compose.cluster-tls.yaml repeats compose.tls.yaml's settings of the services (a file of
    its own rather than a fourth -f): they must not drift apart."""
    single, cluster = (_config(files, tls_dir) for files in COMBINATIONS.values())
    for service in SERVICES:
        assert ({k: v for k, v in single[service]["environment"].items() if k in TLS_SETTINGS}
                == {k: v for k, v in cluster[service]["environment"].items() if k in TLS_SETTINGS}), service
        assert _mounts(single[service])["/etc/shardbus/tls"] == _mounts(cluster[service])["/etc/shardbus/tls"]


def _tls_stack(engine: up.Engine, combination: str, tls: Path) -> up.Stack:
    stack = up.Stack(engine, COMBINATIONS[combination])
    stack.env["TLS_DIR"] = str(tls)
    return stack


@pytest.fixture
def tls_stack(engine: up.Engine, tls_dir: Path) -> Iterator[up.Stack]:
    """compose.yaml + compose.tls.yaml up, every container healthy; taken down after."""
    stack = _tls_stack(engine, "single", tls_dir)
    try:
        stack.up({})
        yield stack
    finally:
        stack.down()


def _wait_stored(stack: up.Stack, node: str, at_least: int, timeout: float = 120) -> dict[str, Any]:
    """The frames stream as ``node`` reports it, once it holds ``at_least`` messages."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            frames = up._frames(stack, node)
        except AssertionError:  # the gateway has not created the stream yet
            frames = {}
        if int(frames.get("state", {}).get("messages", 0)) >= at_least:
            return frames
        assert time.monotonic() < deadline, f"no {at_least} frames stored within {timeout} s: {frames}"
        time.sleep(2)


def _plain_client(port: int) -> tuple[str, bytes]:
    """A NATS client speaking plain text to the client port: the server's first line, and what
    it answers a CONNECT (with a real user and password) and a PING until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.settimeout(10)
        first = b""
        while b"\r\n" not in first:
            chunk = sock.recv(4096)
            assert chunk, f"closed before its INFO: {first!r}"
            first += chunk
        user, password = WEBSITE
        sock.sendall(f'CONNECT {{"user":"{user}","pass":"{password}","verbose":false}}\r\nPING\r\n'.encode())
        answer = b""
        try:
            while chunk := sock.recv(4096):
                answer += chunk
        except ConnectionResetError:
            pass
        except TimeoutError:
            pytest.fail(f"a plain-text client was kept open 10 s; it got {answer!r}")
        return first.split(b"\r\n", 1)[0].decode(), answer


async def _tls_client(port: int, ca: Path) -> float:
    """A NATS client over TLS (verifying with ca.pem), as a website on this host: its round trip."""
    user, password = WEBSITE
    nc = await nats.connect(f"nats://{user}:{password}@127.0.0.1:{port}", tls=ssl.create_default_context(
        cafile=str(ca)), connect_timeout=10, max_reconnect_attempts=0, allow_reconnect=False)
    try:
        return float(await nc.rtt())
    finally:
        await nc.close()


def test_compose_tls_up_carries_shards_commands_and_clients_over_tls_only(tls_stack, tls_dir, shards):
    stack, ca = tls_stack, tls_dir / "shardbus" / "ca.pem"
    client = ssl.create_default_context(cafile=str(ca))
    # A shard over TLS to the gateway's host port (its certificate names 127.0.0.1): frames stored.
    shards.start(stack.host_port("gateway", 1, 2595), "uo1", "--tls-ca", str(ca))
    _wait_stored(stack, "nats", 1)
    up._wait_for_shards(stack, 1)
    # A command through the web door over HTTPS, verified with the same CA.
    assert up._command(stack, "uo1", tls=client) == 200

    nats_port = int(stack.ports["NATS_PORT"])
    # A client that starts TLS is let in; one speaking plain text is told TLS is required and
    # hears no PONG: the server closes the connection.
    assert asyncio.run(_tls_client(nats_port, ca)) >= 0
    info, answer = _plain_client(nats_port)
    assert info.startswith("INFO ") and json.loads(info[5:]).get("tls_required") is True, info
    assert b"PONG" not in answer and b"+OK" not in answer, answer
    # The browser pages' WebSocket port serves TLS (wss://) with the same certificate.
    with socket.create_connection(("127.0.0.1", int(stack.ports["NATS_WS_PORT"])), timeout=10) as raw, \
            client.wrap_socket(raw, server_hostname="localhost") as wss:
        assert wss.version() in ("TLSv1.2", "TLSv1.3")


ROUTE_PEER = """
import socket, ssl, sys
node, plain = sys.argv[1], sys.argv[2] == "plain"
with socket.create_connection((node, 6222), timeout=15) as raw:
    if plain:  # a peer speaking plain text: the node says nothing and closes (its TLS timeout, 5 s)
        print("plain:", repr(raw.recv(4096)))
        sys.exit()
    # TLS, the node verified with the services' CA, but no certificate of the peer's own
    context = ssl.create_default_context(cafile="/etc/shardbus/tls/ca.pem")
    try:
        with context.wrap_socket(raw, server_hostname=node) as tls:
            print("tls:", tls.version(), "served", repr(tls.recv(4096)[:40]))
    except (ssl.SSLError, OSError) as error:
        print("tls: refused", error)
"""


def test_compose_cluster_tls_up_forms_its_routes_over_tls(engine, tls_dir, shards):
    stack = _tls_stack(engine, "cluster", tls_dir)
    try:
        stack.up({})
        for node in up.NODE_SERVICES:
            # Each node has routes to the other two, over TLS: the node presents a certificate of
            # the CA naming it, and refuses a peer without one of its own (verify: true).
            routes = up._monitor(stack, node, "routez")["routes"]
            assert {route.get("remote_name") for route in routes} == set(up.NODE_SERVICES) - {node}, routes
            said = stack.exec("installer", 1, "python3", "-c", ROUTE_PEER, node, "tls").strip()
            assert said.startswith("tls: refused") and "certificate required" in said, said
        # A route port never speaks plain text (one node is enough: 5 s each).
        said = stack.exec("installer", 1, "python3", "-c", ROUTE_PEER, "nats-2", "plain").strip()
        assert said == "plain: b''", said
        # A shard over TLS: its frames stored in the R3 frames stream, current on every node.
        shards.start(stack.host_port("gateway", 1, 2595), "uo1", "--tls-ca", str(tls_dir / "shardbus" / "ca.pem"))
        frames = _wait_stored(stack, "nats-1", 1)
        # As the stream's leader sees its two followers (only the leader knows whether they are current).
        deadline = time.monotonic() + 60
        while True:
            frames = up._frames(stack, frames["cluster"]["leader"])
            replicas = frames["cluster"].get("replicas", [])
            if len(replicas) == 2 and all(replica.get("current") for replica in replicas):
                break
            assert time.monotonic() < deadline, f"the frames stream's replicas not current: {frames['cluster']}"
            time.sleep(2)
    finally:
        stack.down()


def test_tls_certs_refuses_to_overwrite_a_set(tls_dir):
    done = subprocess.run([str(ROOT / "deploy" / "tls-certs.sh"), str(tls_dir)], capture_output=True, text=True,
                          timeout=60)
    assert (done.returncode, done.stderr.strip()) == (
        1, f"{tls_dir} holds certificates already (remove {tls_dir}/nats and {tls_dir}/shardbus for a new set)")
