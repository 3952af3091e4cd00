"""shared/nats_calls.py and shared/errors.py: one request with its failures named, one answer
to "is NATS away?", one root that becomes a reply (ADR 0010), against a real nats-server."""

from __future__ import annotations

import json

import nats
import nats.errors
import nats.js.errors
import pytest

from shared import nats_calls
from shared.errors import ShardbusError
from shared.nats_calls import BadReply, NatsAway, NoAnswer, NoResponders, TooLarge, is_away, json_object


@pytest.mark.parametrize(("exc", "away"), [
    (nats.errors.ConnectionClosedError(), True),
    (nats.errors.OutboundBufferLimitError(), True),
    (nats.errors.NoRespondersError(), True),
    (nats.errors.TimeoutError(), True),
    (nats.js.errors.ServiceUnavailableError(), True),
    (nats.js.errors.APIError(code=503), True),  # JetStream without a meta leader
    (nats.js.errors.APIError(code=400), False),
    (ConnectionRefusedError(), True),
    (nats.errors.MaxPayloadError(), False),
    (nats.errors.BadSubjectError(), False),
    (ValueError("no"), False),
])
def test_is_away_tells_nats_away_from_a_wrong_request(exc, away):
    assert is_away(exc) is away


def test_every_failure_is_a_shardbus_error_that_becomes_its_reply():
    for failure, status in ((NoResponders("s"), 503), (NoAnswer("s"), 504), (NatsAway("s"), 503),
                            (BadReply("s"), 502), (TooLarge(10), 413)):
        assert isinstance(failure, ShardbusError)
        assert failure.as_reply() == {"status": status, "error": str(failure)}
    said = ShardbusError("the sentence", 409, said="what a log says")
    assert (str(said), said.as_reply(extra=1)) == ("what a log says", {"status": 409, "error": "the sentence",
                                                                      "extra": 1})


def test_a_reply_that_is_no_json_object_is_a_bad_reply():
    assert json_object("s", b'{"status": 200}') == {"status": 200}
    for data in (b"not json", b"[1]"):
        with pytest.raises(BadReply):
            json_object("s", data)


async def test_a_request_names_each_way_it_can_fail(nc, unique):
    subject = f"t.calls.{unique}"
    with pytest.raises(NoResponders):
        await nats_calls.request(nc, subject, b"{}", 1.0)
    silent = await nc.subscribe(subject)  # listens, never answers
    with pytest.raises(NoAnswer):
        await nats_calls.request(nc, subject, b"{}", 0.2)
    await silent.unsubscribe()
    with pytest.raises(TooLarge) as large:
        await nats_calls.request(nc, subject, b"x" * (nc.max_payload - 10), 1.0, headers={"h": "v"})
    assert large.value.limit == nc.max_payload - nats_calls.HEADER_ROOM

    async def answer(msg):
        await msg.respond(json.dumps({"status": 200}).encode())

    await nc.subscribe(subject, cb=answer)
    reply = await nats_calls.request(nc, subject, b"{}", 1.0)
    assert json_object(subject, reply.data) == {"status": 200}


async def test_a_request_over_a_closed_connection_is_nats_away(nats_url, unique):
    closed = await nats.connect(nats_url)
    await closed.close()
    with pytest.raises(NatsAway) as away:
        await nats_calls.request(closed, f"t.calls.{unique}", b"{}", 1.0)
    assert away.value.reason == "ConnectionClosedError"
    assert str(away.value) == f"t.calls.{unique}: NATS is unreachable (ConnectionClosedError)"
