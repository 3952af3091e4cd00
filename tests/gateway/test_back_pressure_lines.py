"""Back-pressure pauses a busy shard, it never cuts it (docs/gateway.md, "Wire" and "Back-pressure"):
whole lines waiting behind a full publisher are not "a line longer than the cap", a shard whose
lines the gateway holds is not silent, and a shard that reads slower than the gateway writes to
it is paused, not disconnected. Each test here failed on the gateway before the fix."""

from __future__ import annotations

import asyncio
import json
import socket

import nats

from tests.gateway.conftest import TOKEN, wait_until
from tests.gateway.test_listener import stored_frames
from tests.gateway.test_no_loss import own_nats  # noqa: F401 — a fixture

CAP = 1024
"""The smallest line cap the gateway takes (``SHARDBUS_MAX_LINE_BYTES``)."""


def hello(shard: str) -> bytes:
    return json.dumps({"kind": "server.hello", "shard": shard, "protocol": 7, "token": TOKEN}).encode() + b"\n"


async def test_a_backlog_behind_the_hello_is_paused_not_cut_as_a_long_line(start_gateway, nc, unique):
    """A shard reconnecting after an outage flushes its backlog right behind its hello: many
    short lines, far more bytes than the cap, more frames than the buffer. The gateway used to
    end the link ("line longer than 1024 bytes") the moment the publisher filled, losing every
    line it had read and not taken."""
    running = await start_gateway(max_line_bytes=CAP, buffer_frames=5, publish_window=2)
    shard = f"bp{unique}"
    lines = [b'{"kind":"player.move","i":%d,"pad":"%s"}' % (i, b"p" * 40) for i in range(2000)]
    _reader, writer = await asyncio.open_connection("127.0.0.1", running.port)
    try:
        writer.write(hello(shard) + b"\n".join(lines) + b"\n")  # one write: the reader hands it over
        await writer.drain()
        got = await stored_frames(nc, shard, 1 + len(lines), timeout=60)
        assert [m.data for m in got[1:]] == lines  # every line, once, in order
        link = running.gateway.links.get(shard)
        assert link is not None and not link.closed, link and link.closed_why
        assert running.gateway.counts.reads_paused > 0  # it was paused, and it went on
    finally:
        writer.close()


async def test_a_shard_held_by_back_pressure_is_not_disconnected_as_silent(own_nats, start_gateway,  # noqa: F811
                                                                          unique):
    """NATS away longer than the silence timeout while a shard's lines wait for it: the shard
    is not silent, the gateway is not listening. It used to be cut ("silent for 1.0 s")."""
    servers, restart = own_nats
    running = await start_gateway(nats_servers=servers[0].url, buffer_frames=5, silence_timeout_s=1.0,
                                  ping_every_s=0.25, publish_ack_timeout_s=0.5)
    shard = f"held{unique}"
    _reader, writer = await asyncio.open_connection("127.0.0.1", running.port)
    try:
        writer.write(hello(shard))
        await writer.drain()
        await wait_until(lambda: shard in running.gateway.links)
        link = running.gateway.links[shard]
        servers[0].stop()
        await wait_until(lambda: not running.nc.is_connected, timeout=10)
        lines = [b'{"kind":"player.move","i":%d}' % i for i in range(50)]
        writer.write(b"\n".join(lines) + b"\n")
        await writer.drain()
        await wait_until(lambda: link.held, timeout=10)
        # Held for three silence timeouts, its pings unanswered (nothing reads them here).
        await asyncio.sleep(3.0)
        assert not link.closed, link.closed_why
        restart()
        nc = await nats.connect(servers[-1].url, connect_timeout=5)
        try:
            got = await stored_frames(nc, shard, 1 + len(lines), timeout=60)
        finally:
            await nc.close()
        assert [m.data for m in got[1:]] == lines
    finally:
        writer.close()


async def test_a_shard_reading_slowly_is_paused_not_disconnected(start_gateway, nc, unique, monkeypatch):
    """A shard with ``seq`` gets a ``frame.ack`` per stored frame; one that reads them slower
    than it writes frames has its lines held once the gateway's writes to it pile up (lowered
    here), instead of the link ending at ``UNREAD_MAX``; once it reads, everything is stored
    and acknowledged."""
    from services.gateway.shard_link import line_reader

    monkeypatch.setattr(line_reader, "WRITE_HIGH_WATER", 100_000)  # above the transport's own 64 KiB
    running = await start_gateway(buffer_frames=100_000)  # never full here: only the acks hold it
    shard = f"slow{unique}"
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # buffers little of what it is sent
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", running.port))
    reader, writer = await asyncio.open_connection(sock=sock)
    frames = 20_000
    try:
        writer.write(hello(shard))
        await wait_until(lambda: shard in running.gateway.links)
        link = running.gateway.links[shard]
        link.writer.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)

        async def send_all() -> None:
            for start in range(0, frames, 500):
                writer.write(b"".join(b'{"kind":"player.move","seq":%d}\n' % n for n in range(start, start + 500)))
                await writer.drain()
                await asyncio.sleep(0.02)  # paced: the acks of earlier batches come in between

        sending = asyncio.create_task(send_all())
        # The shard reads nothing yet: the gateway holds its lines once its acks pile up.
        try:
            await wait_until(lambda: link.held and link.unsent_bytes() > 100_000, timeout=30)
        except TimeoutError:
            raise AssertionError(f"never held: held={link.held} unsent={link.unsent_bytes()} "
                                 f"lines={link.line_no}") from None
        assert link.line_no < frames
        acked: set[int] = set()

        async def read_acks() -> None:
            while len(acked) < frames:
                line = await reader.readline()
                assert line, "the gateway closed the link"
                message = json.loads(line)
                if message["kind"] == "frame.ack":
                    acked.add(message["seq"])

        await asyncio.wait_for(asyncio.gather(read_acks(), sending), 60)
        assert acked == set(range(frames)) and not link.closed
        got = await stored_frames(nc, shard, 1 + frames, timeout=30)
        assert [json.loads(m.data)["seq"] for m in got[1:]] == list(range(frames))
    finally:
        writer.close()
