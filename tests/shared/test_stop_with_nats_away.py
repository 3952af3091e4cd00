"""SIGTERM ends every service within ``shardbus.process_stop.STOP_TIMEOUT_S`` while NATS is away —
stopped (the client is reconnecting) or hung (SIGSTOP: the socket looks alive and nothing
answers) — exiting 0 without a traceback; and even a stop that can never finish (a task that
swallows its cancellation, as nats-py's reconnect loop can on Python 3.11) ends in time.

Each test runs its own nats-server, so stopping or freezing it touches nobody else."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from shardbus import embedded
from shardbus.process_stop import STOP_TIMEOUT_S
from shared.health import health_file_is_fresh
from tests.processes import ServiceProcesses

SERVICE_SETTINGS = {
    "gateway": {"shard_port": "0", "shard_token": "t" * 32},
    # The ledger opens its pool lazily: no database needed to start or stop it.
    "ledger": {"database_url": "postgresql://ledger@127.0.0.1:9/ledger", "migrate_on_start": "false"},
    "cleanup": {},
    "installer": {},
}



def stop_and_time(proc: subprocess.Popen) -> tuple[int | None, float]:
    """SIGTERM ``proc``; its exit code (None: still running after the stop timeout and a
    second more, then killed) and how long it took."""
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code: int | None = proc.wait(STOP_TIMEOUT_S + 1.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
        code = None
    return code, time.monotonic() - started


@pytest.mark.timeout(120)
@pytest.mark.parametrize("away", ["stopped", "hung"])
@pytest.mark.parametrize("service", list(SERVICE_SETTINGS))
def test_sigterm_ends_the_service_in_time_while_nats_is_away(tmp_path, own_nats, service, away):
    procs = ServiceProcesses(tmp_path, own_nats.url)
    try:
        handle = procs.start(service, **SERVICE_SETTINGS[service])
        if away == "stopped":
            own_nats.stop()
        else:
            own_nats.proc.send_signal(signal.SIGSTOP)
        time.sleep(1.0)  # the service notices (stopped), or does not (hung)
        code, took = stop_and_time(handle.proc)
    finally:
        procs.stop_all()
    log = handle.log()
    print(f"\n{service}, NATS {away}: exit {code} after {took:.2f} s")
    assert code == 0, log[-3000:]
    assert took < STOP_TIMEOUT_S
    assert "Traceback" not in log, log[-3000:]


HANGING_STOP = textwrap.dedent("""
    import asyncio
    import services.cleanup.app as cleanup_app

    create_app = cleanup_app.create_app

    def with_a_task_that_swallows_its_cancellation(*args, **kwargs):
        app = create_app(*args, **kwargs)
        tasks = []

        async def reconnect_for_ever():  # what nats-py's reconnect loop becomes once a cancel is lost
            while True:
                try:
                    await asyncio.sleep(0.2)
                except asyncio.CancelledError:
                    pass

        @app.after_startup
        async def start():
            tasks.append(asyncio.get_running_loop().create_task(reconnect_for_ever()))

        return app

    cleanup_app.create_app = with_a_task_that_swallows_its_cancellation
    from shardbus.cli import main
    raise SystemExit(main(["run", "cleanup"]))
""")


@pytest.mark.timeout(60)
def test_a_stop_that_cannot_finish_still_ends_within_the_stop_timeout(tmp_path, own_nats):
    health = tmp_path / "cleanup.health"
    log_path = tmp_path / "cleanup.log"
    env = {**os.environ, "SHARDBUS_NATS_URL": own_nats.url, "SHARDBUS_HEALTH_FILE": str(health),
           "SHARDBUS_RECONNECT_WAIT_S": "0.2", "SHARDBUS_RECONNECT_WAIT_MAX_S": "1"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-c", HANGING_STOP], env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not health_file_is_fresh(str(health)):
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.05)
        own_nats.stop()
        time.sleep(0.5)
        code, took = stop_and_time(proc)
    finally:
        embedded.stop_process(proc, signal.SIGKILL, 5)
    print(f"\na stop that cannot finish: exit {code} after {took:.2f} s")
    assert code is not None, "still running after the stop timeout"
    assert took < STOP_TIMEOUT_S
    assert "stop did not finish in time" in log_path.read_text()
