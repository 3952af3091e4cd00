"""``shardbus module install`` shows the install's progress from ``installer.progress.<requestId>``:
a tqdm bar when stderr is a terminal, one plain line per stage when it is not, nothing with
``--quiet``; an event that is not what the installer sends is ignored."""

from __future__ import annotations

import asyncio
import fcntl
import io
import json
import os
import pty
import struct
import subprocess
import sys
import termios
import threading

from services.installer.commands import Progress
from tests.installer.conftest import service_settings
from tests.installer.releases import module_tar

EVENTS = [
    {"stage": "manifest", "done": 0, "total": None},
    {"stage": "download", "done": 0, "total": 2_000_000},
    {"stage": "download", "done": 1_500_000, "total": 2_000_000},
    {"stage": "download", "done": 200_000, "total": 2_000_000},  # retried from the start
    {"stage": "download", "done": 2_000_000, "total": 2_000_000},
    {"stage": "inspect", "done": 2_000_000, "total": 2_000_000},
    {"stage": "unpack", "done": 2_000_000, "total": 2_000_000},
    {"stage": "done", "done": 2_000_000, "total": 2_000_000},
]

HOSTILE = [b"not json", b"[1, 2]", b'"download"', b"{}", b'{"stage": "explode"}', b'{"stage": ["download"]}',
           b'{"stage": "download", "done": "lots", "total": -5}', b'{"stage": "download", "done": true}',
           b'{"stage": "download", "done": 1e400, "total": 1e400}', b"\xff\xfe", b"[" * 100_000]


def _feed(progress: Progress) -> None:
    for n, event in enumerate(EVENTS):
        progress.event(json.dumps({"requestId": "r1", **event}).encode())
        progress.event(HOSTILE[n % len(HOSTILE)])
    for junk in HOSTILE:
        progress.event(junk)
    progress.close()


def test_the_bar_is_drawn_from_the_download_events():
    out = io.StringIO()
    _feed(Progress(out, bar=True))
    lines = out.getvalue().split("\n")
    assert lines[0] == "fetching the manifest" and lines[-3:] == ["checking the archive", "unpacking", ""]
    bar = lines[1].split("\r")
    assert bar[-1].startswith("download: 100%") and "2.00M/2.00M" in bar[-1], bar
    assert len(lines) == 5  # one bar, closed once: nothing after the install moved on redraws it


def test_without_a_terminal_each_stage_is_one_plain_line():
    out = io.StringIO()
    _feed(Progress(out, bar=False))
    assert out.getvalue().splitlines() == ["fetching the manifest", "downloading (2.0 MB)", "checking the archive",
                                           "unpacking"]


def _in_a_terminal(nats_url: str, *args: str) -> tuple[int, str, str]:
    """Run ``shardbus module …`` with stderr on a pseudo-terminal; (exit code, stdout, terminal)."""
    master, slave = pty.openpty()
    # A pty starts 0 x 0, which tqdm would take as no room for a bar.
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    seen = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the child closed its end
                return
            if not chunk:
                return
            seen.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    env = {**os.environ, "SHARDBUS_NATS_URL": nats_url}
    try:
        done = subprocess.run([sys.executable, "-m", "shardbus", "module", *args], env=env, stdout=subprocess.PIPE,
                              stderr=slave, stdin=subprocess.DEVNULL, text=True, timeout=60)
    finally:
        os.close(slave)
    reader.join(10)
    os.close(master)
    return done.returncode, done.stdout, seen.decode(errors="replace")


async def test_a_terminal_sees_the_bar_and_the_result_still_prints(services, settings, releases, nats_url, unique):
    services.start("installer", **service_settings(settings))
    artifact = module_tar("uo-events", "1.4.0", {"big.bin": os.urandom(2 * 1024 * 1024)})
    url = releases.release(f"/{unique}", "uo-events", "1.4.0", artifact)

    code, stdout, terminal = await asyncio.to_thread(_in_a_terminal, nats_url, "install", url)

    assert code == 0, terminal
    assert stdout.strip() == "installed uo-events 1.4.0"
    assert "download: 100%" in terminal and "\r" in terminal, terminal  # tqdm redraws its line
    assert terminal.startswith("fetching the manifest") and "downloading (" not in terminal


async def test_quiet_shows_no_progress(services, settings, releases, nats_url, unique):
    services.start("installer", **service_settings(settings))
    url = releases.release(f"/{unique}", "uo-events", "1.4.0")
    env = {**os.environ, "SHARDBUS_NATS_URL": nats_url}
    done = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "shardbus", "module", "install", url,
                                                    "--quiet"], env=env, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, "installed uo-events 1.4.0", "")
