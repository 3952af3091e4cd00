"""``shardbus up``: the embedded default — a real nats-server (or a cluster of them) and
PostgreSQL from pip packages, the migrations, and the five services as child processes
(``--replicas``: several of each), supervised until Ctrl-C or SIGTERM, then stopped in
reverse order so no process is left behind.

Ports (NATS, its WebSocket listener, the shard listeners, the web door, PostgreSQL) are kept
in ``<state>/ports.json`` and taken again at the next start when they are free, so the
addresses a shard plugin or a website was given survive a restart; a port asked for
(``--shard-port``, ``SHARDBUS_SHARD_PORT``, …) that is taken stops the start with one line
naming it. What ``up`` prints is also written to ``<state>/env`` (mode 0600), which the other
``shardbus`` commands read (``shardbus/stack_env.py``). A slow step says what it waits for.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import IO

from shardbus import embedded, registry, stack_env
from shardbus.process_stop import STOP_TIMEOUT_S
from shared.errors import ShardbusError
from shared.health import health_file_is_fresh

DATABASE = "shardbus"
"""The database the embedded PostgreSQL keeps the ledger in."""

SIMULATOR_SHARD = "uo1"
"""The shard ``shardbus shard-sim`` says hello as by default (README's second terminal): the
web door's bare sidecar paths (``/guilds``, ``/lease`` …) reach it."""

PORTS_FILE = "ports.json"
"""Where the ports of the last start are kept, in the state directory."""

PORTS = {
    # key in ports.json: (make variable / flag name, what listens there)
    "nats": ("NATS_PORT", "the NATS client port"),
    "nats_ws": ("NATS_WS_PORT", "the NATS WebSocket listener"),
    "shard": ("SHARD_PORT", "the shard listener"),
    "web": ("WEB_PORT", "the web door"),
    "postgres": ("POSTGRES_PORT", "PostgreSQL"),
    "metrics": ("METRICS_PORT", "the services' metrics endpoints"),
}
"""The ports ``up`` takes. Each can be asked for with ``--<name>-port``, ``SHARDBUS_<NAME>_PORT``
or ``make up <NAME>_PORT=…``."""

WAIT_NOTICE_VARIABLE = "SHARDBUS_UP_WAIT_NOTICE_S"
"""Seconds a start step may take before ``up`` says what it is waiting for (default 2)."""

WAIT_NOTICE_S = 2.0
WAIT_NOTICE_EVERY_S = 5.0
"""Then it says it again this often, with the time waited so far."""


class AlreadyRunning(ShardbusError):
    """Another ``shardbus up`` holds this state directory."""

    status = HTTPStatus.CONFLICT


class PortTaken(ShardbusError):
    """A port asked for cannot be had; the message is the one line to print."""

    status = HTTPStatus.CONFLICT


def requested_port(flag: int | None, name: str) -> int:
    """The port asked for: the flag, else ``SHARDBUS_<NAME>_PORT``, else 0 (none).
    Raises ValueError for a variable that is not a port number."""
    if flag is not None:
        value = str(flag)
        source = f"--{name.lower().replace('_', '-')}"
    else:
        value = os.environ.get(f"SHARDBUS_{name}", "").strip()
        source = f"SHARDBUS_{name}"
    if not value:
        return 0
    if not value.isdigit() or int(value) > 65535:
        raise ValueError(f"{source}={value}: a port is a whole number from 1 to 65535 (0: any free one)")
    return int(value)


class Waiting:
    """Says what the start is waiting for once a step is slow: first after ``after_s``, then every
    :data:`WAIT_NOTICE_EVERY_S`, with the time waited (``waiting for PostgreSQL to accept
    connections (5 s)…``). ``what`` may be a callable, read at each notice. Silent without ``say``."""

    def __init__(self, say: Callable[[str], None] | None, what: str | Callable[[], str],
                 after_s: float | None = None) -> None:
        self.say, self.what = say, what
        self.after_s = notice_after_s() if after_s is None else after_s
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Waiting:
        if self.say is not None:
            self._thread = threading.Thread(target=self._run, daemon=True, name="up-waiting")
            self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        started = time.monotonic()
        next_at = self.after_s
        while not self._done.wait(max(0.0, next_at - (time.monotonic() - started))):
            waited = time.monotonic() - started
            what = self.what() if callable(self.what) else self.what
            shown = f"{waited:.0f}" if waited >= 1 else f"{waited:.1f}"
            assert self.say is not None
            self.say(f"waiting for {what} ({shown} s)…")
            next_at += WAIT_NOTICE_EVERY_S


def notice_after_s() -> float:
    """``SHARDBUS_UP_WAIT_NOTICE_S``, else :data:`WAIT_NOTICE_S`."""
    try:
        return max(0.0, float(os.environ.get(WAIT_NOTICE_VARIABLE, "") or WAIT_NOTICE_S))
    except ValueError:
        return WAIT_NOTICE_S


def one_each() -> dict[str, int]:
    """One process per service (:data:`shardbus.registry.SERVICES`, in start order): the default."""
    return dict.fromkeys(registry.NAMES, 1)


def parse_replicas(spec: str) -> dict[str, int]:
    """``gateway=2,cleanup=3`` → processes per service (services not named run once).

    Raises ValueError naming what is wrong: an unknown service, a count that is not a
    positive integer, a service named twice, or a malformed item."""
    counts = one_each()
    seen: set[str] = set()
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        service, sep, count = (x.strip() for x in item.partition("="))
        if not sep:
            raise ValueError(f"{item!r} is not SERVICE=COUNT (e.g. gateway=2)")
        if service not in counts:
            raise ValueError(f"unknown service {service!r}: choose from {', '.join(registry.NAMES)}")
        if service in seen:
            raise ValueError(f"{service} is named twice")
        if not count.isdigit() or int(count) < 1:
            raise ValueError(f"{service}={count}: the count must be a positive whole number")
        counts[service] = int(count)
        seen.add(service)
    return counts


@dataclass
class Child:
    """One service process of the stack."""

    service: str
    index: int
    env: dict[str, str]
    log_path: Path
    health_path: Path
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0

    @property
    def name(self) -> str:
        return f"{self.service}-{self.index}"

    def start(self) -> None:
        self.health_path.unlink(missing_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "shardbus", "run", self.service], env=self.env,
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=embedded._die_with_parent)


@dataclass
class Stack:
    """The running embedded stack and everything needed to stop it."""

    state_dir: Path
    shard_port: int = 0
    replicas: dict[str, int] = field(default_factory=one_each)
    nats_nodes: int = 1
    nats_port: int = 0
    nats_ws_port: int = 0
    web_port: int = 0
    postgres_port: int = 0
    metrics_port: int = 0
    say: Callable[[str], None] | None = None
    """Where the start says what it waits for and which previous port it could not keep (None: silent)."""
    lock: IO[str] | None = None
    nats: embedded.NatsServer | embedded.NatsCluster | None = None
    postgres: embedded.PostgresServer | None = None
    children: list[Child] = field(default_factory=list)
    shard_token: str = ""
    shard_addrs: list[str] = field(default_factory=list)
    web_token: str = ""
    web_operator_token: str = ""
    ports: dict[str, list[int]] = field(default_factory=dict)
    """The ports this start took, by :data:`PORTS` key."""

    @property
    def shard_addr(self) -> str:
        """The first gateway's shard address."""
        return self.shard_addrs[0] if self.shard_addrs else ""

    @property
    def web_url(self) -> str:
        """The web door's HTTP address (every replica shares its port)."""
        return f"http://127.0.0.1:{self.ports['web'][0]}" if self.ports.get("web") else ""

    def acquire(self, wait_s: float = 1.0) -> None:
        """Take the state directory, or raise AlreadyRunning. Tries for ``wait_s``: a command
        checking whether a stack runs here (``stack_env.holder``) holds the lock for an instant."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        lock = open(self.state_dir / stack_env.LOCK_FILE, "a+")  # noqa: SIM115 — held (locked) while the stack runs
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                lock.seek(0)
                holder = lock.read().strip() or "another process"
                lock.close()
                raise AlreadyRunning(f"shardbus up is already running on {self.state_dir} (pid {holder})") from None
        lock.truncate(0)
        lock.write(str(os.getpid()))
        lock.flush()
        self.lock = lock

    def _secret(self, name: str) -> str:
        """A token kept in the state directory (readable by its owner only), made on first use."""
        path = self.state_dir / name
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(24))
        return path.read_text().strip()

    def _token(self) -> str:
        return self._secret("shard_token")

    def _note(self, line: str) -> None:
        if self.say is not None:
            self.say(line)

    def _previous_ports(self) -> dict[str, list[int]]:
        try:
            data = json.loads((self.state_dir / PORTS_FILE).read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {key: [p for p in value if isinstance(p, int) and 0 < p <= 65535]
                for key, value in data.items() if key in PORTS and isinstance(value, list)}

    def plan_ports(self) -> dict[str, list[int]]:
        """Choose every port before anything starts: the one asked for (taken: :class:`PortTaken`),
        else the previous start's when it is free, else a free one; keep the choice in
        ``ports.json`` for the next start."""
        # shape: one pass over every port in the order they must be chosen (asked, previous, fresh), each
        # rule needing what the ones before took.
        asked = {"nats": self.nats_port, "nats_ws": self.nats_ws_port, "shard": self.shard_port,
                 "web": self.web_port, "postgres": self.postgres_port, "metrics": self.metrics_port}
        counts = {"nats": self.nats_nodes, "nats_ws": self.nats_nodes, "shard": self.replicas["gateway"],
                  "web": 1, "postgres": 1, "metrics": sum(self.replicas[s] for s in registry.NAMES)}
        previous = self._previous_ports()
        avoid = {port for ports in previous.values() for port in ports}  # kept for their own use
        taken: dict[int, str] = {}
        plan: dict[str, list[int]] = {}
        # Ports asked for first, so that no other choice can take one of them.
        for key in sorted(PORTS, key=lambda k: not asked[k]):
            name, what = PORTS[key]
            ports: list[int] = []
            for i in range(counts[key]):
                if asked[key]:
                    port = asked[key] + i
                    whose = {"shard": "gateway replica", "metrics": "process"}.get(key, "NATS node")
                    label = name if i == 0 else f"{name}+{i}: {whose} {i + 1}"
                    if port in taken:
                        raise PortTaken(f"port {port} ({label}) is asked for twice: also as {taken[port]}")
                    if not embedded.port_is_free(port):
                        raise PortTaken(f"port {port} ({label}, {what}) is taken: something already listens on "
                                        f"127.0.0.1:{port}; stop it or choose another ({name}=…)")
                    embedded.hold_port(port)  # ours now: the next start may take it back
                else:
                    before = previous.get(key, [])
                    old = before[i] if i < len(before) else 0
                    if old and old not in taken and embedded.claim_port(old):
                        port = old
                    else:
                        while (port := embedded.free_port()) in taken or port in avoid:
                            pass
                        if old:
                            self._note(f"note: {what}'s previous port {old} is taken; using {port} this time")
                taken[port] = name
                ports.append(port)
            plan[key] = ports
        self.ports = plan
        (self.state_dir / PORTS_FILE).write_text(json.dumps(plan, indent=1) + "\n")
        return plan

    def start(self, timeout: float = 60.0) -> None:
        """Start servers, migrate, start every service; return once all are healthy."""
        from services.ledger.database import migrate  # the CLI may import services; shared may not

        # shape: the start's steps in the order they happen (servers, database, migrations, children),
        # read top to bottom as the operator sees them printed.
        logs = self.state_dir / "logs"
        run = self.state_dir / "run"
        logs.mkdir(exist_ok=True)
        run.mkdir(exist_ok=True)
        ports = self.plan_ports()
        self.shard_token = self._token()
        self.web_token = self._secret("web_token")
        self.web_operator_token = self._secret("web_operator_token")
        # The embedded default is durable: JetStream fsyncs each write before acknowledging it.
        if self.nats_nodes > 1:
            with Waiting(self.say, f"{self.nats_nodes} NATS nodes to start and elect a JetStream leader"):
                self.nats = embedded.start_nats_cluster(self.state_dir / "nats-cluster", self.nats_nodes,
                                                        durable=True, client_ports=ports["nats"],
                                                        websocket_ports=ports["nats_ws"],
                                                        avoid=tuple(p for ps in ports.values() for p in ps))
        else:
            with Waiting(self.say, "NATS to accept connections"):
                self.nats = embedded.start_nats(self.state_dir / "nats", port=ports["nats"][0], durable=True,
                                                websocket_port=ports["nats_ws"][0])
        pgdata = self.state_dir / "pg"
        first = not (pgdata / "PG_VERSION").exists()
        with Waiting(self.say, "PostgreSQL to " + ("create its data directory and " if first else "")
                     + "accept connections"):
            self.postgres = embedded.start_postgres(pgdata, port=ports["postgres"][0])
        with Waiting(self.say, f"PostgreSQL to create the database {DATABASE!r}"):
            self.postgres.create_database(DATABASE)
        database_url = self.postgres.url(DATABASE)
        with Waiting(self.say, "the ledger's database migrations"):
            asyncio.run(migrate.upgrade(database_url))
        base = {
            **os.environ,
            "SHARDBUS_NATS_URL": self.nats.url,
            "SHARDBUS_DATABASE_URL": database_url,
            "SHARDBUS_SHARD_TOKEN": self.shard_token,
            "SHARDBUS_SHARD_HOST": "127.0.0.1",
            "SHARDBUS_MIGRATE_ON_START": "false",
            # Installer replicas share one modules dir; their NATS KV site lock orders them.
            "SHARDBUS_MODULES_DIR": str(self.state_dir / "modules"),
            "SHARDBUS_RECONNECT_WAIT_S": "0.25",
            "SHARDBUS_RECONNECT_WAIT_MAX_S": "2",
            # Every stream and bucket is kept on as many nodes as there are (at most 5).
            "SHARDBUS_JETSTREAM_REPLICAS": str(min(self.nats_nodes, 5)),
        }
        # Each gateway replica listens on its own shard port (consecutive from --shard-port
        # when one is given); a shard dials any of them. The web replicas share one port
        # (SO_REUSEPORT: the kernel spreads connections over them).
        self.shard_addrs = [f"127.0.0.1:{port}" for port in ports["shard"]]
        web = {
            "SHARDBUS_WEB_HOST": "127.0.0.1",
            "SHARDBUS_WEB_PORT": str(ports["web"][0]),
            "SHARDBUS_WEB_TOKEN": self.web_token,
            "SHARDBUS_WEB_OPERATOR_TOKEN": self.web_operator_token,
            "SHARDBUS_WEB_DEFAULT_SHARD": SIMULATOR_SHARD,
        }
        # Each process serves /metrics on a port of its own, in the order the children start.
        metrics_ports = iter(ports["metrics"])
        for service in registry.NAMES:
            for index in range(1, self.replicas[service] + 1):
                name = f"{service}-{index}"
                env = {**base, "SHARDBUS_HEALTH_FILE": str(run / f"{name}.health"),
                       "SHARDBUS_METRICS_HOST": "127.0.0.1", "SHARDBUS_METRICS_PORT": str(next(metrics_ports))}
                if service == "gateway":
                    env["SHARDBUS_SHARD_PORT"] = str(ports["shard"][index - 1])
                if service == "web":
                    env.update(web)
                child = Child(service, index, env, logs / f"{name}.log", run / f"{name}.health")
                child.start()
                self.children.append(child)
        self._wait_healthy(timeout)

    def describe(self) -> str:
        """``gateway×2, ledger, …``: what runs, for the ready line."""
        return ", ".join(service if self.replicas[service] == 1 else f"{service}×{self.replicas[service]}"
                         for service in registry.NAMES)

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        waiting = list(self.children)

        def what() -> str:
            names = [c.name for c in list(waiting)]
            shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
            return f"{shown} to report healthy (logs in {self.state_dir / 'logs'})"

        with Waiting(self.say, what):
            while waiting:
                for child in list(waiting):
                    if child.proc and child.proc.poll() is not None:
                        raise RuntimeError(f"{child.name} exited with {child.proc.returncode}; "
                                           f"see {child.log_path}:\n{_tail(child.log_path)}")
                    if health_file_is_fresh(str(child.health_path)):
                        waiting.remove(child)
                if time.monotonic() > deadline:
                    names = ", ".join(c.name for c in waiting)
                    raise TimeoutError(f"not healthy within {timeout:.0f} s: {names}")
                time.sleep(0.1)

    def printed(self) -> dict[str, str]:
        """What ``up`` prints once ready, and writes to the env file: addresses and tokens."""
        from services.gateway.settings import PROTOCOL_VERSION

        assert self.nats and self.postgres
        return {
            "NATS_URL": self.nats.url,
            "NATS_WS_URL": self.nats.ws_url,
            "DATABASE_URL": self.postgres.url(DATABASE),
            "SHARD_ADDR": self.shard_addr,
            "SHARD_TOKEN": self.shard_token,
            "SHARD_ADDRS": ",".join(self.shard_addrs),
            "WEB_URL": self.web_url,
            "WEB_WS_URL": self.web_url.replace("http://", "ws://", 1) + "/ws",
            "WEB_TOKEN": self.web_token,
            "WEB_OPERATOR_TOKEN": self.web_operator_token,
            "CONSOLE_URL": self.web_url + "/console",
            "PROTOCOL": str(PROTOCOL_VERSION),
            "METRICS_URLS": ",".join(self.metrics_urls),
        }

    @property
    def metrics_urls(self) -> list[str]:
        """Every process's Prometheus endpoint, in the order the children start."""
        return [f"http://127.0.0.1:{port}/metrics" for port in self.ports.get("metrics", [])]

    def supervise_once(self) -> list[str]:
        """Restart any service that died; returns the names restarted."""
        restarted = []
        for child in self.children:
            if child.proc and (code := child.proc.poll()) is not None:
                child.restarts += 1
                child.start()
                restarted.append(f"{child.name} (it exited with {code})")
        return restarted

    def stop(self) -> None:
        """Stop services, then PostgreSQL, then NATS; release the state directory."""
        for child in self.children:
            if child.proc and child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
        # Each ends within STOP_TIMEOUT_S of its SIGTERM, NATS away or not; the
        # margin covers a loaded machine, then it is killed.
        for child in self.children:
            if child.proc:
                embedded.stop_process(child.proc, signal.SIGTERM, STOP_TIMEOUT_S + 2.0)
        # The servers depend on no one any more: all are told at once, so stopping takes the
        # slowest one's time, not the sum of their times.
        told = [(self.postgres.proc, signal.SIGINT)] if self.postgres else []
        if isinstance(self.nats, embedded.NatsCluster):
            told += [(node.proc, signal.SIGTERM) for node in self.nats.nodes]
        elif self.nats:
            told.append((self.nats.proc, signal.SIGTERM))
        for proc, how in told:
            if proc.poll() is None:
                proc.send_signal(how)
        if self.postgres:
            self.postgres.stop()
        if self.nats:
            self.nats.stop()
        if self.lock:
            self.lock.close()
            self.lock = None


def _who_reads(state_dir: Path) -> str:
    """Which ``shardbus`` commands find this stack's env file by themselves."""
    here = Path.cwd().resolve()
    if state_dir == (here / stack_env.DEFAULT_STATE_DIR).resolve():
        return f"every shardbus command run in {here} reads it"
    return f"shardbus commands read it with {stack_env.STATE_DIR_VARIABLE}={state_dir}"


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _say(line: str) -> None:
    print(line, flush=True)


def up(state_dir: Path, shard_port: int = 0, replicas: dict[str, int] | None = None,
       nats_nodes: int = 1, *, nats_port: int = 0, nats_ws_port: int = 0, web_port: int = 0,
       postgres_port: int = 0, metrics_port: int = 0) -> int:
    """Run the embedded stack in the foreground until Ctrl-C or SIGTERM: ``replicas``
    processes per service (default one each), on one nats-server or a cluster of
    ``nats_nodes``; a port given (non-zero) must be free."""
    stack = Stack(state_dir.resolve(), shard_port, replicas or one_each(),
                  nats_nodes, nats_port=nats_port, nats_ws_port=nats_ws_port, web_port=web_port,
                  postgres_port=postgres_port, metrics_port=metrics_port, say=_say)
    try:
        stack.acquire()
    except AlreadyRunning as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1

    def on_sigterm(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    rc = 0
    try:
        print(f"starting shardbus in {stack.state_dir} …", flush=True)
        stack.start()
        lines = stack.printed()
        for key, value in lines.items():
            print(f"{key}={value}")
        env_file = stack_env.write(stack.state_dir, lines, os.getpid())
        print(f"(also in {env_file}, mode 0600: {_who_reads(stack.state_dir)})")
        print(f"shardbus is ready: {stack.describe()} running; logs in {stack.state_dir / 'logs'}; "
              "Ctrl-C stops everything.", flush=True)
        while True:
            time.sleep(1.0)
            for name in stack.supervise_once():
                print(f"restarted {name}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print("\nstopping …", flush=True)
    except Exception as exc:  # noqa: BLE001 — any start failure: say what, then stop what did start
        print(f"error: {exc}", file=sys.stderr, flush=True)
        rc = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stack.stop()
    print("stopped.", flush=True)
    return rc
