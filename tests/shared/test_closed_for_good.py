"""A service's NATS connection closing for good ends the service (shared/nats_connect.py
ClosedForGood, armed by shared/broker.py's app while it runs), on a real nats-server.

The close provoked here is the one of the gateway incident: a publish over the server's
``max_payload`` from the service's own connection. nats-py checks only the body against the
limit; the server counts headers too, answers ``-ERR 'Maximum Payload Violation'`` and drops
the connection, and nats-py closes it for good (no reconnect). The process-level proof (exit
code, the log line, SIGTERM still 0) is tests/system/test_fatal_close.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

import pytest
from nats.errors import ConnectionClosedError

from shared import broker as shared_broker
from shared.broker import make_app, make_broker
from shared.nats_connect import FATAL_CLOSE_EXIT_CODE, ClosedForGood
from shared.settings import CommonSettings


@pytest.fixture
def guards() -> Iterator[list[ClosedForGood]]:
    """Guards whose watchdog (which would end this very process) is cancelled after the test."""
    made: list[ClosedForGood] = []
    yield made
    for guard in made:
        if guard.watchdog is not None:
            guard.watchdog.cancel()


def _guard_of(broker) -> list[ClosedForGood]:
    """The broker's closed-for-good guard (to cancel its watchdog after the test)."""
    guard = getattr(shared_broker, "_closed_guards", {}).get(broker)
    return [guard] if guard is not None else []


async def _over_max_payload(nc) -> None:
    """Publish a body within max_payload whose headers push it over: the server closes us."""
    await nc.publish("closed.for.good", b"x" * (nc.max_payload - 8), headers={"X-Pad": "y" * 64})
    try:
        await nc.flush(timeout=2)
    except Exception:  # the connection is going away, which is the point
        pass


async def test_a_disarmed_guard_ignores_a_close(guards, caplog):
    guard = ClosedForGood("svc")
    guards.append(guard)
    called: list[int] = []
    guard.arm(called.append)
    guard.disarm()
    with caplog.at_level(logging.CRITICAL, logger="shardbus.nats"):
        await guard.on_closed()
    assert called == [] and guard.watchdog is None and caplog.records == []


async def test_an_armed_guard_logs_one_line_and_asks_for_the_exit_once(guards, caplog):
    guard = ClosedForGood("svc", reason=lambda: RuntimeError("nats: 'Maximum Payload Violation'"))
    guards.append(guard)
    called: list[int] = []
    guard.arm(called.append)
    with caplog.at_level(logging.CRITICAL, logger="shardbus.nats"):
        await guard.on_closed()
        await guard.on_closed()
    assert called == [FATAL_CLOSE_EXIT_CODE]
    assert guard.watchdog is not None and guard.watchdog.daemon  # the process ends whatever happens
    [record] = caplog.records
    assert "closed for good" in record.getMessage() and "Maximum Payload" in record.reason


async def test_a_running_service_ends_with_the_exit_code_when_its_connection_closes(nats_url, unique, guards):
    broker = make_broker(CommonSettings(nats_url=nats_url), f"svc{unique}")
    app = make_app(broker, f"svc{unique}")
    guards.extend(_guard_of(broker))

    @broker.subscriber(f"svc{unique}.echo")
    async def echo(body: dict) -> dict:
        return body

    async def run_app() -> int | str | None:
        """``app.run()`` as ``shardbus run`` does; a SystemExit ends it (caught here, in the
        coroutine: escaping a task, it would stop the test's event loop)."""
        try:
            await app.run()
        except SystemExit as ended:
            return ended.code
        return "returned"

    run = asyncio.create_task(run_app())
    async with asyncio.timeout(10):
        while not (broker._connection is not None and broker._connection.is_connected and app.running):
            await asyncio.sleep(0.02)
    nc = broker.connection
    await _over_max_payload(nc)
    async with asyncio.timeout(10):
        assert await run == FATAL_CLOSE_EXIT_CODE
    assert "maximum payload" in str(nc.last_error).lower()


async def test_a_service_not_run_by_its_app_is_not_ended_by_a_close(nats_url, unique, guards):
    """Started and stopped by hand (as tests do), the guard is never armed."""
    broker = make_broker(CommonSettings(nats_url=nats_url), f"svc{unique}")
    app = make_app(broker, f"svc{unique}")
    [guard] = _guard_of(broker)
    guards.append(guard)
    await app.start()
    try:
        assert not guard.armed
        await _over_max_payload(broker.connection)
        async with asyncio.timeout(5):
            while not broker.connection.is_closed:
                await asyncio.sleep(0.02)
        assert not guard.fired and guard.watchdog is None
    finally:
        with contextlib.suppress(ConnectionClosedError):  # FastStream drains a closed connection
            await app.stop()
