"""The shard listener over TLS (docs/gateway.md, "TLS"): a TLS shard streams and answers as a
plain one does; client certificates when ``SHARDBUS_SHARD_TLS_CA`` is set; a plaintext client, a
wrong CA, a missing, foreign or expired certificate, a silent or dripping handshake and noise
are each refused within the hello's deadline, logged once, counted, and leave nothing held; a
renewed certificate is served without a restart; and the token never crosses a TLS link in the
clear (a recording proxy between shard and gateway sees it on a plain link, not on TLS).

Certificates are made by trustme; every wait has a timeout, none asserts on elapsed time."""

from __future__ import annotations

import asyncio
import datetime
import logging
import random
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme

from shared import tls as shared_tls
from simulator.shard import ShardSimulator
from tests.gateway.conftest import TOKEN, RunningGateway, wait_until
from tests.gateway.test_command_plane import ask
from tests.gateway.test_listener import stored_frames

HELLO_TIMEOUT_S = 1.0
"""The refusal tests' hello deadline: short, so a silent connection is refused soon; the waits
for the refusal allow five times as long."""


@dataclass
class Certs:
    """The gateway's CA and certificate files, a second (wrong) CA, and the shards' CA."""

    ca: trustme.CA
    cert: Path
    key: Path
    ca_file: Path
    wrong_ca: trustme.CA
    shard_ca: trustme.CA
    shard_ca_file: Path
    folder: Path


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    ca, wrong, shard_ca = trustme.CA(), trustme.CA(), trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    cert, key, ca_file, shard_ca_file = (tmp_path / n for n in ("gateway.pem", "gateway.key", "ca.pem",
                                                               "shard-ca.pem"))
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    for extra in leaf.cert_chain_pems[1:]:
        extra.write_to_path(str(cert), append=True)
    leaf.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    shard_ca.cert_pem.write_to_path(str(shard_ca_file))
    return Certs(ca, cert, key, ca_file, wrong, shard_ca, shard_ca_file, tmp_path)


def shard_context(ca: trustme.CA, client: trustme.LeafCert | None = None) -> ssl.SSLContext:
    """What a shard's plugin holds: the CA that signed the gateway's certificate, and its own."""
    context = ssl.create_default_context()
    ca.configure_trust(context)
    if client is not None:
        client.configure_cert(context)
    return context


@pytest.fixture
async def tls_sims() -> AsyncIterator[list[ShardSimulator]]:
    sims: list[ShardSimulator] = []
    yield sims
    for sim in sims:
        await sim.close()


async def dial(running: RunningGateway, sims: list[ShardSimulator], shard: str, context: ssl.SSLContext | None,
               token: str = TOKEN) -> ShardSimulator:
    sim = ShardSimulator("127.0.0.1", running.port, shard, token, tls=context)
    sims.append(sim)
    await sim.connect()
    return sim


async def refusal(running: RunningGateway, label: str, count: int = 1, timeout: float = 5 * HELLO_TIMEOUT_S) -> None:
    """Wait until ``count`` connections were refused for ``label``, and none is still opening."""
    counts, connections = running.gateway.counts, running.gateway.connections
    await wait_until(lambda: counts.refusals[label] >= count and connections.opening == 0, timeout)
    assert counts.refusals[label] == count, counts.refusals


async def closed_by_gateway(reader: asyncio.StreamReader, timeout: float = 5 * HELLO_TIMEOUT_S) -> None:
    """Read until the gateway closes the connection (EOF or a reset)."""
    async with asyncio.timeout(timeout):
        try:
            while await reader.read(65536):
                pass
        except (ConnectionError, ssl.SSLError):
            pass


async def test_a_tls_shard_streams_frames_and_answers_a_command(start_gateway, tls_sims, certs, nc, unique):
    gateway = await start_gateway(shard_tls_cert=str(certs.cert), shard_tls_key=str(certs.key))
    sim = await dial(gateway, tls_sims, f"s{unique}", shard_context(certs.ca))
    await wait_until(lambda: sim.shard in gateway.gateway.links)
    for i in range(50):
        await sim.send("guild.update", guildId=i, name=f"g{i}")
    got = await stored_frames(nc, sim.shard, 51)
    assert [m.subject.rsplit(".", 2)[-2:] for m in got[1:]] == [["guild", "update"]] * 50
    answer = await ask(nc, sim.shard, "world.save", {})
    assert answer["status"] == 200, answer
    assert sim.connected and sim.tls_error is None


async def test_client_certificates_admit_a_signed_shard_and_refuse_one_without(
        start_gateway, tls_sims, certs, unique, caplog):
    gateway = await start_gateway(shard_tls_cert=str(certs.cert), shard_tls_key=str(certs.key),
                                  shard_tls_ca=str(certs.shard_ca_file), hello_timeout_s=HELLO_TIMEOUT_S)
    signed = certs.shard_ca.issue_cert(f"s{unique}")
    good = await dial(gateway, tls_sims, f"s{unique}", shard_context(certs.ca, signed))
    await wait_until(lambda: good.shard in gateway.gateway.links)

    caplog.set_level(logging.WARNING, "shardbus.gateway")
    bare = await dial(gateway, tls_sims, f"n{unique}", shard_context(certs.ca))  # TLS 1.3: refused after our side
    await asyncio.wait_for(bare.disconnected.wait(), 5 * HELLO_TIMEOUT_S)
    await refusal(gateway, "client_certificate")
    assert bare.shard not in gateway.gateway.links

    foreign = await dial(gateway, tls_sims, f"f{unique}", shard_context(certs.ca, certs.wrong_ca.issue_cert("x")))
    await asyncio.wait_for(foreign.disconnected.wait(), 5 * HELLO_TIMEOUT_S)
    await refusal(gateway, "client_certificate", 2)

    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=2)
    expired = certs.shard_ca.issue_cert(f"e{unique}", not_before=past - datetime.timedelta(days=1), not_after=past)
    late = await dial(gateway, tls_sims, f"e{unique}", shard_context(certs.ca, expired))
    await asyncio.wait_for(late.disconnected.wait(), 5 * HELLO_TIMEOUT_S)
    await refusal(gateway, "client_certificate", 3)

    lines = [r for r in caplog.records if r.getMessage() == "TLS handshake refused"]
    assert len(lines) == 3, [r.__dict__.get("reason") for r in lines]  # once per connection, with the reason
    assert "expired" in lines[2].__dict__["reason"]
    assert set(gateway.gateway.links) == {good.shard} and good.connected


async def test_a_plaintext_shard_on_the_tls_listener_is_refused_in_time(start_gateway, tls_sims, certs, unique,
                                                                        caplog):
    gateway = await start_gateway(shard_tls_cert=str(certs.cert), shard_tls_key=str(certs.key),
                                  hello_timeout_s=HELLO_TIMEOUT_S)
    caplog.set_level(logging.WARNING, "shardbus.gateway")
    plain = await dial(gateway, tls_sims, f"p{unique}", None)
    await asyncio.wait_for(plain.disconnected.wait(), 5 * HELLO_TIMEOUT_S)
    await refusal(gateway, "not_tls")
    [line] = [r for r in caplog.records if r.getMessage() == "TLS handshake refused"]
    assert "plaintext" in line.__dict__["reason"] and TOKEN not in caplog.text


async def test_a_shard_trusting_another_ca_refuses_the_gateway(start_gateway, tls_sims, certs, unique):
    gateway = await start_gateway(shard_tls_cert=str(certs.cert), shard_tls_key=str(certs.key),
                                  hello_timeout_s=HELLO_TIMEOUT_S)
    with pytest.raises(ssl.SSLCertVerificationError):
        await dial(gateway, tls_sims, f"w{unique}", shard_context(certs.wrong_ca))
    # An OpenSSL client sends an alert (unknown CA: gateway_certificate); Python's asyncio resets
    # the connection instead, which the gateway sees as a handshake the shard closed.
    refusals = gateway.gateway.counts.refusals
    await wait_until(lambda: refusals["gateway_certificate"] + refusals["handshake_closed"] == 1
                     and gateway.gateway.connections.opening == 0, 5 * HELLO_TIMEOUT_S)
    assert not gateway.gateway.links


async def test_a_silent_or_dripping_handshake_is_refused_at_the_hello_deadline(start_gateway, certs):
    gateway = await start_gateway(shard_tls_cert=str(certs.cert), shard_tls_key=str(certs.key),
                                  hello_timeout_s=HELLO_TIMEOUT_S)
    silent_reader, silent = await asyncio.open_connection("127.0.0.1", gateway.port)
    await closed_by_gateway(silent_reader)
    await refusal(gateway, "handshake_timeout")

    # slowloris: a real ClientHello, one byte at a time, never finished before the deadline
    hello = client_hello(certs)
    drip_reader, drip = await asyncio.open_connection("127.0.0.1", gateway.port)

    async def drip_bytes() -> None:
        for byte in hello[:-1]:
            drip.write(bytes([byte]))
            await asyncio.sleep(HELLO_TIMEOUT_S / 20)

    dripping = asyncio.create_task(drip_bytes())
    try:
        await closed_by_gateway(drip_reader)
    finally:
        dripping.cancel()
        await asyncio.gather(dripping, return_exceptions=True)
    await refusal(gateway, "handshake_timeout", 2)
    for writer in (silent, drip):
        writer.close()


async def test_a_shard_silent_after_its_handshake_is_refused_at_the_same_deadline(start_gateway, certs):
    gateway = await start_gateway(shard_tls_cert=str(certs.cert), shard_tls_key=str(certs.key),
                                  hello_timeout_s=HELLO_TIMEOUT_S)
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port, ssl=shard_context(certs.ca),
                                                   server_hostname="127.0.0.1")
    writer.write(b'{"kind":"server.hello","shard":"half')  # the start of a hello, never its end
    await closed_by_gateway(reader)
    await refusal(gateway, "hello_timeout")
    assert gateway.gateway.counts.refusals["handshake_timeout"] == 0
    writer.close()


def client_hello(certs: Certs) -> bytes:
    """The first flight of a real TLS client (its ClientHello), made in memory."""
    context = shard_context(certs.ca)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = context.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    with pytest.raises(ssl.SSLWantReadError):
        client.do_handshake()
    return outgoing.read()


async def test_noise_and_truncated_hellos_never_wedge_the_listener(start_gateway, tls_sims, certs, unique):
    """Fuzzed openings (seeded: the same bytes every run): each connection ends, none is held,
    and a good shard connects after them all."""
    gateway = await start_gateway(shard_tls_cert=str(certs.cert), shard_tls_key=str(certs.key),
                                  hello_timeout_s=HELLO_TIMEOUT_S)
    draw = random.Random(37)
    hello = client_hello(certs)
    openings = [bytes(draw.randrange(256) for _ in range(draw.randrange(1, 4096))) for _ in range(20)]
    openings += [hello[:cut] for cut in (1, 5, 6, 40, len(hello) - 1)]
    openings += [b"\x16\x03\x01\xff\xff" + bytes(64), b"GET / HTTP/1.1\r\n\r\n", hello + bytes(2000)]

    tasks_before = len(asyncio.all_tasks())

    async def one(data: bytes) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        try:
            writer.write(data)
            if draw.random() < 0.5:
                writer.write_eof()  # half the openings end their side at once
            await closed_by_gateway(reader)
        finally:
            writer.close()

    await asyncio.gather(*(one(data) for data in openings))
    await wait_until(lambda: sum(gateway.gateway.counts.refusals.values()) == len(openings)
                     and gateway.gateway.connections.opening == 0, 5 * HELLO_TIMEOUT_S)
    # Nothing held: every connection's task (the listener's callback) has ended.
    await wait_until(lambda: len(asyncio.all_tasks()) <= tasks_before, 5 * HELLO_TIMEOUT_S)
    good = await dial(gateway, tls_sims, f"s{unique}", shard_context(certs.ca))
    await wait_until(lambda: good.shard in gateway.gateway.links)


async def test_a_renewed_certificate_is_served_without_a_restart(start_gateway, tls_sims, certs, unique,
                                                                 monkeypatch):
    gateway = await start_gateway(shard_tls_cert=str(certs.cert), shard_tls_key=str(certs.key))
    first = await dial(gateway, tls_sims, f"a{unique}", shard_context(certs.ca))
    await wait_until(lambda: first.shard in gateway.gateway.links)

    # Renewed by another CA, so which one is served shows: on SIGHUP (reload_tls) …
    renewed = trustme.CA()
    write_leaf(renewed.issue_cert("127.0.0.1"), certs)
    assert gateway.gateway.reload_tls()
    second = await dial(gateway, tls_sims, f"b{unique}", shard_context(renewed))
    await wait_until(lambda: second.shard in gateway.gateway.links)
    assert first.connected  # the open link keeps its session

    # … and when the files change (checked at each new connection; every time here).
    monkeypatch.setattr(shared_tls, "RECHECK_S", 0.0)
    again = trustme.CA()
    write_leaf(again.issue_cert("127.0.0.1"), certs)
    third = await dial(gateway, tls_sims, f"c{unique}", shard_context(again))
    await wait_until(lambda: third.shard in gateway.gateway.links)

    # A key that does not match its certificate (half-way through a rotation) keeps the last good one.
    certs.key.write_bytes(trustme.CA().issue_cert("127.0.0.1").private_key_pem.bytes())
    assert not gateway.gateway.reload_tls()
    fourth = await dial(gateway, tls_sims, f"d{unique}", shard_context(again))
    await wait_until(lambda: fourth.shard in gateway.gateway.links)


def write_leaf(leaf: trustme.LeafCert, certs: Certs) -> None:
    certs.cert.write_bytes(b"".join(pem.bytes() for pem in leaf.cert_chain_pems))
    certs.key.write_bytes(leaf.private_key_pem.bytes())


def test_a_certificate_without_its_key_is_a_settings_error():
    from pydantic import ValidationError

    from services.gateway.settings import GatewaySettings

    with pytest.raises(ValidationError, match="go together"):
        GatewaySettings(shard_tls_cert="/some/cert.pem")
    with pytest.raises(ValidationError, match="needs the listener's own"):
        GatewaySettings(shard_tls_ca="/some/ca.pem")


# --- the token on the wire ---------------------------------------------------------------------

class RecordingProxy:
    """A TCP proxy between shard and gateway keeping every byte that crosses it, both ways:
    what anyone on the path would capture."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.recorded = bytearray()
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    self.recorded += data
                    dst.write(data)
                    await dst.drain()
            except ConnectionError:
                pass
            finally:
                dst.close()

        both = [asyncio.create_task(pump(reader, up_writer)), asyncio.create_task(pump(up_reader, writer))]
        self.tasks.update(both)
        await asyncio.gather(*both, return_exceptions=True)

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


@pytest.mark.parametrize("over_tls", [True, False], ids=["tls", "plain"])
async def test_the_token_crosses_a_tls_link_encrypted_and_a_plain_one_in_the_clear(
        start_gateway, certs, unique, over_tls, nc):
    options = {"shard_tls_cert": str(certs.cert), "shard_tls_key": str(certs.key)} if over_tls else {}
    gateway = await start_gateway(**options)
    proxy = RecordingProxy(gateway.port)
    port = await proxy.start()
    sim = ShardSimulator("127.0.0.1", port, f"s{unique}", TOKEN, tls=shard_context(certs.ca) if over_tls else None)
    try:
        await sim.connect()
        await wait_until(lambda: sim.shard in gateway.gateway.links)
        await sim.send("player.login", name="the-player-name")
        await stored_frames(nc, sim.shard, 2)
        assert (await ask(nc, sim.shard, "world.save", {}))["status"] == 200
    finally:
        await sim.close()
        await proxy.stop()
    recorded = bytes(proxy.recorded)
    assert len(recorded) > 300  # the hello, a frame, its ack, a command and its answer crossed
    for secret in (TOKEN.encode(), b"the-player-name", b"server.hello", b"world.save"):
        assert (secret in recorded) is not over_tls, secret


def test_on_uvloop_a_clienthello_sent_at_once_reaches_the_handshake(nats_url, certs, unique):
    """The service runs on uvloop, which starts reading a connection as soon as it is accepted:
    a ClientHello sent with the connect (a shard dialling from the same event loop: always
    before the gateway's handler runs) must still reach the handshake (docs/adr/0012)."""
    import nats as nats_py
    import uvloop

    from services.gateway.gateway import serve
    from services.gateway.settings import GatewaySettings

    async def scenario() -> None:
        settings = GatewaySettings(nats_url=nats_url, shard_token=TOKEN, shard_host="127.0.0.1", shard_port=0,
                                   shard_tls_cert=str(certs.cert), shard_tls_key=str(certs.key))
        nc = await nats_py.connect(nats_url, connect_timeout=5)
        try:
            async with serve(nc, settings) as serving:
                assert serving.addr is not None
                sim = ShardSimulator("127.0.0.1", serving.addr[1], f"u{unique}", TOKEN, tls=shard_context(certs.ca))
                try:
                    await sim.connect()
                    async with asyncio.timeout(5):
                        while sim.shard not in serving.gateway.links:
                            await asyncio.sleep(0.01)
                    assert not any(serving.gateway.counts.refusals.values())
                finally:
                    await sim.close()
        finally:
            await nc.close()

    uvloop.run(scenario())
