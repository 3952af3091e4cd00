"""Every subject a service serves is documented with its payload: the AsyncAPI documents
FastStream generates from the code (``make docs``) are committed and kept current."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest

from shardbus import registry
from shardbus.asyncapi_docs import stable_text

ROOT = Path(__file__).resolve().parents[2]
SERVICES = tuple(service.name for service in registry.SERVICES if service.asyncapi)


def _generate(service: str, out: Path) -> dict:
    faststream = Path(sys.executable).parent / "faststream"
    subprocess.run([str(faststream), "docs", "gen", "--factory", f"services.{service}.app:create_app",
                    "--out", str(out)], check=True, capture_output=True, timeout=60, cwd=ROOT)
    return json.loads(out.read_text())


@pytest.mark.parametrize("service", SERVICES)
def test_the_committed_asyncapi_document_matches_the_code(service, tmp_path):
    generated = _generate(service, tmp_path / f"{service}.json")
    committed = json.loads((ROOT / "docs" / "asyncapi" / f"{service}.json").read_text())
    assert sorted(generated["channels"]) == sorted(committed["channels"]), "run `make docs`"
    assert generated["components"] == committed["components"], "run `make docs`"


@pytest.mark.parametrize("service", SERVICES)
def test_the_committed_asyncapi_document_is_written_in_its_one_stable_form(service):
    path = ROOT / "docs" / "asyncapi" / f"{service}.json"
    text = path.read_text()
    assert text == stable_text(json.loads(text)), "run `make docs`: it writes keys sorted"


@pytest.mark.parametrize("service", SERVICES)
def test_every_documented_subject_has_a_payload_schema(service):
    document = json.loads((ROOT / "docs" / "asyncapi" / f"{service}.json").read_text())
    messages = document["components"]["messages"]
    assert document["channels"], f"{service} documents no subject"
    for name, channel in document["channels"].items():
        for ref in channel["messages"].values():
            message = messages[unquote(ref["$ref"].rsplit("/", 1)[1])]
            assert "payload" in message, f"{name} has no payload schema"


GATEWAY_SHARD_PLANE = {
    # address → (operation action, has a reply)
    "shard.{shard}.frame.{kind}": ("send", False),
    "shard.{shard}.deadletter": ("send", False),
    "shard.{shard}.cmd.{verb}": ("receive", True),
    "shard.{shard}.board.{name}": ("receive", True),
    "shard.{shard}.news.add": ("receive", True),
}
"""The subjects websites use, as the gateway's document must list them."""


def test_the_gateway_document_lists_the_subjects_websites_use():
    document = json.loads((ROOT / "docs" / "asyncapi" / "gateway.json").read_text())
    channels = document["channels"]
    by_address = {channel.get("address"): key for key, channel in channels.items()}
    assert GATEWAY_SHARD_PLANE.keys() <= by_address.keys()
    for address, (action, has_reply) in GATEWAY_SHARD_PLANE.items():
        key = by_address[address]
        [operation] = [op for op in document["operations"].values()
                       if unquote(op["channel"]["$ref"]) == f"#/channels/{key}"]
        assert operation["action"] == action, address
        assert ("reply" in operation) == has_reply, address
        if has_reply:  # the reply's channel has no address (the request's reply subject) and a payload
            reply_key = unquote(operation["reply"]["channel"]["$ref"]).rsplit("/", 1)[1]
            assert "address" not in channels[reply_key]
            [ref] = channels[reply_key]["messages"].values()
            message = document["components"]["messages"][unquote(ref["$ref"]).rsplit("/", 1)[1]]
            assert message["payload"]["$ref"].startswith("#/components/schemas/")
    schemas = document["components"]["schemas"]
    assert {"Frame", "DeadLetter", "CommandRequest", "CommandReply", "ShardAnswer", "BoardReply",
            "NewsItem", "NewsReply"} <= schemas.keys()


def test_documenting_the_shard_plane_subscribes_to_nothing():
    """The shard-plane subjects are declared on a broker that is only in the document: the
    gateway's own broker subscribes to what it did before (``links.py`` subscribes to a shard's
    commands only while it is connected; ``board_store.py`` to board reads and news)."""
    from services.gateway.app import create_app

    app = create_app()
    [broker] = app.brokers
    subscribed = sorted(sub.subject.template for sub in broker.subscribers)
    assert subscribed == ["gateway.health", "gateway.status", "shardbus.ping"]
    assert list(broker.publishers) == []
