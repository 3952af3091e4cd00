"""The manifest: the core API range against MODULE_API_VERSION 1.11.0 (npm range rules),
and every field checked with a 400 that names it."""

from __future__ import annotations

import json

import pytest

from services.installer.manifest import MODULE_API_VERSION, api_satisfies, parse_manifest
from services.installer.refusals import Refused

GOOD = {"id": "uo-events", "version": "1.4.0", "coreApi": "^1.10.0",
        "artifactUrl": "https://127.0.0.1/a.tar.gz", "sha256": "ab" * 32}


def test_the_core_api_version_is_1_11_0():
    assert MODULE_API_VERSION == "1.11.0"


@pytest.mark.parametrize(("core_api", "accepted"), [
    ("^1.10.0", True), ("^1.11.0", True), ("^1.0.0", True), ("~1.11.0", True), ("1.x", True),
    (">=1.2.0 <2.0.0", True), ("1.11.0", True), ("*", True), ("^0.9.0 || ^1.10.0", True),
    ("^2.0.0", False), ("^1.12.0", False), ("~1.10.0", False), ("<1.11.0", False), ("1.10.x", False),
    ("2.x", False), (">=1.11.1", False),
])
def test_the_core_api_range_is_matched_like_npm(core_api, accepted):
    assert api_satisfies(core_api) is accepted


def test_a_module_needing_another_core_api_is_refused_with_both_versions_named():
    with pytest.raises(Refused) as refused:
        parse_manifest(json.dumps({**GOOD, "coreApi": "^2.0.0"}).encode(), "https://x/m.json")
    assert refused.value.status == 400
    assert "needs core API ^2.0.0" in refused.value.sentence and "offers 1.11.0" in refused.value.sentence


def test_a_good_manifest_parses():
    manifest = parse_manifest(json.dumps({**GOOD, "sha256": "AB" * 32}).encode(), "u")
    assert (manifest.id, manifest.version, manifest.sha256) == ("uo-events", "1.4.0", "ab" * 32)


@pytest.mark.parametrize(("change", "named"), [
    ({"id": "UO Events"}, "id:"), ({"id": "../etc"}, "id:"), ({"id": "uo.events"}, "id:"),
    ({"version": "1.4"}, "version:"), ({"version": "latest"}, "version:"),
    ({"coreApi": "^^1"}, "coreApi:"), ({"sha256": "abc"}, "sha256:"), ({"size": -1}, "size:"),
    ({"id": None}, "id:"), ({"artifactUrl": None}, "artifactUrl:"),
])
def test_a_bad_manifest_field_is_a_400_naming_it(change, named):
    body = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    with pytest.raises(Refused) as refused:
        parse_manifest(json.dumps(body).encode(), "https://x/m.json")
    assert refused.value.status == 400 and named in refused.value.sentence
    assert "https://x/m.json" in refused.value.sentence


@pytest.mark.parametrize("body", [b"", b"not json", b"[1, 2]", b"\xff\xfe"])
def test_a_manifest_that_is_not_a_json_object_is_a_400(body):
    with pytest.raises(Refused) as refused:
        parse_manifest(body, "u")
    assert refused.value.status == 400 and "JSON" in refused.value.sentence
