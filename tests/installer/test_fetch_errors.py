"""Where a release comes from and what its host answers: https on allowed hosts only, 4xx
is the caller's 400 at once, unreachable hosts and 5xx are retried and then a 502, and
every refusal quotes the upstream body."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from services.installer.download import Fetcher
from services.installer.refusals import Refused
from tests.installer.conftest import snapshot
from tests.installer.releases import module_tar


async def _refusal(site, url: str) -> Refused:
    with pytest.raises(Refused) as refused:
        await site.install(url)
    return refused.value


async def test_a_4xx_is_a_400_with_the_upstream_body_and_is_not_retried(site, releases, unique):
    url = releases.serve(f"/{unique}/gone.json", b"this release was withdrawn", status=410)
    refused = await _refusal(site, url)
    assert refused.status == 400 and "answered 410" in refused.sentence
    assert "this release was withdrawn" in refused.sentence
    assert releases.hits[f"/{unique}/gone.json"] == 1


async def test_an_html_error_page_is_quoted_by_its_title_on_one_line(site, releases, unique):
    page = (b"<!DOCTYPE html>\n<html>\n<head>\n  <title>404 Not Found - Release Host</title>\n"
            b"  <style>body { color: red }</style>\n</head>\n<body>\n  <h1>Not Found</h1>\n"
            b"  <p>The page you asked for\n  is not here.</p>\n</body>\n</html>\n")
    url = releases.serve(f"/{unique}/missing.json", page, status=404)
    refused = await _refusal(site, url)
    assert refused.sentence.endswith("answered 404: 404 Not Found - Release Host")
    assert "\n" not in refused.sentence and "<" not in refused.sentence


async def test_a_5xx_is_retried_then_a_502_with_the_upstream_body(site, releases, unique):
    url = releases.serve(f"/{unique}/broken.json", b"database on fire", status=500)
    refused = await _refusal(site, url)
    assert refused.status == 502 and "answered 500: database on fire" in refused.sentence
    assert "after 3 attempts" in refused.sentence
    assert releases.hits[f"/{unique}/broken.json"] == 3


async def test_a_5xx_that_clears_up_within_the_retries_installs(site, releases, unique):
    url = releases.release(f"/{unique}", "uo-events", "1.4.0")
    releases.routes[f"/{unique}/uo-events-1.4.0.json"].fail_first = 1
    releases.routes[f"/{unique}/uo-events-1.4.0.tar.gz"].fail_first = 2
    assert (await site.install(url))["action"] == "installed"
    assert releases.hits[f"/{unique}/uo-events-1.4.0.tar.gz"] == 3


async def test_an_unreachable_host_is_a_502_after_retries(site):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    refused = await _refusal(site, f"https://127.0.0.1:{port}/m.json")
    assert refused.status == 502 and "unreachable" in refused.sentence and "after 3 attempts" in refused.sentence


async def test_an_artifact_failing_with_5xx_leaves_the_installed_version_in_place(site, releases, unique):
    await site.install(releases.release(f"/{unique}/base", "uo-events", "1.0.0"))
    before = snapshot(Path(site.settings.modules_dir))
    url = releases.release(f"/{unique}", "uo-events", "1.1.0")
    releases.routes[f"/{unique}/uo-events-1.1.0.tar.gz"].fail_first = 10
    refused = await _refusal(site, url)
    assert refused.status == 502 and "release store is warming up" in refused.sentence
    assert snapshot(Path(site.settings.modules_dir)) == before


@pytest.mark.parametrize(("url", "reason"), [
    ("http://127.0.0.1/m.json", "not https"),
    ("ftp://127.0.0.1/m.json", "not https"),
    ("https://localhost/m.json", "not on the installer's allowed hosts"),
    ("https://user:pw@127.0.0.1/m.json", "must not carry credentials"),
    ("http://user:pw@127.0.0.1/m.json", "must not carry credentials"),
    ("https://user:pw@127.0.0.1:99999/m.json", "not a valid URL"),
    ("not a url", "not https"),
])
async def test_a_bad_manifest_url_is_a_400_and_nothing_is_fetched(site, url, reason):
    refused = await _refusal(site, url)
    assert refused.status == 400 and reason in refused.sentence
    assert "pw" not in refused.sentence


async def test_an_artifact_url_off_the_allowlist_is_refused_before_anything_else(site, releases, unique):
    url = releases.serve(f"/{unique}/m.json", (
        b'{"id": "uo-events", "version": "1.0.0", "coreApi": "^1.10.0", "sha256": "' + b"a" * 64 +
        b'", "artifactUrl": "https://evil.example/a.tar.gz"}'))
    refused = await _refusal(site, url)
    assert refused.status == 400 and "evil.example" in refused.sentence and "allowed hosts" in refused.sentence


async def test_an_artifact_over_the_size_cap_is_refused(site, releases, unique):
    big = module_tar("uo-events", "1.0.0", {"big.bin": os.urandom(5 * 1024 * 1024)})
    refused = await _refusal(site, releases.release(f"/{unique}", "uo-events", "1.0.0", big))
    assert refused.status == 400 and "over the cap of 4194304 bytes" in refused.sentence
    assert snapshot(Path(site.settings.modules_dir)) == {}


async def test_a_manifest_declaring_an_oversized_artifact_is_refused_before_downloading(site, releases, unique):
    url = releases.release(f"/{unique}", "uo-events", "1.0.0", size=10 * 1024 * 1024)
    refused = await _refusal(site, url)
    assert refused.status == 400 and "over the cap" in refused.sentence
    assert releases.hits[f"/{unique}/uo-events-1.0.0.tar.gz"] == 0


def test_a_host_that_does_not_answer_in_time_is_a_502(releases, ca_file, unique):
    url = releases.serve(f"/{unique}/slow.json", b"{}")
    releases.routes[f"/{unique}/slow.json"].delay_s = 3.0
    # A deadline the TLS handshake and the request fit in with room to spare on a loaded machine
    # (with 0.2 s a try could end before the server had read its request: one hit, not two).
    fetcher = Fetcher(["127.0.0.1"], ca_file=str(ca_file[0]), timeout_s=1.0, attempts=2, retry_wait_s=0.01)
    with pytest.raises(Refused) as refused:
        fetcher.fetch_manifest(url, 4096)
    assert refused.value.status == 502 and "timed out" in refused.value.sentence
    assert "after 2 attempts" in refused.value.sentence
    assert releases.hits[f"/{unique}/slow.json"] == 2


async def test_an_artifact_cut_short_of_its_content_length_is_fetched_again_and_installed(site, releases, unique):
    url = releases.release(f"/{unique}", "uo-events", "1.4.0")
    artifact = releases.routes[f"/{unique}/uo-events-1.4.0.tar.gz"]
    artifact.cut_first, artifact.cut_at = 1, len(artifact.body) // 2
    assert (await site.install(url))["action"] == "installed"
    assert releases.sent[f"/{unique}/uo-events-1.4.0.tar.gz"] == [len(artifact.body) // 2, len(artifact.body)]


async def test_an_artifact_always_cut_short_is_a_502_saying_where_it_ended_not_a_sha256_mismatch(
        site, releases, unique):
    url = releases.release(f"/{unique}", "uo-events", "1.4.0")
    artifact = releases.routes[f"/{unique}/uo-events-1.4.0.tar.gz"]
    artifact.cut_first, artifact.cut_at = 10, 100
    refused = await _refusal(site, url)
    assert refused.status == 502 and "after 3 attempts" in refused.sentence
    assert f"ended after 100 of its {len(artifact.body)} bytes" in refused.sentence
    assert "sha256" not in refused.sentence
    assert snapshot(Path(site.settings.modules_dir)) == {}


def test_a_manifest_cut_short_is_fetched_again(releases, ca_file, unique):
    manifest = b'{"id": "uo-events", "version": "1.0.0"}'
    url = releases.serve(f"/{unique}/m.json", manifest)
    releases.routes[f"/{unique}/m.json"].cut_first, releases.routes[f"/{unique}/m.json"].cut_at = 1, 10
    fetcher = Fetcher(["127.0.0.1"], ca_file=str(ca_file[0]), timeout_s=5, attempts=2, retry_wait_s=0.01)
    assert fetcher.fetch_manifest(url, 4096) == manifest
    assert releases.sent[f"/{unique}/m.json"] == [10, len(manifest)]


class _Discard:
    """A sink that keeps nothing."""

    def write(self, chunk: bytes) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


TRICKLED = b"{" + b" " * 400 + b"}"
"""A body that takes 8 s a try at a byte per 20 ms, each byte well inside any read timeout."""


@pytest.mark.parametrize("what", ["manifest", "artifact"])
def test_a_host_trickling_a_byte_at_a_time_is_cut_at_the_deadline_of_the_whole_try(
        releases, ca_file, unique, what):
    url = releases.serve(f"/{unique}/{what}", TRICKLED)
    releases.routes[f"/{unique}/{what}"].trickle_s = 0.02
    fetcher = Fetcher(["127.0.0.1"], ca_file=str(ca_file[0]), timeout_s=0.5, attempts=2, retry_wait_s=0.01)
    with pytest.raises(Refused) as refused:
        if what == "manifest":
            fetcher.fetch_manifest(url, 4096)
        else:
            fetcher.fetch_artifact(url, 4096, _Discard)
    assert refused.value.status == 502 and "after 2 attempts" in refused.value.sentence
    assert "timed out: no whole answer within 0.5 s" in refused.value.sentence
    sent = releases.sent[f"/{unique}/{what}"]
    assert len(sent) == 2 and all(n < len(TRICKLED) for n in sent)


def test_a_host_whose_certificate_is_not_trusted_is_a_502_at_once(releases, unique):
    url = releases.serve(f"/{unique}/m.json", b"{}")
    fetcher = Fetcher(["127.0.0.1"], timeout_s=5, attempts=3, retry_wait_s=0.01)  # the test CA not loaded
    with pytest.raises(Refused) as refused:
        fetcher.fetch_manifest(url, 4096)
    assert refused.value.status == 502 and "TLS certificate this installer does not trust" in refused.value.sentence
    assert releases.hits[f"/{unique}/m.json"] == 0


def test_redirects_are_followed_on_allowed_hosts_up_to_five_times(releases, ca_file, unique):
    fetcher = Fetcher(["127.0.0.1"], ca_file=str(ca_file[0]), timeout_s=5, attempts=1, retry_wait_s=0.01)
    releases.serve(f"/{unique}/hop5", b'{"here": true}')
    for hop in range(5):
        releases.serve(f"/{unique}/hop{hop}", b"", status=302 if hop % 2 else 307, location=f"/{unique}/hop{hop + 1}")
    assert fetcher.fetch_manifest(releases.url(f"/{unique}/hop0"), 4096) == b'{"here": true}'
    releases.serve(f"/{unique}/hop5", b"", status=301, location=releases.url(f"/{unique}/hop6"))
    with pytest.raises(Refused) as refused:
        fetcher.fetch_manifest(releases.url(f"/{unique}/hop0"), 4096)
    assert refused.value.status == 400 and "redirected more than 5 times" in refused.value.sentence
    assert releases.hits[f"/{unique}/hop6"] == 0


def test_a_redirect_to_plain_http_is_refused_before_it_is_followed(releases, ca_file, unique):
    fetcher = Fetcher(["127.0.0.1"], ca_file=str(ca_file[0]), timeout_s=5, attempts=1, retry_wait_s=0.01)
    url = releases.serve(f"/{unique}/moved", b"", status=302, location=f"http://{releases.host}/{unique}/m.json")
    with pytest.raises(Refused) as refused:
        fetcher.fetch_manifest(url, 4096)
    assert refused.value.status == 400 and "manifest redirect URL" in refused.value.sentence
    assert "not https" in refused.value.sentence
