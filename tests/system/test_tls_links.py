"""Every link that may cross hosts over TLS, with real processes (docs/security.md, "TLS"): the
gateway and the web door reach a TLS nats-server that verifies client certificates; the
gateway's shard listener requires one too, and ``shardbus shard-sim`` dials it with its own;
its frames and a command's answer cross; the door serves HTTPS (and refuses plain HTTP); a
renewed listener certificate is taken on SIGHUP without a restart."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import nats
import pytest
import trustme

from shardbus import embedded
from shardbus.embedded import stop_process
from shared import subjects
from shared.settings import CommonSettings
from tests.processes import ServiceProcess, ServiceProcesses
from tests.shared.test_nats_tls import Pki, write_tls
from tests.web.conftest import OPERATOR_TOKEN, WEBSITE_TOKEN

SHARD_TOKEN = "tls-system-shard-token-2468"


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


@pytest.fixture
def tls_nats(tmp_path: Path, pki: Pki) -> Iterator[embedded.NatsServer]:
    server = embedded.start_nats(tmp_path / "nats", tls=pki.server(verify=True))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def tls_services(tmp_path: Path, tls_nats: embedded.NatsServer) -> Iterator[ServiceProcesses]:
    procs = ServiceProcesses(tmp_path, tls_nats.url)
    try:
        yield procs
    finally:
        procs.stop_all()


def nats_client_settings(pki: Pki) -> dict[str, str]:
    return {"nats_tls_ca": str(pki.ca_file), "nats_tls_cert": str(pki.client_cert),
            "nats_tls_key": str(pki.client_key)}


def logged(process: ServiceProcess, message: str, field: str) -> str:
    for line in process.log().splitlines():
        if f'"{message}"' in line:
            return str(json.loads(line)[field])
    raise AssertionError(f"no {message!r} line in:\n{process.log()[-2000:]}")


async def wait_for_log(process: ServiceProcess, text: str, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while text not in process.log():
            await asyncio.sleep(0.05)


async def test_services_over_tls_nats_a_tls_shard_and_an_https_door(tls_services, tls_nats, pki, tmp_path, unique):
    shard_ca = trustme.CA()
    shard_ca_file = tmp_path / "shard-ca.pem"
    shard_ca.cert_pem.write_to_path(str(shard_ca_file))
    listener_cert, listener_key = write_tls(tmp_path, pki.ca, pki.ca.issue_cert("127.0.0.1"), "listener")
    gateway = tls_services.start("gateway", shard_token=SHARD_TOKEN, shard_port="0",
                                 shard_tls_cert=str(listener_cert), shard_tls_key=str(listener_key),
                                 shard_tls_ca=str(shard_ca_file), **nats_client_settings(pki))
    door = tls_services.start("web", web_port="0", web_token=WEBSITE_TOKEN, web_operator_token=OPERATOR_TOKEN,
                              web_tls_cert=str(pki.server_cert),
                              web_tls_key=str(pki.server_key), **nats_client_settings(pki))
    addr = logged(gateway, "listening for shards", "addr")
    shard = f"uo{unique}"
    shard_cert, shard_key = write_tls(tmp_path, shard_ca, shard_ca.issue_cert(shard), "shard")

    nc = await nats.connect(tls_nats.url, connect_timeout=5, max_reconnect_attempts=0, allow_reconnect=False,
                            **CommonSettings(**nats_client_settings(pki)).nats_tls())  # type: ignore[arg-type]
    frames = await nc.subscribe(subjects.frame(shard, ">"))
    await nc.flush()
    sim = subprocess.Popen([sys.executable, "-m", "shardbus", "shard-sim", "--addr", addr, "--shard", shard,
                            "--tls-ca", str(pki.ca_file), "--tls-cert", str(shard_cert), "--tls-key", str(shard_key)],
                           env={**os.environ, "SHARDBUS_SHARD_TOKEN": SHARD_TOKEN},
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        hello = await frames.next_msg(timeout=20)  # the shard's hello, over the TLS shard link and TLS NATS
        assert hello.subject == subjects.frame(shard, "server.hello") and SHARD_TOKEN.encode() not in hello.data
        answer = json.loads((await nc.request(subjects.command(shard, "world.save"), b"{}", timeout=10)).data)
        assert answer["status"] == 200, answer

        # The door over HTTPS: health (its NATS link up, over TLS) and a route reaching the shard.
        url = logged(door, "web door listening", "url")
        assert url.startswith("https://")
        verify = ssl.create_default_context(cafile=str(pki.ca_file))
        async with httpx.AsyncClient(verify=verify, timeout=10) as https:
            health = await https.get(f"{url}/health")
            assert health.status_code == 200 and health.json()["nats"] is True
            page = await https.get(f"{url}/shards/{shard}/items",
                                   headers={"Authorization": f"Bearer {WEBSITE_TOKEN}"})
            assert page.status_code == 200, page.text  # the door reached the shard (item.catalog) through NATS
            login = await https.post(f"{url}/console/login", data={"token": OPERATOR_TOKEN})
            assert login.status_code == 303 and "secure" in login.headers["set-cookie"].lower()  # docs/console.md
        async with httpx.AsyncClient(timeout=5) as plain:
            with pytest.raises(httpx.HTTPError):  # plain HTTP on the HTTPS port gets no answer
                await plain.get(url.replace("https://", "http://"))

        # A renewed listener certificate (another CA now) is taken on SIGHUP: the next dial sees it.
        renewed = trustme.CA()
        write_tls(tmp_path, renewed, renewed.issue_cert("127.0.0.1"), "listener")
        gateway.proc.send_signal(signal.SIGHUP)
        await wait_for_log(gateway, "shard listener certificate reloaded")
        host, port = addr.rsplit(":", 1)
        context = ssl.create_default_context()
        renewed.configure_trust(context)
        shard_ca.issue_cert("x").configure_cert(context)
        _reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, int(port), ssl=context, server_hostname=host), 10)
        writer.close()
        assert gateway.proc.poll() is None and sim.poll() is None
    finally:
        stop_process(sim, signal.SIGINT)
        await nc.close()
    assert SHARD_TOKEN not in gateway.log() and WEBSITE_TOKEN not in door.log() and OPERATOR_TOKEN not in door.log()


def test_a_shard_sim_trusting_another_ca_stops_with_the_reason(tls_services, pki, tmp_path, unique):
    listener_cert, listener_key = write_tls(tmp_path, pki.ca, pki.ca.issue_cert("127.0.0.1"), "listener")
    gateway = tls_services.start("gateway", shard_token=SHARD_TOKEN, shard_port="0",
                                 shard_tls_cert=str(listener_cert), shard_tls_key=str(listener_key),
                                 **nats_client_settings(pki))
    addr = logged(gateway, "listening for shards", "addr")
    done = subprocess.run([sys.executable, "-m", "shardbus", "shard-sim", "--addr", addr, "--shard", f"s{unique}",
                           "--tls-ca", str(pki.wrong_ca_file)], env={**os.environ, "SHARDBUS_SHARD_TOKEN": SHARD_TOKEN},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "the gateway's certificate was refused" in done.stderr and SHARD_TOKEN not in done.stderr


@pytest.mark.parametrize("setting", ["shard_tls_cert", "nats_tls_ca"])
def test_a_missing_certificate_file_stops_the_service_with_one_line_naming_it(tls_nats, pki, tmp_path, setting):
    env = {**os.environ, "SHARDBUS_NATS_URL": tls_nats.url, "SHARDBUS_SHARD_TOKEN": SHARD_TOKEN,
           "SHARDBUS_SHARD_PORT": "0"}
    missing = str(tmp_path / "missing.pem")
    if setting == "shard_tls_cert":  # the NATS link works; the listener's file is missing
        env.update({f"SHARDBUS_{key.upper()}": value for key, value in nats_client_settings(pki).items()})
        env.update(SHARDBUS_SHARD_TLS_CERT=missing, SHARDBUS_SHARD_TLS_KEY=missing)
    else:
        env["SHARDBUS_NATS_TLS_CA"] = missing
    done = subprocess.run([sys.executable, "-m", "shardbus", "run", "gateway"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1
    errors = [json.loads(line) for line in done.stderr.splitlines() + done.stdout.splitlines()
              if line.startswith("{") and '"error"' in line]
    assert [e["msg"] for e in errors] == [f"certificate or key file not found: {missing}" if setting == "shard_tls_cert"
                                         else f"CA file not found: {missing}"]
    assert "Traceback" not in done.stderr
