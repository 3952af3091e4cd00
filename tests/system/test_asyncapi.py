"""Every subject a service serves is documented with its payload: the AsyncAPI documents
FastStream generates from the code (``make docs``) are committed and kept current."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("gateway", "ledger", "cleanup", "installer")


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
def test_every_documented_subject_has_a_payload_schema(service):
    document = json.loads((ROOT / "docs" / "asyncapi" / f"{service}.json").read_text())
    messages = document["components"]["messages"]
    assert document["channels"], f"{service} documents no subject"
    for name, channel in document["channels"].items():
        for ref in channel["messages"].values():
            message = messages[unquote(ref["$ref"].rsplit("/", 1)[1])]
            assert "payload" in message, f"{name} has no payload schema"
