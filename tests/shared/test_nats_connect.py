"""NATS connections are named and come back after the server restarts, with back-off."""

from __future__ import annotations

import asyncio
import signal

import pytest

from shardbus import embedded
from shared.broker import make_broker
from shared.nats_connect import BackOff, connect, inbox_prefix
from shared.settings import CommonSettings


def test_back_off_doubles_and_is_capped():
    back_off = BackOff(0.5, 4.0)
    assert [back_off.delay(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_back_off_stays_at_its_cap_after_hours_of_failed_reconnects():
    # 2 ** 1024 overflows a float: nats-py took the OverflowError as a failed attempt and
    # retried at once, spinning for good after about three hours of outage at a 10 s cap.
    back_off = BackOff(0.5, 10.0)
    assert [back_off.delay(n) for n in (1025, 5000, 10**9)] == [10.0, 10.0, 10.0]


def test_back_off_refuses_a_cap_below_the_first_wait():
    with pytest.raises(ValueError, match="first"):
        BackOff(2.0, 1.0)


async def test_a_connection_survives_a_server_restart(tmp_path):
    port = embedded.free_port()
    server = embedded.start_nats(tmp_path / "a", port=port)
    nc = await connect(server.url, "test", first_wait_s=0.1, max_wait_s=0.5)
    try:
        server.stop()
        await asyncio.sleep(0.3)
        assert not nc.is_connected
        server = embedded.start_nats(tmp_path / "b", port=port)
        for _ in range(100):
            if nc.is_connected:
                break
            await asyncio.sleep(0.05)
        assert nc.is_connected
        sub = await nc.subscribe("ping.back")
        await nc.publish("ping.back", b"x")
        assert (await sub.next_msg(timeout=2)).data == b"x"
    finally:
        await nc.close()
        server.stop()


@pytest.mark.parametrize(("servers", "prefix"), [
    ("nats://gateway:pw@nats:4222", "_INBOX_gateway"),
    (["nats://website:pw@n1:4222", "nats://website:pw@n2:4222"], "_INBOX_website"),
    ("nats://127.0.0.1:4222", "_INBOX"),          # no user: NATS's own shared inbox
    ("nats://a.b:pw@nats:4222", "_INBOX"),        # a user that cannot be a subject token
    ("module-events:pw@nats:4222", "_INBOX_module-events"),
])
def test_replies_come_back_under_the_users_own_inbox(servers, prefix):
    assert inbox_prefix(servers) == prefix


async def test_a_service_moves_to_another_listed_server_when_its_own_goes_silent(tmp_path):
    # A server that stops answering without closing the socket (SIGSTOP here; a partition cuts
    # a link the same way) left nats-py "connected" for 120 s x 2 pings (its defaults): the
    # service never moved to the healthy servers listed (issue 36). With the service settings'
    # pings (docs/reliability.md, "A silent NATS link") it is dropped as stale and the other one taken.
    servers = [embedded.start_nats(tmp_path / name) for name in ("a", "b")]
    settings = CommonSettings(nats_url=",".join(s.url for s in servers), reconnect_wait_s=0.1,
                              reconnect_wait_max_s=0.5)
    broker = make_broker(settings, "test")
    stopped = None
    try:
        nc = await broker.connect()
        assert nc.options["ping_interval"] == settings.nats_ping_interval_s
        first = nc.connected_url.port
        stopped = next(s for s in servers if s.port == first)
        stopped.proc.send_signal(signal.SIGSTOP)
        # Waited for with a bound far below what nats-py's defaults needed (240 s): the
        # precondition of the check below, not a timing claim.
        async with asyncio.timeout(60):
            while not (nc.is_connected and nc.connected_url.port != first):
                await asyncio.sleep(0.1)
        sub = await nc.subscribe("moved.on")
        await nc.publish("moved.on", b"x")
        assert (await sub.next_msg(timeout=5)).data == b"x"
    finally:
        if stopped is not None:
            stopped.proc.send_signal(signal.SIGCONT)
        await broker.stop()
        for server in servers:
            server.stop()
