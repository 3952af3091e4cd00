"""Benchmark: installing a 50 MB and a 200 MB module through the installer service.

For each size, a real ``shardbus run installer`` process installs the module from a local
HTTPS release server (manifest fetch, streamed download with sha256, full inspection,
unpack, atomic swap) and is asked over NATS; the raw baseline, measured in the same run on
the same artifact, is plain ``sha256`` of the file plus ``tarfile`` extraction. The ratio
install/raw is the figure (target <= 1.5). An install also has to move the artifact over
HTTPS, which the raw baseline does not, so a second baseline times that plain transfer
(``raw_download_s_*``) and ``install_ratio_vs_download_plus_raw_*`` compares like with like.
Peak RSS is the installer process's high-water mark (``VmHWM``), target < 150 MB for the 200 MB
artifact.

Run alone: ``python bench/installer.py``; writes ``bench/results/installer.json``.
"""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import io
import json
import os
import shutil
import ssl
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import nats
import trustme

from shardbus import embedded
from shared import subjects
from shared.health import health_file_is_fresh
from tests.installer.releases import ReleaseServer, Route

SIZES_MB = (50, 200)
"""Module sizes installed."""

REPEATS = 5
"""Installs (and raw baselines, interleaved with them) per size; the median is reported."""

FILE_MB = 1
"""Each module is this many MB-sized files of random bytes (what a packed JS/asset bundle looks like
to gzip: barely compressible) plus module.json."""


def build_artifact(path: Path, module_id: str, size_mb: int) -> None:
    """A tar.gz of ``size_mb`` one-MB files and a module.json."""
    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        meta = json.dumps({"id": module_id, "version": "1.0.0"}).encode()
        info = tarfile.TarInfo("module.json")
        info.size = len(meta)
        tar.addfile(info, io.BytesIO(meta))
        for i in range(size_mb // FILE_MB):
            info = tarfile.TarInfo(f"assets/part-{i:04d}.bin")
            info.size = FILE_MB * 1024 * 1024
            tar.addfile(info, io.BytesIO(os.urandom(info.size)))


def raw_install(artifact: Path, dest: Path) -> float:
    """The baseline: sha256 of the file, then tarfile extraction; seconds."""
    started = time.perf_counter()
    digest = hashlib.sha256()
    with open(artifact, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    with tarfile.open(artifact, "r:gz") as tar:
        tar.extractall(dest, filter="data")
    return time.perf_counter() - started


def peak_rss_mb(pid: int) -> float:
    """A process's peak resident memory so far (MB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def start_installer(work: Path, nats_url: str, ca: Path, site: str) -> subprocess.Popen:
    health = work / f"{site}.health"
    env = {**os.environ, "SHARDBUS_NATS_URL": nats_url, "SHARDBUS_HEALTH_FILE": str(health),
           "SHARDBUS_MODULES_DIR": str(work / site), "SHARDBUS_INSTALLER_ALLOWED_HOSTS": "127.0.0.1",
           "SHARDBUS_INSTALLER_CA_FILE": str(ca), "SHARDBUS_INSTALLER_SITE": site, "SHARDBUS_LOG_LEVEL": "WARNING"}
    with open(work / f"{site}.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "shardbus", "run", "installer"], env=env, cwd=ROOT,
                                stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while not health_file_is_fresh(str(health)):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"installer did not start; see {work / f'{site}.log'}")
        time.sleep(0.05)
    return proc


def raw_download(url: str, ca: Path) -> float:
    """A second baseline: the plain HTTPS transfer of the artifact (http.client, bytes dropped)."""
    parts = urlsplit(url)
    started = time.perf_counter()
    connection = http.client.HTTPSConnection(parts.hostname, parts.port,
                                             context=ssl.create_default_context(cafile=str(ca)))
    connection.request("GET", parts.path)
    response = connection.getresponse()
    while response.read(1 << 20):
        pass
    connection.close()
    return time.perf_counter() - started


async def measure(nats_url: str, manifest_url: str, module_id: str, artifact: Path, artifact_url: str,
                  ca: Path, work: Path) -> dict[str, list[float]]:
    """Installs and both baselines, interleaved so each sees the same machine load."""
    nc = await nats.connect(nats_url)
    times: dict[str, list[float]] = {"install": [], "raw": [], "download": []}
    try:
        for i in range(REPEATS):
            started = time.perf_counter()
            reply = json.loads((await nc.request(subjects.INSTALLER_INSTALL,
                                                 json.dumps({"url": manifest_url}).encode(), timeout=600)).data)
            times["install"].append(time.perf_counter() - started)
            assert reply["status"] == 200 and reply["action"] == "installed", reply
            removed = json.loads((await nc.request(subjects.INSTALLER_REMOVE,
                                                   json.dumps({"id": module_id}).encode(), timeout=120)).data)
            assert removed["status"] == 200, removed
            dest = work / f"raw-{module_id}-{i}"
            times["raw"].append(raw_install(artifact, dest))
            shutil.rmtree(dest)
            times["download"].append(await asyncio.to_thread(raw_download, artifact_url, ca))
    finally:
        await nc.close()
    return times


def main() -> int:
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-installer-") as tmp:
        work = Path(tmp)
        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1")
        ca.cert_pem.write_to_path(str(work / "ca.pem"))
        cert.private_key_pem.write_to_path(str(work / "key.pem"))
        cert.cert_chain_pems[0].write_to_path(str(work / "chain.pem"))
        server = embedded.start_nats(work / "nats")
        releases = ReleaseServer(work / "chain.pem", work / "key.pem")
        try:
            for size in SIZES_MB:
                module_id = f"bench-{size}mb"
                artifact = work / f"{module_id}.tar.gz"
                build_artifact(artifact, module_id, size)
                sha = hashlib.sha256(artifact.read_bytes()).hexdigest()
                releases.routes[f"/{module_id}.tar.gz"] = Route(body_file=artifact)
                manifest = {"id": module_id, "version": "1.0.0", "coreApi": "^1.10.0",
                            "artifactUrl": releases.url(f"/{module_id}.tar.gz"), "sha256": sha}
                manifest_url = releases.serve(f"/{module_id}.json", json.dumps(manifest).encode())
                proc = start_installer(work, server.url, work / "ca.pem", f"site-{size}")
                try:
                    times = asyncio.run(measure(server.url, manifest_url, module_id, artifact,
                                                manifest["artifactUrl"], work / "ca.pem", work))
                    rss = peak_rss_mb(proc.pid)
                finally:
                    embedded.stop_process(proc)
                install_s, raw_s, download_s = (statistics.median(times[k]) for k in ("install", "raw", "download"))
                results.update({f"artifact_mb_{size}mb": round(artifact.stat().st_size / 2**20, 1),
                                f"install_s_{size}mb": round(install_s, 3), f"raw_s_{size}mb": round(raw_s, 3),
                                f"install_ratio_{size}mb": round(install_s / raw_s, 2),
                                f"raw_download_s_{size}mb": round(download_s, 3),
                                f"install_ratio_vs_download_plus_raw_{size}mb":
                                    round(install_s / (raw_s + download_s), 2),
                                f"peak_rss_mb_{size}mb": round(rss, 1)})
                print(f"{size} MB: install {install_s:.3f} s, raw sha256+extract {raw_s:.3f} s "
                      f"(ratio {install_s / raw_s:.2f}), raw HTTPS transfer {download_s:.3f} s "
                      f"(install / (transfer + raw) {install_s / (raw_s + download_s):.2f}), "
                      f"installer peak RSS {rss:.1f} MB")
                artifact.unlink()
        finally:
            releases.stop()
            server.stop()
    out = ROOT / "bench" / "results" / "installer.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
