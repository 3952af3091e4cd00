"""The ``shardbus`` command: ``up``, ``run SERVICE``, ``migrate``, ``healthcheck SERVICE``,
``status`` (``shardbus/status.py``), and the commands each service adds in its own
``commands.py`` (``register(subparsers)``)."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
from pathlib import Path

SERVICES = ("gateway", "ledger", "cleanup", "installer")
"""The services ``shardbus run`` can start."""


def _cmd_up(args: argparse.Namespace) -> int:
    from shardbus.stack import up

    return up(Path(args.state_dir), args.shard_port, args.replicas, args.nats_cluster)


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


def _cmd_run(args: argparse.Namespace) -> int:
    import logging

    from nats.errors import ConnectionClosedError, ConnectionReconnectingError

    from shared import logs
    from shared.settings import CommonSettings

    logs.configure(args.service, CommonSettings().log_level)
    app_module = importlib.import_module(f"services.{args.service}.app")
    try:
        asyncio.run(app_module.create_app().run())
    except KeyboardInterrupt:
        pass
    except (ConnectionReconnectingError, ConnectionClosedError) as exc:  # NATS gone at shutdown
        logging.getLogger("shardbus").warning("stopped without a clean NATS drain",
                                              extra={"reason": repr(exc)})
    return 0


def _cmd_migrate(args: argparse.Namespace) -> int:
    from services.ledger import migrate
    from services.ledger.settings import LedgerSettings
    from shared.database import safe_url

    url = args.database_url or LedgerSettings().database_url
    revision = asyncio.run(migrate.upgrade(url))
    print(f"{safe_url(url)} is at revision {revision} (code head {migrate.head_revision()})")
    return 0


def _cmd_healthcheck(args: argparse.Namespace) -> int:
    from shared.broker import health_file_is_fresh
    from shared.settings import CommonSettings

    path = CommonSettings().health_file
    if not path:
        print("SHARDBUS_HEALTH_FILE is not set", file=sys.stderr)
        return 2
    healthy = health_file_is_fresh(path)
    print(f"{args.service}: {'healthy' if healthy else 'unhealthy'}")
    return 0 if healthy else 1


def build_parser() -> argparse.ArgumentParser:
    """The argument parser, with every service's own commands registered."""
    parser = argparse.ArgumentParser(prog="shardbus", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="run the whole system on the embedded default")
    up.add_argument("--state-dir", default=".shardbus", help="where NATS and PostgreSQL keep data")
    up.add_argument("--shard-port", type=int, default=0,
                    help="TCP port for shards (default: a free one); gateway replicas use the next ones")
    up.add_argument("--replicas", type=_replicas_arg, default=None, metavar="SERVICE=N,…",
                    help="processes per service, e.g. gateway=2,ledger=2,cleanup=3,installer=2 (default 1 each)")
    up.add_argument("--nats-cluster", type=_nats_nodes_arg, default=1, metavar="N",
                    help="run N clustered nats-server nodes (1, 3 or 5), streams and buckets replicated N ways")
    up.set_defaults(func=_cmd_up)

    run = sub.add_parser("run", help="run one service against SHARDBUS_NATS_URL / SHARDBUS_DATABASE_URL")
    run.add_argument("service", choices=SERVICES)
    run.set_defaults(func=_cmd_run)

    mig = sub.add_parser("migrate", help="bring the ledger database to the newest schema")
    mig.add_argument("--database-url", default="", help="default: SHARDBUS_DATABASE_URL")
    mig.set_defaults(func=_cmd_migrate)

    health = sub.add_parser("healthcheck", help="exit 0 when this container's service is healthy")
    health.add_argument("service", choices=SERVICES)
    health.set_defaults(func=_cmd_healthcheck)

    from shardbus import status

    status.register(sub)

    for service in SERVICES:
        try:
            commands = importlib.import_module(f"services.{service}.commands")
        except ModuleNotFoundError as exc:
            if exc.name != f"services.{service}.commands":
                raise
            continue
        commands.register(sub)
    from simulator import cli as simulator_cli

    simulator_cli.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``shardbus`` console script."""
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)
