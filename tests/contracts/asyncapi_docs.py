"""Reading a service's AsyncAPI document (generated from its handlers by FastStream: ``make
docs`` commits them to docs/asyncapi/) for the one channel serving a subject and the schema of
the payload its handler takes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[2]


def committed(service: str) -> dict[str, Any]:
    """The committed AsyncAPI document of ``service`` (tests/system/test_asyncapi.py keeps it current)."""
    document: dict[str, Any] = json.loads((ROOT / "docs" / "asyncapi" / f"{service}.json").read_text())
    return document


def served(document: dict[str, Any], subject: str) -> tuple[dict[str, Any], str]:
    """(the one channel of ``document`` serving ``subject``, the name of its payload's schema);
    fails when the subject is served by no channel or by more than one, or with more than one message."""
    channels = [ch for ch in document["channels"].values() if ch.get("address") == subject]
    assert len(channels) == 1, f"{subject} is not served exactly once"
    [ref] = channels[0]["messages"].values()
    message = document["components"]["messages"][unquote(ref["$ref"].rsplit("/", 1)[1])]
    return channels[0], message["payload"]["$ref"].rsplit("/", 1)[1]
