"""``shardbus module install URL | remove ID | list``: the installer's requests from a shell,
with a progress bar while the artifact downloads (fed by ``installer.progress.<requestId>``);
when stderr is no terminal (a log, a pipe, CI), one plain line per stage instead."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import uuid
from typing import Any, TextIO

from shared import subjects
from shared.nats_connect import connect
from shared.settings import CommonSettings

INSTALL_TIMEOUT_S = 900.0
"""Default wait for an install's answer (a large artifact on a slow link takes a while)."""

DRAIN_WAIT_S = 2.0
"""How long the progress events still queued when the answer came may take to be shown."""


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
    return 0 if _ok(reply) else 1


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
    try:
        reply = json.loads(message.data)
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        return {"status": 502, "error": f"the installer answered {subject} with something that is not a JSON object"}
    return reply


async def _install(nc: Any, watch: Any, args: argparse.Namespace) -> dict[str, Any]:
    request_id = uuid.uuid4().hex
    shown = None if args.quiet else Progress(sys.stderr, bar=sys.stderr.isatty())

    async def on_progress(message: Any) -> None:
        if shown is not None:
            shown.event(message.data)

    subscription = await nc.subscribe(subjects.installer_progress(request_id), cb=on_progress)
    try:
        return await _request(nc, watch, subjects.INSTALLER_INSTALL, {"url": args.url, "requestId": request_id},
                              args.timeout)
    finally:
        # Drain, not unsubscribe: the last stages were published before the reply, but may still
        # wait in the subscription's queue when the reply arrives.
        with contextlib.suppress(Exception):  # a connection already closed has no subscription left
            await asyncio.wait_for(subscription.drain(), DRAIN_WAIT_S)
        if shown is not None:
            shown.close()


STAGES = ("manifest", "download", "inspect", "unpack", "done")
"""An install's stages, in the order the installer goes through them."""

STAGE_LINES = {"manifest": "fetching the manifest", "download": "downloading", "inspect": "checking the archive",
               "unpack": "unpacking"}
"""The line said as each stage starts; ``done`` says nothing (the result line follows)."""


class Progress:
    """An install's progress events shown on ``out``: one line as each stage starts, and for the
    download a tqdm bar when ``bar`` (a terminal; without one, the line gives the size). Events
    come from the network: one that is not what the installer sends, or that goes back to an
    earlier stage, is ignored, never a crash."""

    def __init__(self, out: TextIO, bar: bool) -> None:
        self.out, self.use_bar = out, bar
        self.stage: str | None = None
        self.bar: Any = None

    def event(self, data: bytes | str) -> None:
        """Show one ``{requestId, stage, done, total}`` event."""
        try:
            event = json.loads(data)
        except (ValueError, RecursionError):  # not JSON, not UTF-8, nested past Python's limit
            return
        if not isinstance(event, dict) or not isinstance(event.get("stage"), str) or event["stage"] not in STAGES:
            return
        stage, done, total = event["stage"], event.get("done"), event.get("total")
        if self.stage is not None and STAGES.index(stage) < STAGES.index(self.stage):
            return  # late or forged: the install has moved on
        done = done if isinstance(done, int) and not isinstance(done, bool) and done >= 0 else 0
        total = total if isinstance(total, int) and not isinstance(total, bool) and total > 0 else None
        started, self.stage = stage != self.stage, stage
        if stage != "download":
            self._close_bar()
        if started and stage in STAGE_LINES and not (self.use_bar and stage == "download"):
            size = f" {_megabytes(total)}" if stage == "download" and total else ""
            print(f"{STAGE_LINES[stage]}{size}", file=self.out, flush=True)
        if self.use_bar and stage == "download":
            self._draw(done, total)

    def _draw(self, done: int, total: int | None) -> None:
        from tqdm import tqdm

        if self.bar is None:
            self.bar = tqdm(total=total, unit="B", unit_scale=True, desc="download", file=self.out)
        elif done < self.bar.n:  # the download was retried from the start
            self.bar.reset(total=total)
        self.bar.update(done - self.bar.n)

    def _close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def close(self) -> None:
        """The install answered: finish the bar."""
        self._close_bar()


def _megabytes(size: int) -> str:
    return f"({size / 1_000_000:.1f} MB)"


def _ok(reply: dict[str, Any]) -> bool:
    status = reply.get("status")
    return isinstance(status, int) and 200 <= status < 300


def _print(action: str, reply: dict[str, Any]) -> None:
    if not _ok(reply):
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
