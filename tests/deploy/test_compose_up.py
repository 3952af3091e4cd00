"""compose.yaml brought up for real on a container engine (marked ``needs_engine``;
docs/operations.md, "Compose for real"): the image built from the Dockerfile, the stack up with
gateway ×2, ledger ×2 and cleanup ×3, a simulated shard's frames sent through each gateway
replica's host port and a command through the web door's, every replica's /metrics scraped the
way Prometheus finds them (compose DNS, port 9464), Prometheus itself (the `monitoring`
profile's) finding every replica and loading every alert of deploy/prometheus/alerts.yml; then
the same with compose.cluster.yaml (3 NATS nodes, R3 streams), which keeps taking frames and
commands with a node stopped. Each stack is taken down with its volumes, and the test fails when
a container, volume, network or engine process (conmon) of it is left.

The real files are run, with only their variables set: host ports drawn free here (this
machine's own NATS and PostgreSQL hold 4222 and 5432; the shard and web ports ``127.0.0.1:``, a
loopback port the engine picks per replica, since podman takes no host range), and images from the environment
or deploy/images/images.env (``make images``: stand-ins where Docker Hub cannot be reached).

Where no engine answers or an image cannot be had, the tests are skipped with the exact error;
with ``SHARDBUS_REQUIRE_COMPOSE=1`` (CI, ``make test-compose``) they fail instead.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from shardbus import embedded
from tests.deploy.conftest import PROMETHEUS_DIR, ROOT

# The image build and a stack's start take minutes: the suite's 300 s a test is too short.
pytestmark = [pytest.mark.needs_engine, pytest.mark.timeout(1800)]

REQUIRED = os.environ.get("SHARDBUS_REQUIRE_COMPOSE") == "1"
SCALED = {"gateway": 2, "ledger": 2, "cleanup": 3}
TOKENS = {"SHARD_TOKEN": "shard-" + "s" * 24, "WEB_TOKEN": "web-" + "w" * 24}
IMAGE_VARIABLES = ("PYTHON_IMAGE", "NATS_IMAGE", "POSTGRES_IMAGE", "PROMETHEUS_IMAGE")
UP_TIMEOUT_S = 420.0
ALERTS = {rule["alert"] for group in yaml.safe_load((PROMETHEUS_DIR / "alerts.yml").read_text())["groups"]
          for rule in group["rules"] if "alert" in rule}


def _unavailable(reason: str) -> None:
    """Skip, or where CI requires compose (SHARDBUS_REQUIRE_COMPOSE=1), fail."""
    if REQUIRED:
        pytest.fail(f"SHARDBUS_REQUIRE_COMPOSE=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def _run(args: list[str], env: dict[str, str] | None = None, timeout: float = 120,
         check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {done.returncode}: {done.stderr.strip() or done.stdout.strip()}")
    return done


def _first_line(done: subprocess.CompletedProcess[str]) -> str:
    text = (done.stderr.strip() or done.stdout.strip()).splitlines()
    return next((line for line in text if "rror" in line), text[-1] if text else f"exit {done.returncode}")


def _conmons() -> set[int]:
    """The pids of the machine's conmon processes (podman's per-container monitors)."""
    found = set()
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "comm").read_text().strip() == "conmon":
                found.add(int(proc.name))
        except OSError:
            continue
    return found


class Engine:
    """docker, or podman with docker-compose talking to its Docker API (a socket it serves for
    the test); the compose command and its environment."""

    def __init__(self, name: str, compose: list[str], env: dict[str, str], service: subprocess.Popen[bytes] | None):
        self.name, self.compose, self.env, self.service = name, compose, env, service

    def stop(self) -> None:
        if self.service is not None:
            embedded.stop_process(self.service, timeout=30)


def _find_engine(tmp: Path) -> Engine:
    env = dict(os.environ)
    # podman's settings for this machine (deploy/images/containers.conf: runc, lower limits).
    env.setdefault("CONTAINERS_CONF", str(ROOT / "deploy" / "images" / "containers.conf"))
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
        done = _run(["podman", "info"], env=env, check=False, timeout=60)
        if done.returncode != 0:
            errors.append(f"podman info: {_first_line(done)}")
        elif not shutil.which("docker-compose"):
            errors.append("podman: docker-compose (to drive its Docker API) is not installed")
        else:
            socket = tmp / "podman.sock"
            service = subprocess.Popen(["podman", "system", "service", "--time=0", f"unix://{socket}"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
            deadline = time.monotonic() + 30
            while not socket.exists() and time.monotonic() < deadline and service.poll() is None:
                time.sleep(0.2)
            if not socket.exists():
                embedded.stop_process(service, timeout=30)
                _unavailable(f"podman system service served no socket at {socket} within 30 s")
            return Engine("podman", ["docker-compose"], {**env, "DOCKER_HOST": f"unix://{socket}"}, service)
    else:
        errors.append("podman: not installed")
    _unavailable("no container engine: " + "; ".join(errors) + " (docs/operations.md, \"Compose for real\")")
    raise AssertionError("unreachable")


def _images() -> dict[str, str]:
    """The image variables: the environment's, else deploy/images/images.env's (make images)."""
    written = ROOT / "deploy" / "images" / "images.env"
    images = {}
    if written.exists():
        for line in written.read_text().splitlines():
            key, _, value = line.partition("=")
            if key in IMAGE_VARIABLES and value:
                images[key] = value
    images.update({key: os.environ[key] for key in IMAGE_VARIABLES if os.environ.get(key)})
    return images


def _defaults() -> dict[str, str]:
    """The images compose.yaml and the Dockerfile name when no variable is set."""
    text = (ROOT / "compose.yaml").read_text()
    found = dict(re.findall(r"\$\{((?:PYTHON|NATS|POSTGRES|PROMETHEUS)_IMAGE):-([^}]+)\}", text))
    assert set(found) == set(IMAGE_VARIABLES), found
    return found


def _qualified(engine: Engine, image: str) -> str:
    """The name compose's Docker API gives ``image``: podman's own CLI resolves no short name."""
    first, slash, _ = image.partition("/")
    if engine.name != "podman" or (slash and ("." in first or ":" in first or first == "localhost")):
        return image
    return f"docker.io/{image if '/' in image else 'library/' + image}"


def _have_images(engine: Engine, images: dict[str, str]) -> None:
    """Every image here (pulled if need be), else skipped (failed in CI) with the pull's error."""
    for key in IMAGE_VARIABLES:
        image = _qualified(engine, images.get(key) or _defaults()[key])
        if _run([engine.name, "image", "inspect", image], env=engine.env, check=False).returncode == 0:
            continue
        done = _run([engine.name, "pull", image], env=engine.env, check=False, timeout=600)
        if done.returncode != 0:
            _unavailable(f"{engine.name} pull {image} failed: {_first_line(done)} "
                         f"(where Docker Hub cannot be reached: make images)")


def _health_runner(stack: Stack, stop: threading.Event) -> None:
    """podman runs health checks from systemd timers; without systemd nothing runs them, so
    the test does (docker runs its own)."""
    while not stop.wait(2):
        try:
            for name, container in stack.containers().items():
                if container.get("State", {}).get("Running") and container.get("Config", {}).get("Healthcheck"):
                    _run(["podman", "healthcheck", "run", name], env=stack.env, check=False, timeout=60)
        except (AssertionError, subprocess.TimeoutExpired, ValueError):
            continue  # a container going as it was listed: the next round sees the rest


class Stack:
    """One compose project on the real files, with its host ports drawn here."""

    def __init__(self, engine: Engine, files: list[str]):
        self.engine, self.files = engine, files
        self.project = f"sbdeploy{uuid.uuid4().hex[:8]}"
        self.ports = {name: str(embedded.free_port("0.0.0.0"))
                      for name in ("NATS_PORT", "NATS_WS_PORT", "PROMETHEUS_PORT", "GRAFANA_PORT")}
        # The shard and web doors: a loopback port the engine picks for each replica.
        self.env = {**engine.env, **TOKENS, **self.ports, "SHARD_PORTS": "127.0.0.1:", "WEB_PORTS": "127.0.0.1:"}
        self.stop_health = threading.Event()
        self.health: threading.Thread | None = None

    def compose(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
        files = [arg for name in self.files for arg in ("-f", str(ROOT / name))]
        return _run([*self.engine.compose, "-p", self.project, *files, *args], env=self.env, timeout=timeout,
                    check=check)

    def containers(self) -> dict[str, dict[str, Any]]:
        done = _run([self.engine.name, "ps", "-a", "--filter", f"label=com.docker.compose.project={self.project}",
                     "--format", "{{.Names}}"], env=self.env)
        names = done.stdout.split()
        if not names:
            return {}
        inspected = _run([self.engine.name, "inspect", *names], env=self.env, check=False)
        return {c["Name"].lstrip("/"): c for c in json.loads(inspected.stdout or "[]")}

    def container(self, service: str, index: int = 1) -> str:
        for name, c in self.containers().items():
            labels = c["Config"]["Labels"]
            if (labels["com.docker.compose.service"], labels["com.docker.compose.container-number"]) == (
                    service, str(index)):
                return name
        raise AssertionError(f"no container {service} #{index} in {self.project}")

    def exec(self, service: str, index: int, *command: str, timeout: float = 60) -> str:
        """The engine's own exec (``docker-compose exec`` through podman's Docker API leaves two
        conmon processes behind each time)."""
        return _run([self.engine.name, "exec", self.container(service, index), *command], env=self.env,
                    timeout=timeout).stdout

    def host_port(self, service: str, index: int, port: int) -> int:
        out = self.compose("port", "--index", str(index), service, str(port), timeout=60).stdout.strip()
        return int(out.rsplit(":", 1)[1])

    def up(self, scaled: dict[str, int]) -> None:
        if self.engine.name == "podman" and not Path("/run/systemd/system").exists():
            self.health = threading.Thread(target=_health_runner, args=(self, self.stop_health), daemon=True)
            self.health.start()
        self.compose("up", "-d", *[a for s, n in scaled.items() for a in ("--scale", f"{s}={n}")], timeout=900)
        _wait_healthy(self, len(self.running_services()) + sum(n - 1 for n in scaled.values()))

    def running_services(self) -> set[str]:
        """The services ``up`` starts and keeps running: all but the profiles' and migrate."""
        merged: dict[str, dict[str, Any]] = {}
        for name in self.files:
            for service, spec in yaml.safe_load((ROOT / name).read_text())["services"].items():
                merged.setdefault(service, {}).update(spec)
        return {service for service, spec in merged.items() if not spec.get("profiles")} - {"migrate"}

    def down(self) -> None:
        """Everything of the project removed; fails when a container, volume or network is left."""
        self.stop_health.set()
        if self.health is not None:
            self.health.join(timeout=120)
        self.compose("down", "-v", "--remove-orphans", "-t", "10", timeout=300, check=False)
        label = f"label=com.docker.compose.project={self.project}"
        left = {kind: _run([self.engine.name, kind, "ls", "-q", "--filter", label], env=self.env,
                           check=False).stdout.split() for kind in ("volume", "network")}
        left["container"] = _run([self.engine.name, "ps", "-aq", "--filter", label], env=self.env,
                                 check=False).stdout.split()
        assert not any(left.values()), f"left behind by {self.project}: {left}"


def _wait_healthy(stack: Stack, expected: int) -> None:
    """Every running container (all but the one-shot migrate) healthy, ``expected`` of them."""
    deadline = time.monotonic() + UP_TIMEOUT_S
    while True:
        states = {name: (c["Config"]["Labels"]["com.docker.compose.service"],
                         (c["State"].get("Health") or {}).get("Status") or c["State"]["Status"])
                  for name, c in stack.containers().items()}
        running = [status for service, status in states.values() if service != "migrate"]
        if len(running) == expected and set(running) == {"healthy"}:
            return
        if time.monotonic() > deadline:
            logs = stack.compose("logs", "--tail", "30", timeout=120, check=False).stdout[-6000:]
            raise AssertionError(f"not {expected} healthy within {UP_TIMEOUT_S} s: {states}\n{logs}")
        time.sleep(3)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """The engine, the images there and the shardbus image built; no conmon left at the end."""
    before = _conmons()
    engine = _find_engine(tmp_path_factory.mktemp("compose-engine"))
    try:
        images = _images()
        _have_images(engine, images)
        engine.env = {**engine.env, **images}
        build = Stack(engine, ["compose.yaml"])
        image = _qualified(engine, "shardbus:latest")
        previous = _run([engine.name, "image", "inspect", "--format", "{{.Id}}", image], env=engine.env,
                        check=False).stdout.strip()
        started = time.monotonic()
        build.compose("build", timeout=1200)
        print(f"shardbus image built in {time.monotonic() - started:.0f} s")
        # The image this build replaced (the code changed): removed, so runs do not pile them up.
        if previous and previous != _run([engine.name, "image", "inspect", "--format", "{{.Id}}", image],
                                         env=engine.env).stdout.strip():
            _run([engine.name, "rmi", previous], env=engine.env, check=False)
        yield engine
    finally:
        engine.stop()
    deadline = time.monotonic() + 60
    while (left := _conmons() - before) and time.monotonic() < deadline:
        time.sleep(1)
    assert not left, f"conmon processes left behind: {sorted(left)}"


@pytest.fixture(scope="module")
def stack(engine: Engine) -> Iterator[Stack]:
    """compose.yaml up with SCALED's replicas, every container healthy."""
    stack = Stack(engine, ["compose.yaml"])
    try:
        stack.up(SCALED)
        yield stack
    finally:
        stack.down()


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
    out = stack.exec("installer", 1, "python3", "-c", SCRAPE, service)
    parts = re.split(r"^## (\S+)$", out, flags=re.M)[1:]
    return dict(zip(parts[::2], parts[1::2], strict=True))


def _value(body: str, series: str) -> float:
    total = 0.0
    for line in body.splitlines():
        if line.startswith(series) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


class Shards:
    """Simulated shards (``shardbus shard-sim``) on the host, each to a gateway host port,
    stopped by their handles."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, port: int, shard: str, *options: str) -> None:
        """``options``: more of shard-sim's, e.g. ``--tls-ca FILE`` (tests/deploy/test_compose_tls.py)."""
        env = {**os.environ, "SHARDBUS_SHARD_TOKEN": TOKENS["SHARD_TOKEN"]}
        self.procs.append(subprocess.Popen(
            [str(Path(sys.executable).with_name("shardbus")), "shard-sim", "--addr", f"127.0.0.1:{port}",
             "--shard", shard, *options], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def stop(self) -> None:
        for proc in self.procs:
            embedded.stop_process(proc, timeout=10)


@pytest.fixture
def shards() -> Iterator[Shards]:
    shards = Shards()
    try:
        yield shards
    finally:
        shards.stop()


def _wait_for_shards(stack: Stack, per_replica: int, timeout: float = 120) -> dict[str, str]:
    """The gateways' scrapes once every replica reports ``per_replica`` shards with frames in."""
    deadline = time.monotonic() + timeout
    while True:
        gateways = _scrape(stack, "gateway")
        if all(_value(body, "shardbus_gateway_shards_connected") >= per_replica
               and _value(body, "shardbus_gateway_frames_in_total") >= 1 for body in gateways.values()):
            return gateways
        assert time.monotonic() < deadline, {a: _value(b, "shardbus_gateway_shards_connected")
                                             for a, b in gateways.items()}
        time.sleep(2)


def _command(stack: Stack, shard: str, timeout: float = 120, tls: ssl.SSLContext | None = None) -> int:
    """A command through the web door's host port (replica 1) to ``shard``: its HTTP status,
    asked again while the door answers 503 or 504 (no gateway holds the shard yet, nobody
    answered: docs/web.md), as a website would, until ``timeout``. With ``tls``, over HTTPS
    verified with that context."""
    port = stack.host_port("web", 1, 8080)
    request = urllib.request.Request(f"{'https' if tls else 'http'}://127.0.0.1:{port}/shards/{shard}/items",
                                     headers={"Authorization": "Bearer " + TOKENS["WEB_TOKEN"]})
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(request, timeout=30, context=tls) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as error:
            body = error.read().decode(errors="replace")[:500]
            if error.code not in (503, 504) or time.monotonic() > deadline:
                raise AssertionError(f"{request.full_url}: {error.code} {body}") from error
        time.sleep(2)


def test_compose_up_scaled_serves_frames_commands_and_metrics(stack, shards):
    # A shard on each gateway replica, through that replica's own host port; then a command from
    # the web door reaches one of them through NATS whichever gateway holds it.
    for index in range(1, SCALED["gateway"] + 1):
        shards.start(stack.host_port("gateway", index, 2595), f"uo{index}")
    gateways = _wait_for_shards(stack, 1)
    assert _command(stack, "uo1") == 200

    gateways = _scrape(stack, "gateway")
    assert len(gateways) == SCALED["gateway"]
    assert sum(_value(body, 'shardbus_gateway_commands_total{status="200"}') for body in gateways.values()) >= 1
    for service in ("gateway", "ledger", "cleanup", "installer", "web"):
        bodies = _scrape(stack, service)
        assert len(bodies) == SCALED.get(service, 1), (service, list(bodies))
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
    stack.compose("--profile", "monitoring", "up", "-d", "--no-deps", "prometheus", timeout=300)
    expected = {service: SCALED.get(service, 1) for service in ("gateway", "ledger", "cleanup", "installer", "web")}
    deadline = time.monotonic() + 180
    while True:
        try:
            targets_text, rules_text = stack.exec("installer", 1, "python3", "-c", TARGETS).split("\n", 1)
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
    assert {rule["name"] for group in groups for rule in group["rules"] if rule["type"] == "alerting"} == ALERTS


MONITOR = """
import sys, urllib.request
print(urllib.request.urlopen("http://" + sys.argv[1] + ":8222/" + sys.argv[2], timeout=10).read().decode())
"""

NODE_SERVICES = {"nats-1": "nats", "nats-2": "nats-2", "nats-3": "nats-3"}


def _monitor(stack: Stack, node: str, path: str) -> dict[str, Any]:
    """A node's monitoring endpoint (deploy/nats/nats.conf's http_port), read from inside."""
    return dict(json.loads(stack.exec("installer", 1, "python3", "-c", MONITOR, node, path)))


def _frames(stack: Stack, node: str) -> dict[str, Any]:
    """The frames stream (services/gateway/streams.py) as ``node`` reports it."""
    jsz = _monitor(stack, node, "jsz?streams=true")
    streams = [s for a in jsz.get("account_details", []) for s in a.get("stream_detail", [])
               if s["name"] == "SHARD_FRAMES"]
    assert len(streams) == 1, jsz
    return dict(streams[0])


def test_the_cluster_file_takes_frames_and_commands_with_a_node_stopped(engine, shards):
    stack = Stack(engine, ["compose.yaml", "compose.cluster.yaml"])
    try:
        stack.up({})
        shards.start(stack.host_port("gateway", 1, 2595), "uo1")
        _wait_for_shards(stack, 1)
        assert _command(stack, "uo1") == 200
        # The node stopped: the frames stream's leader, unless the gateway's or the web door's
        # NATS connection is on it; then a node with neither (one of three at least, each service
        # holding one connection; else one without the gateway's). (A
        # gateway whose own node stops reconnects, but its frames were not seen stored within
        # 120 s after that here (docs/operations.md, "What CI runs"): a finding for the gateway,
        # not what this test of the compose files checks.)
        users = {node: {c.get("authorized_user") for c in _monitor(stack, node, "connz?auth=true")["connections"]}
                 for node in NODE_SERVICES}
        gateway_node = next(node for node, names in users.items() if "gateway" in names)
        free = ([node for node, names in users.items() if not names & {"gateway", "web"}]
                or [node for node, names in users.items() if "gateway" not in names])
        leader = _frames(stack, gateway_node)["cluster"]["leader"]
        stopped = leader if leader in free else free[0]
        stored = int(_frames(stack, gateway_node)["state"]["messages"])
        _run([engine.name, "stop", "-t", "10", stack.container(NODE_SERVICES[stopped])], env=stack.env, timeout=120)

        # With one node of three stopped, a second shard's hello is stored on the two left (R3
        # streams: a majority) and a command still reaches a shard.
        shards.start(stack.host_port("gateway", 1, 2595), "uo2")
        deadline = time.monotonic() + 120
        while (frames := _frames(stack, gateway_node))["state"]["messages"] <= stored:
            assert time.monotonic() < deadline, f"no frame stored after {stopped} stopped: {frames}"
            time.sleep(2)
        _wait_for_shards(stack, 2)
        assert _command(stack, "uo2") == 200
    finally:
        stack.down()
