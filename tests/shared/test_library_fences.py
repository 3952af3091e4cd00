"""Where shardbus goes beneath a library's public API, it does so in one fenced module per
library (``shared/natspy_internals.py``, ``shared/faststream_internals.py``,
``shared/asyncio_internals.py``, ``services/web/uvicorn_internals.py``), pinned exactly, and each
fence names what an incompatible release lacks. These tests fail on such a release, and on a
private attribute (or a use beneath the API, :data:`BENEATH`) outside its fence."""

from __future__ import annotations

import asyncio
import re
import tomllib
from pathlib import Path

import nats

from services.web import uvicorn_internals
from shared import asyncio_internals, faststream_internals, natspy_internals

ROOT = Path(__file__).resolve().parents[2]

PRIVATE = re.compile(r"\.(_send_command|_flush_pending|_pending_data_size|_pending|_disconnected_cb|"
                     r"_init_async_reply|_async_reply_prefix|_connection|_buffer|_eof)\b")
"""The private names the fences reach for (``self._…`` of one's own class is not theirs)."""

BENEATH = re.compile(r"\buvicorn\.(protocols|server)\b|\bHttpToolsProtocol\b|\bcapture_signals\b|"
                     r"\bshould_exit\s*=|\bsubscribe\(.*\bfuture=")
"""Uses beneath a public API that are not private names: uvicorn's protocol classes and server
internals, and nats-py's ``subscribe(future=…)`` given something that is not one reply's future."""

FENCES = {"shared/natspy_internals.py", "shared/faststream_internals.py", "shared/asyncio_internals.py",
          "services/web/uvicorn_internals.py"}


def test_the_installed_nats_py_has_what_the_fence_uses() -> None:
    assert natspy_internals.incompatibilities() == []


def test_the_installed_faststream_has_what_the_fence_uses() -> None:
    assert faststream_internals.incompatibilities() == []


async def test_this_python_has_what_the_asyncio_fence_uses() -> None:
    assert asyncio_internals.incompatibilities() == []


def test_the_installed_uvicorn_has_what_the_fence_uses() -> None:
    assert uvicorn_internals.incompatibilities() == []


def test_a_release_without_what_a_fence_uses_is_named() -> None:
    class Bare:
        def jetstream(self) -> object:
            return object()

    found = natspy_internals.incompatibilities(client=Bare, jetstream=object, installed="2.99.0")
    assert "nats-py 2.99.0 is installed; this file was checked against 2.16.0" in found
    assert "Client._send_command is not a coroutine function" in found
    assert "Client()._pending is not a list" in found
    assert "Client()._disconnected_cb is missing" in found
    assert "JetStreamContext._init_async_reply is not a coroutine function" in found
    assert "Client.subscribe takes no future" in found
    assert "Client._process_msg no longer hands each message to a subscription's future" in found
    assert "Subscription(conn, future=…)._future is not the future given" in natspy_internals.incompatibilities(
        subscription=Bare)
    assert faststream_internals.incompatibilities(broker=Bare, installed="0.8.0") == [
        "faststream 0.8.0 is installed; this file was checked against 0.7.8", "NatsBroker()._connection is missing"]
    assert uvicorn_internals.incompatibilities(protocol=Bare, server=Bare, installed="0.99.0") == [
        "uvicorn 0.99.0 is installed; this file was checked against 0.55.0",
        "HttpToolsProtocol is not an asyncio.Protocol", "Server.capture_signals(self) is missing or changed",
        "Server(config).should_exit is not a bool"]


def test_the_fenced_libraries_are_pinned_to_the_release_their_fence_was_checked_against() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = {re.split(r"[\[=<>~!]", spec, maxsplit=1)[0]: spec for spec in project["dependencies"]}
    assert pins["nats-py"] == f"nats-py=={natspy_internals.PINNED}"
    assert pins["faststream"] == f"faststream[nats,cli]=={faststream_internals.PINNED}"
    assert pins["uvicorn"] == f"uvicorn[standard]=={uvicorn_internals.PINNED}"


async def test_the_gateway_takes_over_a_readers_bytes_through_the_fence() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(b'{"kind":"server.hello"}\n{"kind":"x"}\npartial')
    reader.feed_eof()
    assert await reader.readline() == b'{"kind":"server.hello"}\n'
    assert asyncio_internals.unread_and_eof(reader) == (b'{"kind":"x"}\npartial', True)


async def test_a_subscription_dispatched_in_the_read_loop_gets_every_message(nc: nats.NATS) -> None:
    got: list[tuple[str, bytes]] = []
    sub = await natspy_internals.subscribe_in_read_loop(nc, "fence.dispatch.*",
                                                        lambda msg: got.append((msg.subject, msg.data)))
    for n in range(3):  # the future never completes: every message, not only the first
        await nc.publish(f"fence.dispatch.{n}", b"%d" % n)
    await nc.flush()
    async with asyncio.timeout(5):
        while len(got) < 3:
            await asyncio.sleep(0.01)
    assert got == [(f"fence.dispatch.{n}", b"%d" % n) for n in range(3)]
    await sub.unsubscribe()


def test_no_private_attribute_of_a_fenced_library_is_used_outside_its_fence() -> None:
    found = []
    for folder in ("services", "shared", "shardbus", "simulator"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative in FENCES:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                for match in PRIVATE.finditer(line):
                    if not line[:match.start()].rstrip().endswith("self"):
                        found.append(f"{relative}:{number}: {line.strip()}")
                if BENEATH.search(line):
                    found.append(f"{relative}:{number}: {line.strip()}")
    assert found == []
