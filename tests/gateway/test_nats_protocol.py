"""The NATS commands the gateway writes itself (``nats_protocol.py``, ADR 0007): read back by a
real nats-server and a subscriber exactly as ``Client.publish`` would have sent them; what
nats-py would refuse is left to it (None); and the two private nats-py methods the pipeline
relies on still queue bytes for nats-py's flusher."""

from __future__ import annotations

import asyncio

import pytest

from services.gateway.publishing import nats_protocol


async def test_a_frame_and_a_reply_written_by_the_gateway_arrive_as_client_publish_sends_them(nc, unique):
    got: asyncio.Queue = asyncio.Queue()
    await nc.subscribe(f"np.{unique}.>", cb=got.put)
    await nc.flush()
    frame = nats_protocol.hpub(f"np.{unique}.frame", f"np.{unique}.inbox", "s1.seq.7", b'{"kind":"x"}')
    reply = nats_protocol.reply(f"np.{unique}.reply", b'{"status":200}', {"X-Trace": "t 1", "Shardbus-Protocol": "7"},
                                nc.max_payload)
    plain = nats_protocol.reply(f"np.{unique}.plain", b"", None, nc.max_payload)
    assert reply is not None and plain is not None
    await nc._send_command(frame + reply + plain)  # the private path the pipeline takes
    await nc._flush_pending()
    async with asyncio.timeout(5):
        one, two, three = await got.get(), await got.get(), await got.get()
    assert (one.subject, one.reply, one.data, one.headers) == (
        f"np.{unique}.frame", f"np.{unique}.inbox", b'{"kind":"x"}', {"Nats-Msg-Id": "s1.seq.7"})
    assert (two.data, two.headers) == (b'{"status":200}', {"X-Trace": "t 1", "Shardbus-Protocol": "7"})
    assert (three.subject, three.data, three.headers) == (f"np.{unique}.plain", b"", None)


@pytest.mark.parametrize(("subject", "headers", "size"), [
    ("a b", None, 10),  # whitespace in the subject
    ("", None, 10),
    ("_INBOX.x", {"bad key": "v"}, 10),  # a header name nats-py refuses
    ("_INBOX.x", {"K": "v\r\nInjected: 1"}, 10),  # a value that would add a header line
    ("_INBOX.x", None, 2000),  # over max_payload
    ("_INBOX.x", {"K": "v"}, 990),  # headers and body together over max_payload
])
def test_what_nats_py_would_refuse_is_left_to_it(subject, headers, size):
    assert nats_protocol.reply(subject, b"x" * size, headers, max_payload=1000) is None
