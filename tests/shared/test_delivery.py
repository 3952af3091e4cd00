"""A service acts only on messages sent to its subjects directly (shared/delivery.py): the pure
rule, and every FastStream subscriber of a ``make_broker`` broker on a real nats-server, where
a JetStream push consumer delivers a stream's messages to the service's own subject (its queue
group too), its heartbeats arrive on that very subject, and a request names a ``$KV`` reply."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from faststream import Path

from shared.broker import make_app, make_broker
from shared.delivery import is_direct, subject_matches, why_not_direct
from shared.settings import CommonSettings

# --- the rule -------------------------------------------------------------------------------


@pytest.mark.parametrize(("subject", "pattern", "matches"), [
    ("ledger.sweep.claim", "ledger.sweep.claim", True),
    ("ledger.sweep.claim", "ledger.sweep.*", True),
    ("ledger.sweep.claim", "ledger.>", True),
    ("ledger.sweep.claim", ">", True),
    ("shard.uo1.cmd.world.spawn", "shard.uo1.cmd.>", True),
    ("shard.uo1.board.guilds", "shard.*.board.*", True),
    ("$KV.BOARD_NEWS.uo1.n1.item", "ledger.sweep.claim", False),
    ("$KV.BOARD_NEWS.uo1.n1.item", "shard.*.news.add", False),
    ("ledger.sweep", "ledger.sweep.*", False),           # * is exactly one token
    ("ledger.sweep.claim.x", "ledger.sweep.*", False),
    ("ledger", "ledger.>", False),                       # > is one token or more
    ("shard.uo1.cmd", "shard.uo1.cmd.>", False),
    ("shard.uo2.cmd.x", "shard.uo1.cmd.>", False),
    ("ledger.sweep.claimed", "ledger.sweep.claim", False),  # whole tokens, not prefixes
    ("ledger.sweep.clai", "ledger.sweep.claim", False),
    ("ledger..claim", "ledger.*.claim", False),          # empty tokens match nothing
    ("ledger.sweep.", "ledger.sweep.*", False),
    ("", "ledger.>", False),
    ("ledger.sweep.claim", "", False),
    ("a.b", "a.>.b", False),                             # > only at the end
])
def test_subjects_match_as_nats_matches_them(subject, pattern, matches):
    assert subject_matches(subject, pattern) is matches


def test_a_request_sent_to_the_subject_is_direct():
    assert is_direct("ledger.sweep.claim", "ledger.sweep.claim", "_INBOX_cleanup.abc.1")
    assert is_direct("ledger.expired.events", "ledger.expired.*", "_INBOX_module-events.x")
    assert is_direct("shard.uo1.cmd.item.catalog", "shard.uo1.cmd.>", "_INBOX_website.y", {"X": "1"})
    assert is_direct("shardbus.ping", "shardbus.ping", None)  # a plain publish, no reply
    assert why_not_direct("ledger.sweep.claim", "ledger.sweep.claim", "_INBOX_x.1") == ""


def test_a_jetstream_delivery_keeps_its_stream_subject_and_is_refused():
    # What the ledger receives when a push consumer on KV_BOARD_NEWS delivers to ledger.sweep.claim.
    ack = "$JS.ACK.KV_BOARD_NEWS.forge.1.1.1.1796090638966917110.0"
    assert not is_direct("$KV.BOARD_NEWS.uo1.n1.item", "ledger.sweep.claim", ack)
    assert "stream subject" in why_not_direct("$KV.BOARD_NEWS.uo1.n1.item", "ledger.sweep.claim", ack)


def test_a_jetstream_acknowledgement_reply_is_refused_even_on_a_matching_subject():
    # A stream whose subjects overlap a service's (a consumer on a stream of ledger.> subjects).
    ack = "$JS.ACK.ANY.c.1.5.5.1.0"
    assert not is_direct("ledger.sweep.claim", "ledger.sweep.claim", ack)
    assert "acknowledgement" in why_not_direct("ledger.sweep.claim", "ledger.sweep.claim", ack)


@pytest.mark.parametrize("reply", ["$KV.BOARD_GUILDS.uo1.forged.guild", "$JS.FC.KV_BOARD_NEWS.c.x",
                                   "$JS.API.STREAM.PURGE.SHARD_FRAMES", "$SYS.REQ.SERVER.PING"])
def test_a_reply_to_a_system_subject_is_refused(reply):
    """Answering it would publish, with the service's ``allow_responses``, wherever it points:
    a board entry written for the asker, an acknowledgement, a JetStream API call."""
    assert not is_direct("ledger.console", "ledger.console", reply)
    assert why_not_direct("ledger.console", "ledger.console", reply)


def test_a_jetstream_status_message_on_the_subject_itself_is_refused():
    """A push consumer's idle heartbeat (and flow-control request) arrives on the deliver
    subject itself, with a Status header: it matches the pattern, yet nobody sent it."""
    heartbeat = {"Status": "100", "Description": "Idle Heartbeat"}
    assert not is_direct("shardbus.ping", "shardbus.ping", "", heartbeat)
    assert not is_direct("shardbus.ping", "shardbus.ping", "$JS.FC.S.c.x",
                         {"Status": "100", "Description": "FlowControl Request"})
    assert "status" in why_not_direct("shardbus.ping", "shardbus.ping", "", heartbeat)


# --- every FastStream subscriber of a service broker ---------------------------------------

class Service:
    """A broker made by ``make_broker`` with a literal queue subscriber, a concurrent one, a
    path-parameter one and a plain one, recording what each handler was given."""

    def __init__(self, unique: str) -> None:
        self.unique = unique
        self.handled: list[tuple[str, Any]] = []

    def subject(self, name: str) -> str:
        return f"svc{self.unique}.{name}"


@pytest.fixture
async def service(nats_url, unique):
    svc = Service(unique)
    broker = make_broker(CommonSettings(nats_url=nats_url), "svc")
    app = make_app(broker, "svc")

    @broker.subscriber(svc.subject("claim"), queue="svc")
    async def claim(body: dict) -> dict:
        svc.handled.append(("claim", body))
        return {"status": 200, "claimed": body}

    @broker.subscriber(svc.subject("reverted"), queue="svc", max_workers=4)
    async def reverted(body: dict) -> dict:
        svc.handled.append(("reverted", body))
        return {"status": 200}

    @broker.subscriber(svc.subject("expired.{module}"), queue="svc")
    async def expired(body: dict, module: str = Path()) -> dict:
        svc.handled.append(("expired", module))
        return {"status": 200, "module": module}

    @broker.subscriber(svc.subject("ping"))  # no queue group, as shardbus.ping
    async def ping() -> dict:
        svc.handled.append(("ping", None))
        return {"status": 200}

    async with app:
        yield svc


async def _stream_with(nc, unique: str, body: dict) -> str:
    """A stream holding one message with ``body`` (the website's news item, in the attack)."""
    name = f"FORGE_{unique}"
    await nc.jetstream().add_stream(name=name, subjects=[f"forge{unique}.>"])
    await nc.jetstream().publish(f"forge{unique}.n1", json.dumps(body).encode())
    return name


async def _push_consumer(nc, stream: str, name: str, deliver_to: str, group: str | None = None,
                         **extra: Any) -> None:
    config = {"name": name, "deliver_subject": deliver_to, "ack_policy": "explicit",
              "deliver_policy": "all", **extra}
    if group:
        config["deliver_group"] = group
    reply = json.loads((await nc.request(f"$JS.API.CONSUMER.CREATE.{stream}.{name}",
                                         json.dumps({"stream_name": stream, "config": config}).encode(),
                                         timeout=5)).data)
    assert "error" not in reply, reply


async def test_direct_requests_are_handled(service, nc):
    for subject, body in ((service.subject("claim"), {"runId": "r"}), (service.subject("reverted"), {}),
                          (service.subject("expired.events"), {})):
        reply = json.loads((await nc.request(subject, json.dumps(body).encode(), timeout=5)).data)
        assert reply["status"] == 200, subject
    assert json.loads((await nc.request(service.subject("ping"), b"", timeout=5)).data)["status"] == 200
    assert [name for name, _ in service.handled] == ["claim", "reverted", "expired", "ping"]
    assert service.handled[2] == ("expired", "events")


async def test_a_push_consumer_delivering_to_a_queue_subscription_is_refused(service, nc, unique):
    stream = await _stream_with(nc, unique, {"runId": "forged", "resourceId": 1})
    await _push_consumer(nc, stream, "claim", service.subject("claim"), group="svc")
    await _push_consumer(nc, stream, "reverted", service.subject("reverted"), group="svc")
    # (nats-server delivers a push consumer only to subscriptions on its literal deliver
    # subject, so a wildcard subscription such as expired.* is not reached this way.)
    await asyncio.sleep(1.0)
    assert service.handled == []
    for consumer in ("claim", "reverted"):  # delivered, never acknowledged
        info = await nc.jetstream().consumer_info(stream, consumer)
        assert info.delivered.stream_seq == 1 and info.ack_floor.stream_seq == 0, consumer
    assert (json.loads((await nc.request(service.subject("claim"), b'{"runId":"real"}', timeout=5)).data)
            == {"status": 200, "claimed": {"runId": "real"}})  # and it still serves
    assert service.handled == [("claim", {"runId": "real"})]


async def test_a_push_consumers_heartbeats_on_the_subject_itself_are_refused(service, nc, unique):
    stream = await _stream_with(nc, unique, {})
    await nc.jetstream().purge_stream(stream)  # idle: heartbeats only
    await _push_consumer(nc, stream, "beat", service.subject("ping"), idle_heartbeat=100_000_000,
                         flow_control=True, ack_policy="none")
    await asyncio.sleep(1.0)
    assert service.handled == []


async def test_a_request_whose_reply_is_a_system_subject_is_not_answered(service, nc, unique):
    """Answered, the reply would be the service writing a key-value entry for the asker."""
    kv = await nc.jetstream().create_key_value(bucket=f"FORGE_{unique}")
    for name in ("claim", "reverted", "expired.events", "ping"):
        await nc.publish(service.subject(name), b'{"runId":"r"}', reply=f"$KV.FORGE_{unique}.forged")
    await nc.flush()
    await asyncio.sleep(0.5)
    assert service.handled == []
    assert (await kv.status()).values == 0
