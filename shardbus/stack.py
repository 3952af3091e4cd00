"""``shardbus up``: the embedded default — a real nats-server (or a cluster of them) and
PostgreSQL from pip packages, the migrations, and the four services as child processes
(``--replicas``: several of each), supervised until Ctrl-C or SIGTERM, then stopped in
reverse order so no process is left behind."""

from __future__ import annotations

import asyncio
import fcntl
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from shardbus import embedded
from shardbus.cli import STOP_TIMEOUT_S
from shared.broker import health_file_is_fresh

SERVICES = ("gateway", "ledger", "cleanup", "installer")
"""Every service, in start order."""

DATABASE = "shardbus"
"""The database the embedded PostgreSQL keeps the ledger in."""


class AlreadyRunning(Exception):
    """Another ``shardbus up`` holds this state directory."""


def parse_replicas(spec: str) -> dict[str, int]:
    """``gateway=2,cleanup=3`` → processes per service (services not named run once).

    Raises ValueError naming what is wrong: an unknown service, a count that is not a
    positive integer, a service named twice, or a malformed item."""
    counts = {service: 1 for service in SERVICES}
    seen: set[str] = set()
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        service, sep, count = (x.strip() for x in item.partition("="))
        if not sep:
            raise ValueError(f"{item!r} is not SERVICE=COUNT (e.g. gateway=2)")
        if service not in counts:
            raise ValueError(f"unknown service {service!r}: choose from {', '.join(SERVICES)}")
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
    proc: subprocess.Popen | None = None
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
    replicas: dict[str, int] = field(default_factory=lambda: {service: 1 for service in SERVICES})
    nats_nodes: int = 1
    lock: IO[str] | None = None
    nats: embedded.NatsServer | embedded.NatsCluster | None = None
    postgres: embedded.PostgresServer | None = None
    children: list[Child] = field(default_factory=list)
    shard_token: str = ""
    shard_addrs: list[str] = field(default_factory=list)

    @property
    def shard_addr(self) -> str:
        """The first gateway's shard address."""
        return self.shard_addrs[0] if self.shard_addrs else ""

    def acquire(self) -> None:
        """Take the state directory, or raise AlreadyRunning."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        lock = open(self.state_dir / "up.lock", "a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            lock.close()
            raise AlreadyRunning(f"shardbus up is already running on {self.state_dir} (pid {holder})") from None
        lock.truncate(0)
        lock.write(str(os.getpid()))
        lock.flush()
        self.lock = lock

    def _token(self) -> str:
        path = self.state_dir / "shard_token"
        if not path.exists():
            path.write_text(secrets.token_urlsafe(24))
            path.chmod(0o600)
        return path.read_text().strip()

    def start(self, timeout: float = 60.0) -> None:
        """Start servers, migrate, start every service; return once all are healthy."""
        from services.ledger import migrate  # the CLI may import services; shared may not

        logs = self.state_dir / "logs"
        run = self.state_dir / "run"
        logs.mkdir(exist_ok=True)
        run.mkdir(exist_ok=True)
        self.shard_token = self._token()
        # The embedded default is durable: JetStream fsyncs each write before acknowledging it.
        if self.nats_nodes > 1:
            self.nats = embedded.start_nats_cluster(self.state_dir / "nats-cluster", self.nats_nodes,
                                                    durable=True)
        else:
            self.nats = embedded.start_nats(self.state_dir / "nats", durable=True)
        self.postgres = embedded.start_postgres(self.state_dir / "pg")
        self.postgres.create_database(DATABASE)
        database_url = self.postgres.url(DATABASE)
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
        # when one is given); a shard dials any of them.
        ports = [self.shard_port + i if self.shard_port else embedded.free_port()
                 for i in range(self.replicas["gateway"])]
        self.shard_addrs = [f"127.0.0.1:{port}" for port in ports]
        for service in SERVICES:
            for index in range(1, self.replicas[service] + 1):
                name = f"{service}-{index}"
                env = {**base, "SHARDBUS_HEALTH_FILE": str(run / f"{name}.health")}
                if service == "gateway":
                    env["SHARDBUS_SHARD_PORT"] = str(ports[index - 1])
                child = Child(service, index, env, logs / f"{name}.log", run / f"{name}.health")
                child.start()
                self.children.append(child)
        self._wait_healthy(timeout)

    def describe(self) -> str:
        """``gateway×2, ledger, …``: what runs, for the ready line."""
        return ", ".join(service if self.replicas[service] == 1 else f"{service}×{self.replicas[service]}"
                         for service in SERVICES)

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        waiting = list(self.children)
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
        # Each ends within shardbus.cli.STOP_TIMEOUT_S of its SIGTERM, NATS away or not; the
        # margin covers a loaded machine, then it is killed.
        for child in self.children:
            if child.proc:
                embedded.stop_process(child.proc, signal.SIGTERM, STOP_TIMEOUT_S + 2.0)
        if self.postgres:
            self.postgres.stop()
        if self.nats:
            self.nats.stop()
        if self.lock:
            self.lock.close()
            self.lock = None


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def up(state_dir: Path, shard_port: int = 0, replicas: dict[str, int] | None = None,
       nats_nodes: int = 1) -> int:
    """Run the embedded stack in the foreground until Ctrl-C or SIGTERM: ``replicas``
    processes per service (default one each), on one nats-server or a cluster of
    ``nats_nodes``."""
    stack = Stack(state_dir.resolve(), shard_port, replicas or {service: 1 for service in SERVICES},
                  nats_nodes)
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
        assert stack.nats and stack.postgres
        print(f"NATS_URL={stack.nats.url}")
        print(f"DATABASE_URL={stack.postgres.url(DATABASE)}")
        print(f"SHARD_ADDR={stack.shard_addr}")
        print(f"SHARD_TOKEN={stack.shard_token}")
        print(f"SHARD_ADDRS={','.join(stack.shard_addrs)}")
        print(f"shardbus is ready: {stack.describe()} running; logs in {stack.state_dir / 'logs'}; "
              "Ctrl-C stops everything.", flush=True)
        while True:
            time.sleep(1.0)
            for name in stack.supervise_once():
                print(f"restarted {name}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print("\nstopping …", flush=True)
    except Exception as exc:  # a start failure: say what, then stop what did start
        print(f"error: {exc}", file=sys.stderr, flush=True)
        rc = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stack.stop()
    print("stopped.", flush=True)
    return rc
