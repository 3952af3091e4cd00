"""Every message payload the AsyncAPI documents (docs/asyncapi/) give is a model of
shared/contracts/, by name: what a service takes and answers is written once, where its clients
read it (docs/contracts.md). The payloads that are not yet are listed below, each with why, so
that no new one slips in (issue 38, item 4)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from urllib.parse import unquote

from pydantic import BaseModel

from shared.contracts import cleanup, gateway, installer, ledger

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted((ROOT / "docs" / "asyncapi").glob("*.json"))

NOT_YET = {
    # A handler that reads no body: FastStream documents its payload as null.
    "EmptyPayload": {"shardbus.ping", "cleanup.health", "gateway.health", "gateway.status", "installer.health",
                     "installer.list", "ledger.health", "shard.{shard}.board.{name}"},
    # The ledger reads an expiry leniently (a malformed one answers {expired: 0}): its handler
    # takes any body, so FastStream documents no schema (the contract's is ledger.Expired).
    "Expired:Message:Payload": {"ledger.expired.{module}"},
}


def _contract_names() -> set[str]:
    """Each contracts model's schema name: its title when it sets one, else its class name."""
    names = set()
    for module in (cleanup, gateway, installer, ledger):
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, BaseModel) and value.__module__ == module.__name__:
                names.add(value.model_config.get("title") or name)
    return names


def _payloads() -> list[tuple[str, str, str]]:
    """(document, the message's channel address, its payload's schema name) for every message."""
    found = []
    for path in DOCUMENTS:
        document = json.loads(path.read_text())
        messages = document["components"]["messages"]
        for channel in document["channels"].values():
            for reference in channel["messages"].values():
                message = messages[unquote(reference["$ref"].rsplit("/", 1)[1])]
                # A reply's channel has no address: its description names the request's.
                address = channel.get("address") or channel["description"].split("reply to ", 1)[1].split(",")[0]
                found.append((path.stem, address, message["payload"]["$ref"].rsplit("/", 1)[1]))
    return found


def test_every_payload_is_a_contracts_model_or_a_listed_exception():
    names = _contract_names()
    strays = [(doc, address, payload) for doc, address, payload in _payloads()
              if payload not in names and address not in NOT_YET.get(payload, set())]
    assert strays == []


def test_the_exceptions_are_still_there():
    # An exception fixed is taken off the list (the list only shrinks).
    seen = {(payload, address) for _doc, address, payload in _payloads()}
    listed = {(payload, address) for payload, addresses in NOT_YET.items() for address in addresses}
    assert listed <= seen


def test_the_frames_and_dead_letters_are_the_contracts():
    payloads = {(address, payload) for _doc, address, payload in _payloads()}
    assert ("shard.{shard}.frame.{kind}", "Frame") in payloads
    assert ("shard.{shard}.deadletter", "DeadLetter") in payloads
    assert {"Frame", "DeadLetter", "CommandRequest", "CommandReply"} <= _contract_names()
