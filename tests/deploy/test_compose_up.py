"""compose.yaml brought up for real on a container engine (marked ``needs_engine``): the image
built from the Dockerfile, the stack up with the gateway and the ledger at 2 replicas, a shard
connected (the shard simulator, in a gateway container) and a command sent through the web door,
then every replica's /metrics scraped the way Prometheus finds them (compose DNS, port 9464);
Prometheus itself (the `monitoring` profile's) shown to find every replica and load the alerts;
and the stack taken down with its volumes.

Where no engine answers, or the images cannot be had (pulled, or named by
``SHARDBUS_COMPOSE_TEST_IMAGES="nats=…,postgres=…,python=…,prometheus=…"``: a mirror's copies),
the tests are skipped with the exact error. The compose file is run as a copy with the host ports left to the
engine (the machine's own NATS and PostgreSQL may hold 4222 and 5432) and absolute paths.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import ROOT

pytestmark = pytest.mark.needs_engine

SCALED = {"gateway": 2, "ledger": 2}
TOKENS = {"SHARD_TOKEN": "shard-" + "s" * 24, "WEB_TOKEN": "web-" + "w" * 24}
UP_TIMEOUT_S = 420.0


def _run(args: list[str], env: dict[str, str] | None = None, timeout: float = 120,
         check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {done.returncode}: {done.stderr.strip() or done.stdout.strip()}")
    return done


def _first_line(done: subprocess.CompletedProcess[str]) -> str:
    text = (done.stderr.strip() or done.stdout.strip()).splitlines()
    return next((line for line in text if "rror" in line), text[-1] if text else f"exit {done.returncode}")


class Engine:
    """docker, or podman with docker-compose talking to its Docker API (a socket it serves for
    the test); the compose command and its environment."""

    def __init__(self, name: str, compose: list[str], env: dict[str, str], service: subprocess.Popen[bytes] | None):
        self.name, self.compose, self.env, self.service = name, compose, env, service

    def stop(self) -> None:
        if self.service is not None:
            self.service.terminate()
            try:
                self.service.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.service.kill()
                self.service.wait(timeout=30)


def _find_engine(tmp: Path) -> Engine:
    errors = []
    if shutil.which("docker"):
        done = _run(["docker", "info"], check=False, timeout=60)
        if done.returncode == 0:
            if _run(["docker", "compose", "version"], check=False).returncode == 0:
                return Engine("docker", ["docker", "compose"], dict(os.environ), None)
            if shutil.which("docker-compose"):
                return Engine("docker", ["docker-compose"], dict(os.environ), None)
            errors.append("docker: neither docker compose nor docker-compose is installed")
        else:
            errors.append(f"docker info: {_first_line(done)}")
    else:
        errors.append("docker: not installed")
    if shutil.which("podman"):
        done = _run(["podman", "info"], check=False, timeout=60)
        if done.returncode != 0:
            errors.append(f"podman info: {_first_line(done)}")
        elif not shutil.which("docker-compose"):
            errors.append("podman: docker-compose (to drive its Docker API) is not installed")
        else:
            socket = tmp / "podman.sock"
            service = subprocess.Popen(["podman", "system", "service", "--time=0", f"unix://{socket}"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            env = {**os.environ, "DOCKER_HOST": f"unix://{socket}"}
            deadline = time.monotonic() + 30
            while not socket.exists() and time.monotonic() < deadline and service.poll() is None:
                time.sleep(0.2)
            return Engine("podman", ["docker-compose"], env, service)
    else:
        errors.append("podman: not installed")
    pytest.skip("no container engine: " + "; ".join(errors))


def _images() -> dict[str, str]:
    """The images compose.yaml and the Dockerfile name, or the ones the environment gives."""
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    default_python = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", (ROOT / "Dockerfile").read_text(), re.M)
    assert default_python
    images = {"nats": compose["services"]["nats"]["image"], "postgres": compose["services"]["postgres"]["image"],
              "python": default_python.group(1), "prometheus": compose["services"]["prometheus"]["image"]}
    for item in filter(None, os.environ.get("SHARDBUS_COMPOSE_TEST_IMAGES", "").split(",")):
        key, _, value = item.partition("=")
        assert key in images and value, f"SHARDBUS_COMPOSE_TEST_IMAGES: {item!r}"
        images[key] = value
    return images


def _qualified(engine: Engine, image: str) -> str:
    """The name compose's Docker API gives ``image``: podman's own CLI resolves no short name."""
    first, slash, _ = image.partition("/")
    if engine.name != "podman" or (slash and ("." in first or ":" in first or first == "localhost")):
        return image
    return f"docker.io/{image if '/' in image else 'library/' + image}"


def _missing_image(engine: Engine, image: str) -> str | None:
    """None once ``image`` is here (pulled if need be), else the pull's error."""
    image = _qualified(engine, image)
    if _run([engine.name, "image", "inspect", image], check=False).returncode == 0:
        return None
    done = _run([engine.name, "pull", image], check=False, timeout=600)
    return None if done.returncode == 0 else f"{engine.name} pull {image} failed: {_first_line(done)}"


def _have_images(engine: Engine, images: dict[str, str]) -> None:
    for key in ("nats", "postgres", "python"):
        if error := _missing_image(engine, images[key]):
            pytest.skip(f"{error} (give local copies with SHARDBUS_COMPOSE_TEST_IMAGES=nats=…,postgres=…,python=…)")
    done = _run([engine.name, "run", "--rm", _qualified(engine, images["nats"]), "--version"], check=False,
                timeout=120)
    if done.returncode != 0:
        pytest.skip(f"{engine.name} cannot run a container here: {_first_line(done)}")


def _variant(images: dict[str, str], path: Path) -> None:
    """compose.yaml with the given images, host ports chosen by the engine, absolute paths."""
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    for name in ("nats", "postgres", "prometheus"):
        compose["services"][name]["image"] = images[name]
    for service in compose["services"].values():
        if "ports" in service:
            service["ports"] = [str(port).rsplit(":", 1)[-1].split("-")[0] for port in service["ports"]]
        if "build" in service:
            service["build"] = {"context": str(ROOT), "args": {"PYTHON_IMAGE": images["python"]}}
        service["volumes"] = [str(ROOT / v[2:v.index(":")]) + v[v.index(":"):] if v.startswith("./") else v
                              for v in service.get("volumes", [])]
        if not service["volumes"]:
            del service["volumes"]
    path.write_text(yaml.safe_dump(compose, sort_keys=False))


class Stack:
    def __init__(self, engine: Engine, file: Path, project: str, images: dict[str, str]):
        self.engine, self.file, self.project, self.images = engine, file, project, images
        self.env = {**engine.env, **TOKENS}

    def compose(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run([*self.engine.compose, "-p", self.project, "-f", str(self.file), *args],
                    env=self.env, timeout=timeout, check=check)

    def containers(self) -> dict[str, dict[str, Any]]:
        done = _run([self.engine.name, "ps", "-a", "--filter", f"label=com.docker.compose.project={self.project}",
                     "--format", "{{.Names}}"], env=self.env)
        names = done.stdout.split()
        if not names:
            return {}
        return {c["Name"].lstrip("/"): c for c in json.loads(_run([self.engine.name, "inspect", *names]).stdout)}

    def exec(self, service: str, index: int, *command: str, timeout: float = 60) -> str:
        return self.compose("exec", "-T", "--index", str(index), service, *command, timeout=timeout).stdout


def _health_runner(stack: Stack, stop: threading.Event) -> None:
    """podman runs health checks from systemd timers; without systemd nothing runs them, so
    the test does (docker runs its own)."""
    while not stop.wait(2):
        for name, container in stack.containers().items():
            if container.get("State", {}).get("Running") and container.get("Config", {}).get("Healthcheck"):
                _run(["podman", "healthcheck", "run", name], check=False, timeout=60)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The image built, the stack up with the gateway and the ledger scaled, every container healthy."""
    tmp_path = tmp_path_factory.mktemp("compose-up")
    engine = _find_engine(tmp_path)
    stop = threading.Event()
    runner: threading.Thread | None = None
    stack = None
    try:
        images = _images()
        _have_images(engine, images)
        _variant(images, tmp_path / "compose.yaml")
        stack = Stack(engine, tmp_path / "compose.yaml", f"sbdeploy{uuid.uuid4().hex[:8]}", images)
        if engine.name == "podman" and not Path("/run/systemd/system").exists():
            runner = threading.Thread(target=_health_runner, args=(stack, stop), daemon=True)
            runner.start()
        stack.compose("build", timeout=1200)
        stack.compose("up", "-d", *[a for s, n in SCALED.items() for a in ("--scale", f"{s}={n}")], timeout=900)
        _wait_healthy(stack)
        yield stack
    finally:
        stop.set()
        if runner is not None:
            runner.join(timeout=120)
        if stack is not None:
            stack.compose("down", "-v", "--remove-orphans", "-t", "10", timeout=300, check=False)
        engine.stop()


def _wait_healthy(stack: Stack) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + UP_TIMEOUT_S
    while True:
        containers = stack.containers()
        states = {name: (c["Config"]["Labels"]["com.docker.compose.service"],
                         (c["State"].get("Health") or {}).get("Status") or c["State"]["Status"])
                  for name, c in containers.items()}
        running = [status for service, status in states.values() if service != "migrate"]
        if len(running) == 7 + sum(SCALED.values()) - len(SCALED) and set(running) == {"healthy"}:
            return containers
        if time.monotonic() > deadline:
            logs = stack.compose("logs", "--tail", "30", timeout=120, check=False).stdout[-6000:]
            raise AssertionError(f"not healthy within {UP_TIMEOUT_S} s: {states}\n{logs}")
        time.sleep(3)


SCRAPE = """
import socket, sys, urllib.request
addresses = sorted({a[4][0] for a in socket.getaddrinfo(sys.argv[1], 9464, proto=socket.IPPROTO_TCP)})
for address in addresses:
    body = urllib.request.urlopen(f"http://{address}:9464/metrics", timeout=10).read().decode()
    print(f"## {address}")
    print(body)
"""


def _scrape(stack: Stack, service: str) -> dict[str, str]:
    """Every replica's /metrics as Prometheus finds them: the A records of the service's name."""
    out = stack.exec("cleanup", 1, "python3", "-c", SCRAPE, service)
    parts = re.split(r"^## (\S+)$", out, flags=re.M)[1:]
    return dict(zip(parts[::2], parts[1::2], strict=True))


def _value(body: str, series: str) -> float:
    total = 0.0
    for line in body.splitlines():
        if line.startswith(series) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


COMMAND = """
import sys, urllib.request
request = urllib.request.Request("http://127.0.0.1:8080/shards/uo1/items",
                                 headers={"Authorization": "Bearer " + sys.argv[1]})
with urllib.request.urlopen(request, timeout=30) as answer:
    print(answer.status)
"""


def test_compose_up_scaled_serves_frames_commands_and_metrics(stack):
    # A shard on the first gateway replica: its hello and frames come in, then a command from the
    # web door reaches it through NATS whichever gateway holds it.
    stack.compose("exec", "-d", "--index", "1", "gateway", "shardbus", "shard-sim",
                  "--addr", "127.0.0.1:2595", "--shard", "uo1")
    deadline = time.monotonic() + 120
    while True:
        gateways = _scrape(stack, "gateway")
        if sum(_value(body, "shardbus_gateway_shards_connected") for body in gateways.values()) >= 1:
            break
        assert time.monotonic() < deadline, f"no gateway reports the shard: {list(gateways)}"
        time.sleep(2)
    assert stack.exec("web", 1, "python3", "-c", COMMAND, TOKENS["WEB_TOKEN"]).strip() == "200"

    gateways = _scrape(stack, "gateway")
    assert len(gateways) == SCALED["gateway"]
    assert sum(_value(body, "shardbus_gateway_frames_in_total") for body in gateways.values()) >= 1
    assert sum(_value(body, 'shardbus_gateway_commands_total{status="200"}') for body in gateways.values()) >= 1
    ledgers = _scrape(stack, "ledger")
    assert len(ledgers) == SCALED["ledger"]
    for service in ("gateway", "ledger", "cleanup", "installer", "web"):
        bodies = _scrape(stack, service) if service not in ("gateway", "ledger") else (
            gateways if service == "gateway" else ledgers)
        for address, body in bodies.items():
            assert f'shardbus_service_info{{service="{service}"' in body, (service, address)
            assert _value(body, "shardbus_nats_connected") == 1, (service, address)
            assert _value(body, "process_resident_memory_bytes") > 0, (service, address)


TARGETS = """
import json, sys, urllib.request
for path in ("targets", "rules"):
    print(urllib.request.urlopen(f"http://prometheus:9090/api/v1/{path}", timeout=10).read().decode())
"""


def test_prometheus_finds_every_replica_through_dns_and_loads_the_alerts(stack):
    if error := _missing_image(stack.engine, stack.images["prometheus"]):
        pytest.skip(f"{error} (a local copy: SHARDBUS_COMPOSE_TEST_IMAGES=prometheus=…)")
    stack.compose("--profile", "monitoring", "up", "-d", "--no-deps", "prometheus", timeout=300)
    expected = {"gateway": 2, "ledger": 2, "cleanup": 1, "installer": 1, "web": 1}
    deadline = time.monotonic() + 180
    while True:
        try:
            targets_text, rules_text = stack.exec("cleanup", 1, "python3", "-c", TARGETS).split("\n", 1)
        except AssertionError:  # Prometheus not listening yet
            targets_text = rules_text = ""
        if targets_text:
            active = json.loads(targets_text)["data"]["activeTargets"]
            up = {job: sum(1 for t in active if t["labels"]["job"] == job and t["health"] == "up") for job in expected}
            if up == expected:
                break
        assert time.monotonic() < deadline, f"Prometheus's targets: {targets_text[:3000]}"
        time.sleep(3)
    groups = json.loads(rules_text)["data"]["groups"]
    assert {rule["name"] for group in groups for rule in group["rules"]} == {
        "ShardSilent", "DeadLettersRising", "RunsIncomplete", "RelayLag", "ServiceDown"}
