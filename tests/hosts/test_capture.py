"""What an eavesdropper on the network between hosts reads (docs/security.md, "TLS"; issue 37):
tcpdump on the hosts' bridge records every packet while shards stream frames to a gateway on
another host, which publishes them to a 3-node NATS cluster (R3: the routes carry them too), until
every frame is acknowledged. The nodes run deploy/nats's configuration (users and passwords; with
TLS, cluster-node-tls.conf: TLS on client connections, verified TLS on the routes); the gateway
logs in as its user and listens for shards over TLS; the shards dial TLS.

The pcap file is then searched, raw and connection by connection: with TLS on, no shard token,
no NATS password, no NATS command and no frame's content anywhere, and both sides of every
connection open with a TLS handshake record; with TLS off (the same test, so that it can fail)
the token is in the shard link, the gateway's password in its CONNECT, the frames in the routes.

Needs root and Debian's tcpdump (``make test-hosts`` installs it: ``make tcpdump``); skipped with
the reason without root, failed instead when ``SHARDBUS_REQUIRE_HOSTS=1``."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.hosts import harness
from tests.hosts.capture import TCPDUMP, Flow, between, read_flows, tcpdump
from tests.hosts.net import Hosts, why_not_available
from tests.hosts.shard_host import KIND

REASON = why_not_available()
if REASON is not None and os.environ.get("SHARDBUS_REQUIRE_HOSTS") == "1":
    pytest.fail(f"SHARDBUS_REQUIRE_HOSTS=1 but {REASON}", pytrace=False)
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

SHARDS, RATE, SECONDS = 2, 20.0, 5.0
"""Two shards at 20 frames/s for 5 s: 200 frames, every one acknowledged during the capture."""

TLS_HANDSHAKE = b"\x16\x03"
"""A TLS record of type handshake (22), version 3.x: what a ClientHello starts with."""


def wait_until(what: str, condition: Callable[[], object], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout} s: {what}")
        time.sleep(0.2)


def joined(flows: list[Flow]) -> bytes:
    return b"".join(f.data() for f in flows)


def connect_lines(flows: list[Flow]) -> list[bytes]:
    """Every NATS ``CONNECT`` line a client sent in the clear."""
    return [line for f in flows for line in f.data().split(b"\r\n") if line.startswith(b"CONNECT ")]


def configured(nodes: list[harness.Node], tls: bool) -> str:
    """Each node as it says it runs (its monitoring ``/varz``), and the gateway's connection
    (``/connz``): passwords required, TLS on clients and verified TLS on routes when ``tls``, the
    gateway logged in as ``gateway``, over TLS when ``tls``."""
    for node in nodes:
        varz = node.monitor("varz")
        cluster = varz.get("cluster") or {}
        assert varz.get("auth_required") is True, (node.name, varz)
        assert (bool(varz.get("tls_required")), bool(cluster.get("tls_required")),
                bool(cluster.get("tls_verify"))) == (tls, tls, tls), (node.name, varz)
    wait_until("the gateway connected to a node",
               lambda: harness.connected_node(nodes, "shardbus-gateway") is not None, 30)
    node = harness.connected_node(nodes, "shardbus-gateway")
    assert node is not None
    gateway = next(c for c in node.monitor("connz?auth=true")["connections"]
                   if "shardbus-gateway" in (c.get("name") or ""))
    assert gateway.get("authorized_user") == "gateway" and bool(gateway.get("tls_version")) is tls, gateway
    return f"the gateway on {node.name} as 'gateway', TLS {gateway.get('tls_version') or 'none'}"


@pytest.mark.parametrize("tls", [True, False], ids=["tls-on", "tls-off"])
def test_a_capture_between_hosts_holds_no_token_or_password_with_tls_and_both_without(tmp_path: Path,
                                                                                       tls: bool) -> None:
    assert Path(TCPDUMP).exists(), f"no {TCPDUMP}: `make tcpdump` installs Debian's tcpdump"
    started_at = time.monotonic()
    name = f"capture tls {'on' if tls else 'off'}"
    pcap = tmp_path / f"capture-tls-{'on' if tls else 'off'}.pcap"
    processes = harness.Processes(tmp_path)
    with Hosts(tmp_path) as hosts:
        try:
            nats_hosts = [hosts.add(f"nats{i}") for i in (1, 2, 3)]
            gw_host, shard_host = hosts.add("gw"), hosts.add("shards")
            certs = harness.Certificates.issue(tmp_path / "tls", nats_hosts, gw_host) if tls else None
            security = harness.Security.new(certs)
            # The monitoring port (the harness's own polling, plain HTTP) is left out.
            with tcpdump(hosts.bridge, pcap, tmp_path / "tcpdump.log",
                         f"tcp and not port {harness.MONITOR_PORT}") as dump:
                try:
                    nodes = harness.start_cluster(processes, nats_hosts, tmp_path, security=security)
                    harness.start_gateway(processes, gw_host, nodes, tmp_path, security=security)
                    servers = configured(nodes, tls)
                    out = tmp_path / "history.json"
                    shards = processes.start("shards", shard_host, [
                        sys.executable, "-m", "tests.hosts.shard_host", "--gateway",
                        f"{gw_host.address}:{harness.SHARD_PORT}", "--token", harness.TOKEN,
                        "--shards", str(SHARDS), "--rate", str(RATE), "--seconds", str(SECONDS),
                        "--drain-seconds", "30", "--out", str(out),
                        *(["--tls-ca", str(certs.ca)] if certs is not None else [])],
                        env={**os.environ, "PYTHONPATH": str(harness.REPO)})
                    wait_until("the shard host finished (every frame acknowledged, or its drain ran out)",
                               lambda: shards.proc.poll() is not None, SECONDS + 60)
                    history = json.loads(out.read_text())["shards"]
                finally:
                    processes.stop_all()
            tcpdump_exit, packets = dump.proc.returncode if dump.proc else None, dump.counts()
        finally:
            processes.stop_all()
            kept = harness.keep(tmp_path, name)
    assert hosts.leftovers() == []
    assert dump.proc is not None and dump.proc.poll() is not None

    # The capture holds real traffic: every frame was acknowledged while tcpdump ran.
    sent = sum(len(record["sent"]) for record in history.values())
    acked = sum(len(set(record["acks"])) for record in history.values())
    assert sent >= SHARDS * RATE * SECONDS * 0.9 and acked == sent, history
    assert all(not record["unacked"] for record in history.values())
    # Every packet the filter took is in the file: none dropped, none left in the kernel's buffer.
    assert tcpdump_exit == 0 and packets.get("dropped by kernel") == 0, dump.log()
    assert packets.get("captured") == packets.get("received by filter"), dump.log()

    raw = pcap.read_bytes()
    flows = read_flows(pcap)
    node_addresses = {h.address for h in nats_hosts}
    links = {"shard link": between(flows, {shard_host.address}, {gw_host.address}, harness.SHARD_PORT),
             "gateway-NATS": between(flows, {gw_host.address}, node_addresses, harness.CLIENT_PORT),
             "routes": between(flows, node_addresses, node_addresses, harness.ROUTE_PORT)}
    token, password = harness.TOKEN.encode(), security.passwords["gateway"].encode()
    found: dict[str, dict[str, bool]] = {}
    for link, link_flows in links.items():
        data = joined(link_flows)
        assert len(data) > 1000, f"{link}: {len(data)} bytes captured"
        found[link] = {"token": token in data, "password": password in data, "CONNECT": b"CONNECT " in data,
                       KIND: KIND.encode() in data}
        # Each side's first bytes, on every connection: a TLS handshake record with TLS (nothing
        # before it, not even NATS's INFO), the protocol's first words without.
        openings = [f.data()[:2] for f in link_flows if f.syn and f.data()]
        assert openings, f"{link}: no connection opened during the capture"
        assert all((opening == TLS_HANDSHAKE) is tls for opening in openings), (link, openings)
    shown = "; ".join(f"{link} {len(joined(links[link])):,} bytes, found "
                      + (", ".join(what for what, there in seen.items() if there) or "none of them")
                      for link, seen in found.items())
    summary = (f"hosts, {name}: {acked} of {sent} frames acknowledged; {len(raw):,} bytes captured "
               f"({packets['captured']} packets); {servers}; "
               f"{shown}; {time.monotonic() - started_at:.0f} s")
    print(f"\n{summary}")
    (kept / "summary.txt").write_text(summary + "\n")

    if tls:
        assert TLS_HANDSHAKE in raw
        for secret in (token, password, b"CONNECT ", KIND.encode()):
            assert secret not in raw, secret
            assert not any(secret in f.data() for f in flows.values()), secret
    else:
        assert found["shard link"]["token"] and found["shard link"][KIND]
        assert any(password in line for line in connect_lines(links["gateway-NATS"])), "no CONNECT with the password"
        assert found["routes"][KIND] and found["routes"]["CONNECT"]
        assert token in raw and password in raw
