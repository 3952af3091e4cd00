"""NATS over TLS (docs/security.md, "TLS"): a client given ``SHARDBUS_NATS_TLS_CA`` reaches a
TLS nats-server (handshake first, as the services connect, and after INFO, as other clients
may); a plain client, one trusting another CA and one without the certificate a ``verify``
server asks for are refused; a 3-node cluster routes over verified TLS; and a recording proxy
between client and server sees the password of a plain connection and not of a TLS one.

Real nats-server processes (shardbus.embedded), certificates from trustme."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
import trustme
from nats.js.api import StreamConfig

from shardbus import embedded
from shared.nats_connect import inbox_prefix
from shared.settings import CommonSettings
from tests.gateway.test_shard_tls import RecordingProxy
from tests.streams import publish_when_led

PASSWORD = "pTlsTestPassword4711"


def write_tls(folder: Path, ca: trustme.CA, leaf: trustme.LeafCert, name: str) -> tuple[Path, Path]:
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    cert.write_bytes(b"".join(pem.bytes() for pem in leaf.cert_chain_pems))
    key.write_bytes(leaf.private_key_pem.bytes())
    return cert, key


class Pki:
    """A CA, the servers' certificate (127.0.0.1, localhost) and a client's, as files."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.ca = trustme.CA()
        self.ca_file = folder / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        self.server_cert, self.server_key = write_tls(folder, self.ca, self.ca.issue_cert("127.0.0.1", "localhost"),
                                                      "server")
        self.client_cert, self.client_key = write_tls(folder, self.ca, self.ca.issue_cert("shardbus-client"),
                                                      "client")
        self.wrong_ca_file = folder / "wrong-ca.pem"
        trustme.CA().cert_pem.write_to_path(str(self.wrong_ca_file))

    def server(self, verify: bool = False) -> embedded.NatsTLS:
        return embedded.NatsTLS(self.server_cert, self.server_key, self.ca_file, verify=verify)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


@pytest.fixture
def tls_nats(tmp_path: Path, pki: Pki) -> Iterator[embedded.NatsServer]:
    server = embedded.start_nats(tmp_path / "nats", tls=pki.server(),
                                 extra_args=("--user", "svc", "--pass", PASSWORD))
    try:
        yield server
    finally:
        server.stop()


def with_password(url: str) -> str:
    """``url`` with the user and password (a TLS server's ports file says ``tls://``)."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://svc:{PASSWORD}@{rest}"


async def connect(url: str, **settings: object) -> nats.NATS:
    options = CommonSettings(nats_url=url, **settings).nats_tls()  # type: ignore[arg-type]
    servers = url.split(",")
    return await nats.connect(servers, connect_timeout=5, allow_reconnect=False, max_reconnect_attempts=0,
                              inbox_prefix=inbox_prefix(servers), **options)


@pytest.mark.parametrize("handshake_first", [True, False], ids=["handshake-first", "after-info"])
async def test_a_client_given_the_ca_reaches_a_tls_server(tls_nats, pki, handshake_first, unique):
    nc = await connect(with_password(tls_nats.url), nats_tls_ca=str(pki.ca_file),
                       nats_tls_handshake_first=handshake_first)
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name=f"T{unique}", subjects=[f"t{unique}.>"]))
        ack = await js.publish(f"t{unique}.a", b"over tls")
        assert ack.seq == 1  # the server takes TLS connections only: this one is
    finally:
        await nc.close()


async def test_a_plain_client_or_one_trusting_another_ca_is_refused(tls_nats, pki):
    with pytest.raises(Exception):  # noqa: B017 — nats-py's error differs by where it fails
        await connect(with_password(tls_nats.url))  # the server asks TLS; nats-py has no CA to verify with
    with pytest.raises(Exception):  # noqa: B017
        await connect(with_password(tls_nats.url), nats_tls_ca=str(pki.wrong_ca_file))


async def test_a_verifying_server_refuses_a_client_without_its_certificate(tmp_path, pki, unique):
    server = embedded.start_nats(tmp_path / "verify", tls=pki.server(verify=True))
    try:
        with pytest.raises(Exception):  # noqa: B017
            await connect(server.url, nats_tls_ca=str(pki.ca_file))
        nc = await connect(server.url, nats_tls_ca=str(pki.ca_file), nats_tls_cert=str(pki.client_cert),
                           nats_tls_key=str(pki.client_key))
        try:
            assert (await nc.request("$JS.API.INFO", b"", timeout=5)).data
        finally:
            await nc.close()
    finally:
        server.stop()


def test_a_client_certificate_without_the_ca_is_a_settings_error():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="need SHARDBUS_NATS_TLS_CA"):
        CommonSettings(nats_tls_cert="/a/cert.pem")


@pytest.mark.parametrize("over_tls", [True, False], ids=["tls", "plain"])
async def test_the_password_crosses_a_tls_connection_encrypted_and_a_plain_one_in_the_clear(
        tmp_path, pki, over_tls, unique):
    server = embedded.start_nats(tmp_path / "rec", tls=pki.server() if over_tls else None,
                                 extra_args=("--user", "svc", "--pass", PASSWORD))
    proxy = RecordingProxy(server.port)
    try:
        port = await proxy.start()
        url = f"nats://svc:{PASSWORD}@127.0.0.1:{port}"
        options = {"nats_tls_ca": str(pki.ca_file), "nats_tls_hostname": "127.0.0.1"} if over_tls else {}
        nc = await connect(url, **options)
        try:
            sub = await nc.subscribe(f"secret{unique}")
            await nc.publish(f"secret{unique}", b"a-message-body-to-find")
            assert (await sub.next_msg(timeout=5)).data == b"a-message-body-to-find"
        finally:
            await nc.close()
    finally:
        await proxy.stop()
        server.stop()
    recorded = bytes(proxy.recorded)
    assert len(recorded) > 200
    for secret in (PASSWORD.encode(), b"a-message-body-to-find", b"CONNECT"):
        assert (secret in recorded) is not over_tls, secret


async def test_a_three_node_cluster_routes_over_verified_tls(tmp_path, pki, unique):
    cluster = embedded.start_nats_cluster(tmp_path / "cluster", 3, durable=False, tls=pki.server())
    try:
        for node in cluster.nodes:  # every node's routes TLS only, verifying their peers
            varz = await asyncio.to_thread(_monitor, node.monitor_port, "varz")
            assert varz["tls_required"] and varz["cluster"]["tls_required"] and varz["cluster"]["tls_verify"]
            routes = (await asyncio.to_thread(_monitor, node.monitor_port, "routez"))["routes"]
            assert {r["remote_name"] for r in routes} == {n.name for n in cluster.nodes} - {node.name}
        first = await connect(cluster.nodes[0].url, nats_tls_ca=str(pki.ca_file))
        third = await connect(cluster.nodes[2].url, nats_tls_ca=str(pki.ca_file))
        try:
            js = first.jetstream()
            await js.add_stream(StreamConfig(name=f"R{unique}", subjects=[f"r{unique}.>"], num_replicas=3))
            await publish_when_led(js, f"r{unique}.x", b"replicated")
            msg = await third.jetstream().get_msg(f"R{unique}", 1)
            assert msg.data == b"replicated"
        finally:
            await first.close()
            await third.close()
    finally:
        cluster.stop()


def _monitor(monitor_port: int, page: str) -> dict:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{monitor_port}/{page}", timeout=5) as reply:
        return dict(json.load(reply))


# --- the deployment's example configs (deploy/nats/nats-tls.conf, cluster-node-tls.conf) ---------

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "nats"
USERS = ("gateway", "ledger", "cleanup", "installer", "web", "website", "operator", "module-events")


def deploy_copy(folder: Path, pki: Pki, *, store: Path | None = None) -> Path:
    """The three deploy/nats files copied to ``folder``, the certificates' paths (/etc/nats/tls/)
    pointing at ``pki``'s and the WebSocket listener on a free loopback port: only what no flag
    sets differs from what an operator runs."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {"server.pem": pki.server_cert, "server.key": pki.server_key, "ca.pem": pki.ca_file,
             "route.pem": pki.server_cert, "route.key": pki.server_key}
    for name in ("nats.conf", "nats-tls.conf", "cluster-node-tls.conf"):
        text = (DEPLOY / name).read_text()
        for file, path in files.items():
            text = text.replace(f"/etc/nats/tls/{file}", str(path))
        text = text.replace("  port: 9222", f'  host: "127.0.0.1"\n  port: {embedded.free_port()}')
        text = text.replace("  store_dir: /data/jetstream\n", "")  # given by start_nats (-sd)
        (folder / name).write_text(text)
    return folder


@pytest.fixture
def passwords(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Each user's password, in the variables nats.conf reads (as compose gives them)."""
    chosen = {user: f"p{user.replace('-', '')}Secret42" for user in USERS}
    for user, password in chosen.items():
        monkeypatch.setenv(f"{user.upper().replace('-', '_')}_NATS_PASSWORD", password)
    return chosen


async def test_the_deployment_tls_config_serves_services_and_websites_over_tls(tmp_path, pki, passwords):
    folder = deploy_copy(tmp_path / "deploy", pki)
    server = embedded.start_nats(tmp_path / "n", extra_args=("-c", str(folder / "nats-tls.conf"), "-m", "-1"))
    try:
        port = server.port
        gateway = await connect(f"nats://gateway:{passwords['gateway']}@127.0.0.1:{port}",
                                nats_tls_ca=str(pki.ca_file))  # handshake first, as the services
        website = await connect(f"nats://website:{passwords['website']}@127.0.0.1:{port}",
                                nats_tls_ca=str(pki.ca_file), nats_tls_handshake_first=False)  # INFO first
        try:
            assert (await gateway.request("$JS.API.INFO", b"", timeout=5)).data
            assert (await website.request("$JS.API.INFO", b"", timeout=5)).data
        finally:
            await gateway.close()
            await website.close()
        with pytest.raises(Exception):  # noqa: B017 — a plain client: the server asks TLS
            await connect(f"nats://gateway:{passwords['gateway']}@127.0.0.1:{port}")
    finally:
        server.stop()


async def test_the_deployment_cluster_config_routes_over_verified_tls(tmp_path, pki, passwords, unique,
                                                                      monkeypatch):
    names = ["nats-1", "nats-2", "nats-3"]
    plan = {name: (embedded.free_port(), embedded.free_port(), embedded.free_port()) for name in names}
    routes = ",".join(f"nats-route://127.0.0.1:{route}" for _c, route, _h in plan.values())
    cluster = embedded.NatsCluster([], tmp_path / "cluster")
    try:
        for name in names:
            client, route, http = plan[name]
            folder = deploy_copy(tmp_path / "cluster" / name / "deploy", pki)
            monkeypatch.setenv("NATS_SERVER_NAME", name)
            node = embedded.start_nats(tmp_path / "cluster" / name, port=client, extra_args=(
                "-c", str(folder / "cluster-node-tls.conf"), "-m", str(http),
                "--cluster", f"nats://127.0.0.1:{route}", "--routes", routes))
            node.name, node.monitor_port = name, http
            cluster.nodes.append(node)
        await asyncio.to_thread(embedded.wait_for_meta_leader, cluster, 30)  # the routes carry JetStream's votes
        for node in cluster.nodes:
            varz = await asyncio.to_thread(_monitor, node.monitor_port, "varz")
            assert varz["cluster"]["tls_required"] and varz["cluster"]["tls_verify"] and varz["tls_required"]
        gateway = await connect(",".join(f"nats://gateway:{passwords['gateway']}@127.0.0.1:{n.port}"
                                         for n in cluster.nodes), nats_tls_ca=str(pki.ca_file))
        try:
            js = gateway.jetstream()
            await js.add_stream(StreamConfig(name=f"SHARD_FRAMES_{unique}", subjects=[f"shard.{unique}.frame.>"],
                                             num_replicas=3))
            assert (await publish_when_led(js, f"shard.{unique}.frame.x", b"r3")).seq == 1
        finally:
            await gateway.close()
    finally:
        cluster.stop()
