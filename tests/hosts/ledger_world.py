"""The ledger side of the hosts harness (docs/reliability.md, "Hosts", "The ledger cut from
PostgreSQL"): PostgreSQL on a host of its own, listening on that host's address and trusting the
hosts' private range; ``shardbus migrate`` run against it from a ledger's host; ledgers
(``shardbus run ledger``) and cleanups (``shardbus run cleanup``) each on a host of its own, all
listing the three NATS nodes of ``harness.start_cluster``. Every process is started through
``harness.Processes`` (so its ``stop_all`` stops each by its own handle) and waited on until it
answers or is healthy, each wait bounded."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from shardbus import embedded
from tests.hosts import harness
from tests.hosts.net import Host

PG_PORT = 5432
"""Every host has an address of its own, so PostgreSQL uses its usual port."""

METRICS_PORT = 9464
"""A ledger's Prometheus endpoint, on its host's address (the test reads its pool gauge)."""

DATABASE = "ledger"


def database_url(pg_host: Host, database: str = DATABASE) -> str:
    """SQLAlchemy URL (asyncpg driver) of ``database`` on the PostgreSQL host (trust auth)."""
    return f"postgresql+asyncpg://postgres@{pg_host.address}:{PG_PORT}/{database}"


def start_postgres(processes: harness.Processes, host: Host, workdir: Path, data_dir: Path, trusted: str,
                   timeout: float = 60.0) -> harness.Started:
    """PostgreSQL on ``host`` (initialised as the suite's tests/conftest.py does, through
    ``shardbus.embedded``: its own system user when root, trust auth), listening on the host's
    address only, ``pg_hba.conf`` trusting ``trusted`` (the hosts' private range, e.g.
    ``10.231.0.0/16``); fsync off, as for the suite's throw-away databases. Returns once
    ``pg_isready`` answers from the test's namespace and database ``ledger`` exists. The data go
    in ``data_dir``, not under pytest's basetemp, as tests/conftest.py's ``servers_dir`` says
    why (and another run's pytest resets its root to mode 0700, which shuts the server's own
    user out); its log in ``workdir``."""
    bin_dir = embedded._pg_bin()
    user = embedded._pg_user()
    pgdata = data_dir / "data"
    pgdata.mkdir(parents=True, exist_ok=True)
    if user:
        embedded._let_user_reach(pgdata, user)
    subprocess.run([str(bin_dir / "initdb"), "-D", str(pgdata), "--auth=trust", "--encoding=utf8", "-U", "postgres"],
                   check=True, capture_output=True, timeout=120, **embedded._run_as(user, pgdata))
    with open(pgdata / "pg_hba.conf", "a") as hba:
        hba.write(f"host all all {trusted} trust\n")
    argv = [str(bin_dir / "postgres"), "-D", str(pgdata), "-p", str(PG_PORT),
            "-c", f"listen_addresses={host.address}", "-c", "unix_socket_directories=",
            "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
            "-c", "max_connections=200"]
    if user:  # ``ip netns exec`` needs root; the server is then exec'd as its own user (same pid)
        argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *argv]
    log_path = workdir / "postgres.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(host.argv(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=pgdata.parent)
    started = harness.Started("postgres", host, proc, log_path)
    processes.started.append(started)
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"postgres exited with {proc.returncode}:\n{started.log()[-3000:]}")
        ready = subprocess.run([str(bin_dir / "pg_isready"), "-h", host.address, "-p", str(PG_PORT),
                                "-U", "postgres", "-t", "1"], capture_output=True, check=False, timeout=10)
        if ready.returncode == 0:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"postgres not ready within {timeout} s:\n{started.log()[-3000:]}")
        time.sleep(0.2)
    subprocess.run([str(bin_dir / "createdb"), "-h", host.address, "-p", str(PG_PORT), "-U", "postgres", DATABASE],
                   check=True, capture_output=True, timeout=60)
    return started


def migrate(host: Host, url: str, workdir: Path, timeout: float = 120.0) -> str:
    """``shardbus migrate`` run on ``host`` (so across the bridge, as an operator would); its
    output."""
    done = subprocess.run(host.argv([sys.executable, "-m", "shardbus", "migrate", "--database-url", url]),
                          capture_output=True, text=True, timeout=timeout, env=_env(workdir), check=False)
    if done.returncode != 0:
        raise RuntimeError(f"shardbus migrate exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done.stdout.strip()


def _env(workdir: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}


def start_service(processes: harness.Processes, service: str, host: Host, nodes: list[harness.Node],
                  workdir: Path, timeout: float = 90.0, **settings: str) -> harness.Started:
    """``shardbus run <service>`` on ``host``, listing every NATS node; returns once its health
    file is fresh. ``settings`` become ``SHARDBUS_<KEY>``."""
    name = f"{service}-{host.name}"
    health = workdir / f"{name}.health"
    env = {**_env(workdir), "SHARDBUS_NATS_URL": ",".join(n.url for n in nodes),
           "SHARDBUS_HEALTH_FILE": str(health), "SHARDBUS_RECONNECT_WAIT_S": "0.2",
           "SHARDBUS_RECONNECT_WAIT_MAX_S": "1", "SHARDBUS_METRICS_PORT": "0", "SHARDBUS_JETSTREAM_REPLICAS": "3"}
    env.update({f"SHARDBUS_{key.upper()}": value for key, value in settings.items()})
    started = processes.start(name, host, [sys.executable, "-m", "shardbus", "run", service], env)
    return harness.wait_healthy(started, health, timeout)


def start_ledger(processes: harness.Processes, host: Host, nodes: list[harness.Node], url: str,
                 workdir: Path, **settings: str) -> harness.Started:
    """A ledger on ``host`` with its Prometheus endpoint on the host's address
    (``METRICS_PORT``)."""
    return start_service(processes, "ledger", host, nodes, workdir, database_url=url,
                         metrics_host=host.address, metrics_port=str(METRICS_PORT), **settings)


def pool_in_use(host: Host, timeout: float = 1.0) -> int:
    """The connections the ledger on ``host`` has taken from its pool right now (its
    ``shardbus_ledger_pool_connections{state="in_use"}``): a statement in flight; -1 when
    unreadable."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{host.address}:{METRICS_PORT}/metrics", timeout=timeout) as reply:
            text = reply.read().decode()
    except OSError:
        return -1
    for line in text.splitlines():
        if line.startswith('shardbus_ledger_pool_connections{state="in_use"}'):
            return int(float(line.split()[-1]))
    return -1
