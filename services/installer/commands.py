"""``shardbus module install URL | remove ID | list``: the installer's requests from a shell,
with a progress bar while the artifact downloads."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import uuid
from typing import Any

from shared import subjects
from shared.nats_connect import connect
from shared.settings import CommonSettings

INSTALL_TIMEOUT_S = 900.0
"""Default wait for an install's answer (a large artifact on a slow link takes a while)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``module install|remove|list`` to the ``shardbus`` command."""
    module = subparsers.add_parser("module", help="install, remove or list the site's module")
    actions = module.add_subparsers(dest="action", required=True)
    install = actions.add_parser("install", help="install or upgrade from a release manifest URL")
    install.add_argument("url")
    install.add_argument("--timeout", type=float, default=INSTALL_TIMEOUT_S, help="seconds to wait")
    install.add_argument("--quiet", action="store_true", help="no progress bar")
    remove = actions.add_parser("remove", help="remove the installed module, freeing the site")
    remove.add_argument("id")
    remove.add_argument("--timeout", type=float, default=120.0, help="seconds to wait")
    listing = actions.add_parser("list", help="the installed module and the declared modules' fate")
    listing.add_argument("--timeout", type=float, default=10.0, help="seconds to wait")
    for parser in (install, remove, listing):
        parser.add_argument("--json", action="store_true", help="print the raw reply")
    module.set_defaults(func=lambda args: asyncio.run(_run(args)))


async def _run(args: argparse.Namespace) -> int:
    import nats.errors

    from shardbus.cli import ClosedWatch, nats_failure, quiet

    servers = CommonSettings().nats_servers()
    watch = ClosedWatch()
    try:
        # A short NATS blip is ridden out (two reconnect attempts); past that the connection
        # closes and the command says so rather than waiting out --timeout.
        nc = await connect(servers, "cli", max_reconnect_attempts=2, connect_timeout=5, error_cb=quiet,
                           closed_cb=watch.on_closed)
    except (nats.errors.Error, OSError) as exc:
        print(nats_failure(servers, exc), file=sys.stderr)
        return 1
    try:
        if args.action == "install":
            reply = await _install(nc, watch, args)
        elif args.action == "remove":
            reply = await _request(nc, watch, subjects.INSTALLER_REMOVE, {"id": args.id}, args.timeout)
        else:
            reply = await _request(nc, watch, subjects.INSTALLER_LIST, {}, args.timeout)
    except (nats.errors.Error, OSError) as exc:  # NATS went away before the request left
        reply = {"status": 503, "error": f"lost the connection to NATS ({type(exc).__name__}); try again"}
    finally:
        with contextlib.suppress(Exception):  # nats-py's close of a lost connection can raise
            await nc.close()
    if args.json:
        print(json.dumps(reply, indent=2))
    else:
        _print(args.action, reply)
    return 0 if 200 <= reply.get("status", 500) < 300 else 1


async def _request(nc: Any, watch: Any, subject: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    from nats.errors import NoRespondersError

    from shardbus.cli import NatsAway, request_while_connected

    try:
        message = await request_while_connected(
            nc, watch, subject, json.dumps(body).encode(), timeout,
            lost="lost the connection to NATS before the installer answered; it may still finish: "
                 "see `shardbus module list`")
    except NatsAway as exc:
        return {"status": 503, "error": str(exc)}
    except NoRespondersError:
        return {"status": 503, "error": f"no installer is running (nobody answers {subject})"}
    except Exception as exc:  # a timeout: say so as a reply would
        return {"status": 503, "error": f"no answer from the installer on {subject} ({type(exc).__name__})"}
    return json.loads(message.data)


async def _install(nc: Any, watch: Any, args: argparse.Namespace) -> dict[str, Any]:
    from tqdm import tqdm

    request_id = uuid.uuid4().hex
    bar: list[tqdm] = []

    async def on_progress(message: Any) -> None:
        event = json.loads(message.data)
        if args.quiet or event.get("stage") != "download":
            return
        if not bar:
            bar.append(tqdm(total=event.get("total"), unit="B", unit_scale=True, desc="download",
                            file=sys.stderr))
        bar[0].update(event["done"] - bar[0].n)

    subscription = await nc.subscribe(subjects.installer_progress(request_id), cb=on_progress)
    try:
        return await _request(nc, watch, subjects.INSTALLER_INSTALL, {"url": args.url, "requestId": request_id},
                              args.timeout)
    finally:
        with contextlib.suppress(Exception):  # a connection already closed has no subscription left
            await subscription.unsubscribe()
        if bar:
            bar[0].close()


def _print(action: str, reply: dict[str, Any]) -> None:
    if not 200 <= reply.get("status", 500) < 300:
        print(f"error {reply.get('status')}: {reply.get('error')}", file=sys.stderr)
        return
    if action == "install":
        module = reply["module"]
        print(f"{reply['action']} {module['id']} {module['version']}")
    elif action == "remove":
        print(f"removed {reply['removed']['id']}")
    else:
        for module in reply["modules"] or [{"id": "(no module installed)", "version": ""}]:
            print(f"{module['id']} {module['version'] or ''}".rstrip())
        for entry in reply.get("declared", []):
            detail = entry.get("error") or (entry.get("module") or {}).get("id", "")
            print(f"declared {entry['url']}: {entry['state']} {detail}".rstrip())
