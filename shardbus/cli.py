"""The ``shardbus`` command: ``up``, ``run SERVICE``, ``migrate``, ``healthcheck SERVICE``,
``status`` (``shardbus/status.py``), and the commands a service adds in its own
``commands.py`` (``register(subparsers)``, named in ``shardbus/registry.py``).

Run in a directory where ``shardbus up`` runs, every command but ``up`` takes the addresses and
tokens ``up`` wrote to ``.shardbus/env`` (``shardbus/stack_env.py``); variables set in the
environment win.

An outage is a sentence, never a traceback: a command that cannot reach NATS or the database
says so (without the URL's password) and exits 1; one whose NATS connection is lost while it
waits for an answer says that at once instead of waiting out its timeout
(``shared/nats_calls.py``). ``shardbus run`` ends within
``shardbus.process_stop.STOP_TIMEOUT_S`` of SIGTERM or Ctrl-C, whatever NATS does meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from shardbus import registry
from shardbus.process_stop import StopDeadline

DESCRIPTION = ("The bridge between game shards and their communities' websites, over NATS: run the whole "
               "system (up), one service (run), the ledger's migrations (migrate), and ask what is running "
               "(status).")
"""What ``shardbus --help`` says first: plain text (the docstring above is for readers of the code)."""

TEMPFAIL_EXIT_CODE = 75
"""How ``shardbus run`` exits when the service cannot go on because NATS or (the ledger's) database
is unreachable — e.g. at start (EX_TEMPFAIL: try again; compose and ``shardbus up`` restart it)."""


def _cmd_up(args: argparse.Namespace) -> int:
    from shardbus import stack_env
    from shardbus.stack import PORTS, requested_port, up

    ports: dict[str, int] = {}
    try:
        for key, (name, _what) in PORTS.items():
            ports[key] = requested_port(getattr(args, f"{key}_port"), name)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    state_dir = Path(args.state_dir) if args.state_dir else stack_env.state_dir()
    return up(state_dir, ports["shard"], args.replicas, args.nats_cluster, nats_port=ports["nats"],
              nats_ws_port=ports["nats_ws"], web_port=ports["web"], postgres_port=ports["postgres"],
              metrics_port=ports["metrics"])


def _replicas_arg(spec: str) -> dict[str, int]:
    from shardbus.stack import parse_replicas

    try:
        return parse_replicas(spec)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _nats_nodes_arg(value: str) -> int:
    if value not in {"1", "3", "5"}:
        raise argparse.ArgumentTypeError(f"{value!r}: a NATS cluster has 1, 3 or 5 nodes "
                                         "(an odd number, so a majority survives a lost node)")
    return int(value)


async def serve(app: Any, deadline: StopDeadline) -> None:
    """Run ``app`` until SIGTERM or SIGINT, arming ``deadline`` when one arrives."""
    loop = asyncio.get_running_loop()
    running = asyncio.ensure_future(app.run())
    await asyncio.sleep(0)  # run() installs FastStream's signal handlers first thing; ours replace them

    def stop(_sig: int) -> None:
        deadline.arm()
        app.exit()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop, sig)
    await running


def _nats_error(exc: BaseException, *, away_only: bool = False) -> bool:
    """Whether ``exc`` (every one, for a group) is nats-py's; with ``away_only``, one saying NATS
    or its JetStream is away (unreachable, closed, not answering) rather than refusing."""
    import nats.errors

    from shared.nats_calls import HELD_UP, is_away

    if isinstance(exc, BaseExceptionGroup):
        return all(_nats_error(e, away_only=away_only) for e in exc.exceptions)
    if not isinstance(exc, nats.errors.Error):  # not OSError: a database's too
        return False
    # A connection draining or reconnecting with its buffer full (HELD_UP) has never counted as
    # away here: such an end stays the traceback it always was (ADR 0010).
    return not away_only or (is_away(exc) and not isinstance(exc, HELD_UP))


def _database_outage(exc: BaseException) -> bool:
    from services.ledger.database.store import is_outage

    return is_outage(exc)


def _cmd_run(args: argparse.Namespace) -> int:
    from services.ledger.database.engine import safe_url
    from shared import logs
    from shared.metrics import MetricsPortUnavailable
    from shared.settings import CommonSettings
    from shared.tls import TLSConfigError

    settings = CommonSettings()
    logs.configure(args.service, settings.log_level)
    log = logging.getLogger("shardbus")
    app_module_name, _, create_app = registry.get(args.service).app.partition(":")
    app_module = importlib.import_module(app_module_name)
    deadline = StopDeadline(args.service)
    try:
        # A service may name its event loop (the web door runs on uvloop: its HTTP parsing and
        # socket writes are most of its CPU).
        with asyncio.Runner(loop_factory=getattr(app_module, "LOOP_FACTORY", None)) as runner:
            runner.run(serve(getattr(app_module, create_app)(), deadline))
    except KeyboardInterrupt:
        pass
    except Exception as exc:  # sorted below; anything else is re-raised
        if isinstance(exc, MetricsPortUnavailable | TLSConfigError):  # a setting, before any outage rule
            log.error(str(exc), extra={"exit_code": 1})
            return 1
        if deadline.armed and _nats_error(exc):  # NATS gone while stopping
            log.warning("stopped without a clean NATS drain", extra={"reason": repr(exc)})
        elif _nats_error(exc, away_only=True):  # e.g. JetStream away while the installer starts
            log.error("NATS is unreachable; exiting so the supervisor starts the service again",
                      extra={"reason": repr(exc), "exit_code": TEMPFAIL_EXIT_CODE})
            return TEMPFAIL_EXIT_CODE
        elif args.service == "ledger" and _database_outage(exc):  # e.g. the start's migration
            log.error("the database is unreachable; exiting so the supervisor starts the ledger again",
                      extra={"reason": type(exc).__name__, "database": safe_url(settings.database_url),
                             "exit_code": TEMPFAIL_EXIT_CODE})
            return TEMPFAIL_EXIT_CODE
        else:
            raise
    finally:
        deadline.disarm()
    return 0


def _cmd_migrate(args: argparse.Namespace) -> int:
    from services.ledger.database import migrate
    from services.ledger.database.engine import safe_url
    from services.ledger.database.store import is_outage
    from services.ledger.settings import LedgerSettings

    url = args.database_url or LedgerSettings().database_url
    try:
        revision = asyncio.run(migrate.upgrade(url))
    except Exception as exc:  # an outage is a sentence; anything else a traceback
        if not is_outage(exc):
            raise
        print(f"cannot reach the database at {safe_url(url)} ({type(exc).__name__}); nothing was "
              "migrated, try again when it is up", file=sys.stderr)
        return 1
    print(f"{safe_url(url)} is at revision {revision} (code head {migrate.head_revision()})")
    return 0


def _cmd_healthcheck(args: argparse.Namespace) -> int:
    from shared.health import health_file_is_fresh
    from shared.settings import CommonSettings

    path = CommonSettings().health_file
    if not path:
        print("SHARDBUS_HEALTH_FILE is not set", file=sys.stderr)
        return 2
    healthy = health_file_is_fresh(path)
    print(f"{args.service}: {'healthy' if healthy else 'unhealthy'}")
    return 0 if healthy else 1


def build_parser(stack: Any = None) -> argparse.ArgumentParser:
    """The argument parser, with every service's own commands registered; ``stack`` (a
    ``stack_env.StackEnv``) gives ``shard-sim`` the running stack's shard address."""
    parser = argparse.ArgumentParser(prog="shardbus", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="run the whole system on the embedded default")
    up.add_argument("--state-dir", default="",
                    help="where NATS and PostgreSQL keep data, and the env file other commands read "
                         "(default: $SHARDBUS_STATE_DIR, else .shardbus)")
    port_help = ("default: SHARDBUS_{name}, else the previous start's port when it is free, else a free "
                 "one; a port asked for must be free")
    for key, what in (("shard", "TCP port for shards; gateway replicas use the next ones"),
                      ("nats", "NATS client port; cluster nodes use the next ones"),
                      ("nats_ws", "NATS WebSocket port for browser pages; cluster nodes use the next ones"),
                      ("web", "the web door's HTTP port, shared by its replicas"),
                      ("postgres", "PostgreSQL's port"),
                      ("metrics", "the first process's /metrics port; the other processes use the next ones")):
        # the keys of shardbus.stack.PORTS
        up.add_argument(f"--{key.replace('_', '-')}-port", dest=f"{key}_port", type=int, default=None,
                        help=f"{what} ({port_help.format(name=key.upper() + '_PORT')})")
    up.add_argument("--replicas", type=_replicas_arg, default=None, metavar="SERVICE=N,…",
                    help="processes per service, e.g. gateway=2,ledger=2,cleanup=3,installer=2 (default 1 each)")
    up.add_argument("--nats-cluster", type=_nats_nodes_arg, default=1, metavar="N",
                    help="run N clustered nats-server nodes (1, 3 or 5), streams and buckets replicated N ways")
    up.set_defaults(func=_cmd_up)

    run = sub.add_parser("run", help="run one service against SHARDBUS_NATS_URL / SHARDBUS_DATABASE_URL")
    run.add_argument("service", choices=registry.NAMES)
    run.set_defaults(func=_cmd_run)

    mig = sub.add_parser("migrate", help="bring the ledger database to the newest schema")
    mig.add_argument("--database-url", default="", help="default: SHARDBUS_DATABASE_URL")
    mig.set_defaults(func=_cmd_migrate)

    health = sub.add_parser("healthcheck", help="exit 0 when this container's service is healthy")
    health.add_argument("service", choices=registry.NAMES)
    health.set_defaults(func=_cmd_healthcheck)

    from shardbus import status

    status.register(sub)

    for service in registry.SERVICES:
        if service.commands:
            importlib.import_module(service.commands).register(sub)
    from simulator import cli as simulator_cli

    simulator_cli.register(sub)
    if stack is not None and stack.running and stack.values.get("SHARD_ADDR"):
        sub.choices["shard-sim"].set_defaults(addr=stack.values["SHARD_ADDR"])
    return parser


def load_stack_env(command: str | None) -> Any:
    """The env file of ``shardbus up`` for this directory (``shardbus/stack_env.py``), applied to
    the environment when its stack runs (a variable already set wins). ``up`` itself reads none:
    it writes it. A stale file (its ``up`` is not running) is not used; ``status`` says so and
    refuses, the other commands say so in one line."""
    if command in (None, "up"):
        return None
    from shardbus import stack_env

    stack = stack_env.find()
    if stack is None:
        return None
    if stack.running:
        stack_env.apply(stack)
    elif command != "status":
        print(f"note: not using {stack.path}: the shardbus up that wrote it is not running", file=sys.stderr)
    return stack


def _command(argv: list[str]) -> str | None:
    """The subcommand named in ``argv`` (the first word not an option), before parsing."""
    return next((word for word in argv if not word.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``shardbus`` console script."""
    argv = sys.argv[1:] if argv is None else argv
    stack = load_stack_env(_command(argv))
    args = build_parser(stack).parse_args(argv)
    args.stack_env = stack
    return int(args.func(args) or 0)
