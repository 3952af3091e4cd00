"""``shardbus shard-sim``: the shard simulator against a gateway. It lives with the simulator, not
in the gateway: a service never imports the simulator (a test and bench tool)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys


def _cmd_shard_sim(args: argparse.Namespace) -> int:
    from shared import logs
    from simulator.shard import ShardSimulator
    from simulator.world import ShardWorld

    token = os.environ.get("SHARDBUS_SHARD_TOKEN", "")
    logs.register_secret(token)
    logs.configure("shard-sim", "INFO")
    if not token:
        print("shardbus shard-sim: SHARDBUS_SHARD_TOKEN is not set; the gateway refuses a hello "
              "without the shard token (make up prints it as SHARD_TOKEN=)", file=sys.stderr)
        return 2
    host, _, port = args.addr.rpartition(":")
    tls = None
    if args.tls_ca:  # TLS to the gateway (docs/gateway.md, "TLS")
        from shared.tls import TLSConfigError, client_context
        try:
            tls = client_context(args.tls_ca, args.tls_cert, args.tls_key)
        except TLSConfigError as exc:
            print(f"shardbus shard-sim: {exc}", file=sys.stderr)
            return 2
    elif args.tls_cert:
        print("shardbus shard-sim: --tls-cert needs --tls-ca (the CA that signed the gateway's certificate)",
              file=sys.stderr)
        return 2
    world = ShardWorld(save_interval_s=args.save_interval, spawn_ceiling=args.spawn_ceiling,
                       event_plane_enabled=not args.event_plane_disabled)
    sim = ShardSimulator(host or "127.0.0.1", int(port), args.shard, token, world=world, tls=tls,
                         server_hostname=args.tls_server_name or None)
    try:
        asyncio.run(sim.run_forever())
    except KeyboardInterrupt:
        return 0
    # run_forever returns only when the gateway refused the hello, and said why, or its certificate was refused.
    print(f"shardbus shard-sim: the gateway refused the hello: {sim.refused}" if "certificate" not in str(sim.refused)
          else f"shardbus shard-sim: {sim.refused}", file=sys.stderr)
    return 1


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``shard-sim`` to the ``shardbus`` command."""
    sim = subparsers.add_parser("shard-sim", help="run a simulated shard (protocol 7) against a gateway; "
                                                  "the token is read from SHARDBUS_SHARD_TOKEN")
    sim.add_argument("--addr", default="127.0.0.1:2595", help="the gateway's shard address host:port")
    sim.add_argument("--shard", default="uo1", help="the shard id to say hello as")
    sim.add_argument("--save-interval", type=int, default=300, help="seconds between allowed world saves")
    sim.add_argument("--spawn-ceiling", type=int, default=30, help="most objects of one kind one world.spawn may place")
    sim.add_argument("--event-plane-disabled", action="store_true", help="refuse every event-plane verb")
    sim.add_argument("--tls-ca", default="", help="dial TLS, verifying the gateway with this CA file (PEM)")
    sim.add_argument("--tls-cert", default="", help="the shard's client certificate (PEM; with --tls-ca), for a "
                                                    "gateway with SHARDBUS_SHARD_TLS_CA")
    sim.add_argument("--tls-key", default="", help="the key of --tls-cert (PEM), if not in that file")
    sim.add_argument("--tls-server-name", default="", help="the name the gateway's certificate must carry "
                                                           "(default: the host of --addr)")
    sim.set_defaults(func=_cmd_shard_sim)
