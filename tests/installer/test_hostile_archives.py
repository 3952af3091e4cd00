"""The hostile-archive corpus: each artifact is refused with a clear reason, and the volume
(here holding uo-events 1.0.0, so each attempt is an upgrade) stays byte-for-byte as it was,
with nothing written outside it."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path

import pytest

from services.installer import archive
from services.installer.refusals import Refused
from tests.installer.conftest import snapshot
from tests.installer.releases import file_entry, module_json, module_tar, special_entry, tar_gz

MODULE = "uo-events"


def _plain_tar() -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info, data = module_json(MODULE, "1.1.0")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


def _bomb() -> bytes:
    # 40 MB of zeros packs to ~40 kB: a ratio near 1000, far over the cap of 50.
    info = tarfile.TarInfo("lib/zeros.bin")
    info.size = 40 * 1024 * 1024
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        mj, data = module_json(MODULE, "1.1.0")
        mj.size = len(data)
        tar.addfile(mj, io.BytesIO(data))
        tar.addfile(info, io.BytesIO(bytes(info.size)))
    return gzip.compress(raw.getvalue(), compresslevel=9)


CORPUS = [
    ("path traversal", tar_gz([module_json(MODULE, "1.1.0"), file_entry("../evil.txt", b"x")]), "'..'"),
    ("nested traversal", tar_gz([module_json(MODULE, "1.1.0"), file_entry("lib/../../evil.txt", b"x")]),
     "'..'"),
    ("absolute path", tar_gz([module_json(MODULE, "1.1.0"), file_entry("/tmp/evil.txt", b"x")]),
     "absolute path"),
    ("symlink then write-through", tar_gz([module_json(MODULE, "1.1.0"),
                                           special_entry("out", tarfile.SYMTYPE, ".."),
                                           file_entry("out/evil.txt", b"x")]), "a symlink"),
    ("symlink to an absolute path", tar_gz([module_json(MODULE, "1.1.0"),
                                            special_entry("lib/etc", tarfile.SYMTYPE, "/etc")]), "a symlink"),
    ("hard link", tar_gz([module_json(MODULE, "1.1.0"),
                          special_entry("passwd", tarfile.LNKTYPE, "/etc/passwd")]), "a hard link"),
    ("character device", tar_gz([module_json(MODULE, "1.1.0"), special_entry("null", tarfile.CHRTYPE)]),
     "a character device"),
    ("block device", tar_gz([module_json(MODULE, "1.1.0"), special_entry("sda", tarfile.BLKTYPE)]),
     "a block device"),
    ("FIFO", tar_gz([module_json(MODULE, "1.1.0"), special_entry("pipe", tarfile.FIFOTYPE)]), "a FIFO"),
    ("zip bomb", _bomb(), "size bomb"),
    ("truncated gzip", module_tar(MODULE, "1.1.0", {"a.bin": os.urandom(20000)})[:-5000],
     "gzip stream is broken"),
    ("tar that is not gzip", _plain_tar(), "not gzip-compressed"),
    ("gzip that is not a tar", gzip.compress(b"just some text, not a tar archive" * 50),
     "not a tar archive"),
    ("module.json naming another id", module_tar("uo-other", "1.1.0"), "names module 'uo-other'"),
    ("module.json with another version", module_tar(MODULE, "9.9.9"), "says version '9.9.9'"),
    ("no module.json", tar_gz([file_entry("index.js", b"x")]), "no module.json"),
    ("module.json that is not JSON", tar_gz([file_entry("module.json", b"{nope")]), "not JSON"),
    ("too many entries", tar_gz([module_json(MODULE, "1.1.0"),
                                 *(file_entry(f"f{i}.js", b"") for i in range(100))]), "more than 100 entries"),
    ("the same path twice", tar_gz([module_json(MODULE, "1.1.0"), file_entry("a.js", b"1"),
                                    file_entry("a.js", b"2")]), "more than once"),
    ("a file used as a directory", tar_gz([module_json(MODULE, "1.1.0"), file_entry("a", b"1"),
                                           file_entry("a/b", b"2")]), "as a directory"),
]


@pytest.fixture
async def installed_site(site, releases, unique):
    await site.install(releases.release(f"/{unique}/base", MODULE, "1.0.0"))
    return site


def _volume(site) -> Path:
    return Path(site.settings.modules_dir)


@pytest.mark.parametrize(("case", "artifact", "reason"), CORPUS, ids=[c[0] for c in CORPUS])
async def test_a_hostile_artifact_is_refused_and_the_volume_is_untouched(installed_site, releases, unique,
                                                                         tmp_path, case, artifact, reason):
    before, outside = snapshot(_volume(installed_site)), snapshot(tmp_path)
    with pytest.raises(Refused) as refused:
        await installed_site.install(releases.release(f"/{unique}", MODULE, "1.1.0", artifact))
    assert refused.value.status == 400, refused.value.sentence
    assert reason in refused.value.sentence
    assert snapshot(_volume(installed_site)) == before
    assert snapshot(tmp_path) == outside


async def test_a_wrong_hash_is_refused(installed_site, releases, unique):
    before = snapshot(_volume(installed_site))
    with pytest.raises(Refused) as refused:
        await installed_site.install(releases.release(f"/{unique}", MODULE, "1.1.0", sha256="0" * 64))
    assert refused.value.status == 400 and "sha256" in refused.value.sentence
    assert snapshot(_volume(installed_site)) == before


async def test_a_manifest_over_the_size_cap_is_refused_unread(installed_site, releases, unique):
    before = snapshot(_volume(installed_site))
    url = releases.release(f"/{unique}", MODULE, "1.1.0", notes="x" * 5000)
    with pytest.raises(Refused) as refused:
        await installed_site.install(url)
    assert refused.value.status == 400 and "larger than 4096 bytes" in refused.value.sentence
    assert snapshot(_volume(installed_site)) == before


async def test_a_redirect_to_a_host_off_the_allowlist_is_refused(installed_site, releases, unique):
    before = snapshot(_volume(installed_site))
    real = releases.release(f"/{unique}", MODULE, "1.1.0")
    off_list = real.replace("127.0.0.1", "localhost")  # same server, but not an allowed host
    url = releases.serve(f"/{unique}/moved.json", b"", status=302, location=off_list)
    with pytest.raises(Refused) as refused:
        await installed_site.install(url)
    assert refused.value.status == 400 and "not on the installer's allowed hosts" in refused.value.sentence
    assert releases.hits[f"/{unique}/{MODULE}-1.1.0.json"] == 0
    assert snapshot(_volume(installed_site)) == before


async def test_a_symlink_refused_in_one_archive_cannot_be_written_through_by_the_next(
        installed_site, releases, unique, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    first = tar_gz([module_json(MODULE, "1.1.0"), special_entry("lib/data", tarfile.SYMTYPE, str(outside))])
    with pytest.raises(Refused):
        await installed_site.install(releases.release(f"/{unique}/a", MODULE, "1.1.0", first))
    second = tar_gz([module_json(MODULE, "1.2.0"), file_entry("lib/data/evil.txt", b"x")])
    assert (await installed_site.install(releases.release(f"/{unique}/b", MODULE, "1.2.0", second)))["action"] \
        == "upgraded"
    assert list(outside.iterdir()) == []
    written = _volume(installed_site) / MODULE / "lib" / "data"
    assert written.is_dir() and not written.is_symlink() and (written / "evil.txt").read_bytes() == b"x"


async def test_a_symlink_planted_in_the_installed_module_is_not_written_through(
        installed_site, releases, unique, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (_volume(installed_site) / MODULE / "lib" / "data").symlink_to(outside)
    upgrade = tar_gz([module_json(MODULE, "1.1.0"), file_entry("lib/data/evil.txt", b"x")])
    await installed_site.install(releases.release(f"/{unique}", MODULE, "1.1.0", upgrade))
    assert list(outside.iterdir()) == []
    assert (_volume(installed_site) / MODULE / "lib" / "data" / "evil.txt").read_bytes() == b"x"


def test_the_unpacked_size_is_counted_while_reading_not_taken_from_headers(tmp_path):
    # Every tar header here is honest and small; 3 MB of padding hides after the end-of-archive
    # marker. Summing header sizes would pass it; counting what the decompressor produces does not.
    tar = gzip.decompress(module_tar(MODULE, "1.0.0"))
    artifact = tmp_path / "a.tar.gz"
    artifact.write_bytes(gzip.compress(tar + bytes(3 * 1024 * 1024)))
    with pytest.raises(Refused) as refused:
        archive.inspect(artifact, MODULE, "1.0.0", archive.Limits(100, 2 * 1024 * 1024, 10_000))
    assert "more than 2097152 bytes" in refused.value.sentence
    fine = archive.inspect(artifact, MODULE, "1.0.0", archive.Limits(100, 8 * 1024 * 1024, 10_000))
    assert fine.entries == 3 and fine.unpacked_bytes == len(tar) + 3 * 1024 * 1024


def test_unpacking_applies_the_same_checks_as_the_inspection(tmp_path):
    plain_tar = tmp_path / "a.tar"
    plain_tar.write_bytes(gzip.decompress(tar_gz([module_json(MODULE, "1.0.0"), file_entry("../evil.txt", b"x")])))
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(Refused) as refused:
        archive.unpack(plain_tar, dest, archive.Limits(100, 1 << 20, 50))
    assert "'..'" in refused.value.sentence
    assert not (tmp_path / "evil.txt").exists()
    assert set(snapshot(dest)) <= {"module.json"}


def test_the_inspection_keeps_exactly_the_tar_it_read(tmp_path):
    artifact = tmp_path / "a.tar.gz"
    artifact.write_bytes(module_tar(MODULE, "1.0.0"))
    archive.inspect(artifact, MODULE, "1.0.0", archive.Limits(100, 1 << 20, 50), keep_tar=tmp_path / "a.tar")
    assert (tmp_path / "a.tar").read_bytes() == gzip.decompress(artifact.read_bytes())


async def test_oversized_answers_without_a_length_are_cut_off_while_reading(installed_site, releases, unique):
    before = snapshot(_volume(installed_site))
    url = releases.release(f"/{unique}", MODULE, "1.1.0", notes="x" * 5000)
    releases.routes[f"/{unique}/{MODULE}-1.1.0.json"].announce_length = False
    with pytest.raises(Refused) as manifest:
        await installed_site.install(url)
    assert manifest.value.status == 400 and "larger than 4096 bytes" in manifest.value.sentence

    big = module_tar(MODULE, "1.1.0", {"big.bin": os.urandom(5 * 1024 * 1024)})
    url = releases.release(f"/{unique}/big", MODULE, "1.1.0", big)
    releases.routes[f"/{unique}/big/{MODULE}-1.1.0.tar.gz"].announce_length = False
    with pytest.raises(Refused) as artifact:
        await installed_site.install(url)
    assert artifact.value.status == 400 and "over the cap of 4194304 bytes" in artifact.value.sentence
    assert snapshot(_volume(installed_site)) == before
