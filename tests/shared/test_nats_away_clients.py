"""NATS away, in every client path that asks over it — cleanup's ledger client (and its
give-backs), the installer's site lock, the CLI: a 503-style answer or one plain sentence,
never a traceback, a 500 or a wait for an answer that can no longer come.

Each test runs its own nats-server, so stopping it touches nobody else."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time

import nats
import pytest

from services.cleanup import giveback
from services.cleanup.classify import Verdict
from services.cleanup.ledger_client import LedgerClient, LedgerError
from services.cleanup.requester import NatsRequester
from services.installer.refusals import Refused
from services.installer.site_lock import SiteLock, open_bucket
from shardbus import embedded
from shared import subjects
from tests.processes import ServiceProcesses

SECRET = "hunter2-nats-pw"



async def client(url: str, **options) -> nats.NATS:
    """A reconnecting client as a service holds (reconnects quickly, for ever)."""
    async def quiet(_exc: Exception) -> None:
        pass

    return await nats.connect(url, connect_timeout=2, max_reconnect_attempts=-1, reconnect_time_wait=0.2,
                              error_cb=quiet, **options)


# --- cleanup's ledger client ---------------------------------------------------------------

@pytest.mark.timeout(60)
async def test_the_ledger_client_answers_503_in_every_shape_of_a_nats_outage(own_nats):
    """Reconnecting (the request is buffered and times out), reconnecting with its buffer full
    (OutboundBufferLimitError), closed (ConnectionClosedError): each a LedgerError 503."""
    nc = await client(own_nats.url)
    tiny = await client(own_nats.url, pending_size=16)
    try:
        own_nats.stop()
        deadline = time.monotonic() + 5
        while (nc.is_connected or tiny.is_connected) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for shape, conn in (("reconnecting", nc), ("buffer full", tiny)):
            started = time.monotonic()
            with pytest.raises(LedgerError) as raised:
                await LedgerClient(NatsRequester(conn), timeout_s=0.5).settle()
            assert raised.value.status == 503, (shape, raised.value)
            assert time.monotonic() - started < 2.0, shape
        with contextlib.suppress(Exception):  # nats-py's close of a disconnected client can raise
            await nc.close()
        with pytest.raises(LedgerError) as raised:
            await LedgerClient(NatsRequester(nc), timeout_s=0.5).candidates(3, 10)
        assert raised.value.status == 503 and "NATS is unreachable" in raised.value.sentence
    finally:
        for conn in (nc, tiny):
            with contextlib.suppress(Exception):  # nats-py's close of a disconnected client can raise
                await conn.close()


@pytest.mark.timeout(30)
async def test_a_give_back_over_a_closed_connection_is_away(own_nats):
    """A give-back that cannot be sent is an ``away`` outcome (tried again after its back-off,
    no attempt spent: nobody answered), not an exception that would stop the sweep."""
    nc = await client(own_nats.url)
    await nc.close()
    row = {"runId": "r1", "resourceId": 1, "module": "world", "kind": "creature", "ref": "0x1", "revert": {}}
    outcome = await giveback.give_back(NatsRequester(nc), row, "uo1", 0.5)
    assert outcome.verdict is Verdict.AWAY, outcome


# --- the installer's site lock ---------------------------------------------------------------

@pytest.mark.timeout(60)
async def test_the_site_lock_is_refused_503_when_nats_is_away(own_nats, unique):
    nc = await client(own_nats.url)
    try:
        kv = await open_bucket(nc.jetstream(timeout=1.0), f"T_LOCK_{unique}", lease_s=5)
        lock = SiteLock(kv, "site", wait_s=2, lease_s=5)
        own_nats.stop()
        with pytest.raises(Refused) as refused:
            async with lock.hold("install uo-events 1.0.0"):
                pytest.fail("took a lock with NATS away")
        assert refused.value.status == 503 and "try again" in refused.value.sentence
        with contextlib.suppress(Exception):
            await nc.close()
        with pytest.raises(Refused) as refused:
            async with lock.hold("remove uo-events"):
                pytest.fail("took a lock over a closed connection")
        assert refused.value.status == 503
    finally:
        with contextlib.suppress(Exception):
            await nc.close()


@pytest.mark.timeout(90)
async def test_the_installer_answers_503_not_500_while_jetstream_is_away(tmp_path, own_nats):
    """NATS comes back without JetStream (a cluster without a JetStream leader looks the same to
    a client): the installer's requests that need the lock are answered 503, and work again once
    JetStream is back."""
    procs = ServiceProcesses(tmp_path, own_nats.url)
    servers = [own_nats]
    nc = None
    try:
        procs.start("installer", modules_dir=str(tmp_path / "modules"), installer_lock_wait_s="2")
        own_nats.stop()
        bare = embedded._launch([embedded.nats_server_binary(), "-a", "127.0.0.1", "-p", str(own_nats.port),
                                 "--ports_file_dir", str(tmp_path / "bare" / "ports")],
                                tmp_path / "bare", "nats-server.log", 10.0)
        servers.append(bare)
        nc = await client(own_nats.url)
        reply = await ask_until_answered(nc, subjects.INSTALLER_REMOVE, {"id": "uo-events"})
        assert reply["status"] == 503, reply
        assert "NATS is unreachable" in reply["error"], reply
        bare.stop()
        servers.append(embedded.start_nats(tmp_path / "nats", port=own_nats.port))
        reply = await ask_until_answered(nc, subjects.INSTALLER_REMOVE, {"id": "uo-events"})
        assert reply["status"] == 404, reply  # the lock was taken: nothing is installed
    finally:
        if nc is not None:
            await nc.close()
        procs.stop_all()
        for server in servers:
            server.stop()


@pytest.mark.timeout(60)
def test_an_installer_started_while_jetstream_is_away_exits_for_a_restart_with_one_line(tmp_path):
    """It cannot open its lock bucket: one log line, exit 75 (EX_TEMPFAIL) for the supervisor to
    start it again, no traceback."""
    bare = embedded._launch([embedded.nats_server_binary(), "-a", "127.0.0.1", "-p", "-1",
                             "--ports_file_dir", str(tmp_path / "ports")], tmp_path, "nats-server.log", 10.0)
    try:
        env = {**os.environ, "SHARDBUS_NATS_URL": bare.url, "SHARDBUS_MODULES_DIR": str(tmp_path / "modules")}
        done = subprocess.run([sys.executable, "-m", "shardbus", "run", "installer"], env=env,
                              capture_output=True, text=True, timeout=45)
    finally:
        bare.stop()
    said = done.stdout + done.stderr
    assert done.returncode == 75, said[-3000:]
    assert "NATS is unreachable" in said and "Traceback" not in said, said[-3000:]


async def ask_until_answered(nc: nats.NATS, subject: str, body: dict, within: float = 30.0) -> dict:
    """The first answer to ``body`` on ``subject``, asking again while the service is still
    reconnecting (no responders, no answer)."""
    deadline = time.monotonic() + within
    while True:
        try:
            return json.loads((await nc.request(subject, json.dumps(body).encode(), timeout=8)).data)
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


# --- the CLI ---------------------------------------------------------------------------------

def shardbus(nats_url: str, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    env = {**os.environ, "SHARDBUS_NATS_URL": nats_url}
    return subprocess.run([sys.executable, "-m", "shardbus", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def assert_plain_failure(done: subprocess.CompletedProcess, says: str) -> None:
    said = done.stdout + done.stderr
    assert done.returncode == 1, said
    assert says in said, said
    assert "Traceback" not in said and SECRET not in said, said


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", [["module", "list"], ["module", "remove", "uo-events"],
                                     ["module", "install", "https://example.org/m.json"],
                                     ["cleanup", "sweep"], ["status"]])
def test_a_command_with_nats_out_of_reach_says_so_plainly(command):
    port = embedded.free_port()
    done = shardbus(f"nats://ops:{SECRET}@127.0.0.1:{port}", *command)
    assert_plain_failure(done, "cannot reach NATS at nats://ops:***@127.0.0.1")


LOST_WITHIN_S = 10.0
"""A command whose NATS goes away mid-request says so within this (its own reconnect attempts
included), not after its --timeout (minutes)."""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command, subject", [
    (["cleanup", "sweep"], subjects.CLEANUP_SWEEP),
    (["module", "remove", "uo-events"], subjects.INSTALLER_REMOVE),
    (["module", "install", "https://example.org/m.json"], subjects.INSTALLER_INSTALL),
])
async def test_a_command_whose_nats_goes_away_mid_request_says_so_at_once(own_nats, command, subject):
    heard = asyncio.Event()
    nc = await client(own_nats.url)

    async def silent(_msg) -> None:  # a service that took the request and never answers
        heard.set()

    await nc.subscribe(subject, cb=silent)
    await nc.flush()
    url = own_nats.url.replace("nats://", f"nats://ops:{SECRET}@")
    env = {**os.environ, "SHARDBUS_NATS_URL": url}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "shardbus", *command, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        await asyncio.wait_for(heard.wait(), 20)
        own_nats.stop()
        started = time.monotonic()
        out, err = await asyncio.wait_for(proc.communicate(), LOST_WITHIN_S + 5)
        took = time.monotonic() - started
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await nc.close()
    done = subprocess.CompletedProcess(command, proc.returncode, out.decode(), err.decode())
    print(f"\n{' '.join(command)}: exit {done.returncode} {took:.2f} s after NATS went away")
    assert_plain_failure(done, "lost the connection to NATS")
    assert took < LOST_WITHIN_S
