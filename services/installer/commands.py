"""``shardbus module install URL | remove ID | list``: the installer's requests from a shell,
with a progress bar while the artifact downloads (fed by ``installer.progress.<requestId>``);
when stderr is no terminal (a log, a pipe, CI), one plain line per stage instead. Requests,
replies and progress events are read and written with the installer's contract
(:mod:`shared.contracts.installer`): a request it would refuse is refused here with its own
400, before anything is sent."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import uuid
from http import HTTPStatus
from typing import Any, TextIO

from pydantic import ValidationError

from shared import subjects
from shared.contracts import installer as c
from shared.nats_connect import connect
from shared.replies import describe_validation_error
from shared.settings import CommonSettings

DRAIN_WAIT_S = 2.0
"""How long the progress events still queued when the answer came may take to be shown."""


REPLIES: dict[str, type[c.InstallerReply]] = {"install": c.InstallReply, "remove": c.RemoveReply,
                                              "list": c.ListReply}
"""The 2xx reply of each action (any other status is a :class:`~shared.contracts.installer.ErrorReply`)."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``module install|remove|list`` to the ``shardbus`` command."""
    module = subparsers.add_parser("module", help="install, remove or list the site's module")
    actions = module.add_subparsers(dest="action", required=True)
    install = actions.add_parser("install", help="install or upgrade from a release manifest URL")
    install.add_argument("url")
    install.add_argument("--timeout", type=float, default=c.INSTALL_TIMEOUT_S, help="seconds to wait")
    install.add_argument("--quiet", action="store_true", help="no progress bar")
    remove = actions.add_parser("remove", help="remove the installed module, freeing the site")
    remove.add_argument("id")
    remove.add_argument("--timeout", type=float, default=c.REMOVE_TIMEOUT_S, help="seconds to wait")
    listing = actions.add_parser("list", help="the installed module and the declared modules' fate")
    listing.add_argument("--timeout", type=float, default=c.LIST_TIMEOUT_S, help="seconds to wait")
    for parser in (install, remove, listing):
        parser.add_argument("--json", action="store_true", help="print the raw reply")
    module.set_defaults(func=lambda args: asyncio.run(_run(args)))


def _refused(status: HTTPStatus, error: str) -> dict[str, Any]:
    """A reply the command gives itself when the installer could not answer."""
    return c.ErrorReply(status=status, error=error).wire()


def _request(args: argparse.Namespace) -> c.InstallerRequest:
    """The action's request, built with the contract (:class:`~shared.contracts.installer.RequestRefused`
    when the installer would refuse it)."""
    if args.action == "install":
        return c.build(c.InstallRequest, {"url": args.url, "requestId": uuid.uuid4().hex})
    if args.action == "remove":
        return c.build(c.RemoveRequest, {"id": args.id})
    return c.ListRequest()


async def _run(args: argparse.Namespace) -> int:
    try:
        request = _request(args)
    except c.RequestRefused as exc:
        reply = exc.reply.wire()
    else:
        answer = await _ask_installer(args, request)
        if answer is None:
            return 1
        reply = answer
    if args.json:
        print(json.dumps(reply, indent=2))
    ok, lines = _outcome(args.action, reply)
    if not args.json:
        for line in lines:
            print(line, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


async def _ask_installer(args: argparse.Namespace, request: c.InstallerRequest) -> dict[str, Any] | None:
    """The installer's reply to ``request`` (or the command's own 503 or 502); None when NATS
    could not be reached at all (said on stderr)."""
    import nats.errors

    from shared.nats_calls import ClosedWatch, nats_failure, quiet

    settings = CommonSettings()
    servers = settings.nats_servers()
    watch = ClosedWatch()
    try:
        # A short NATS blip is ridden out (two reconnect attempts); past that the connection
        # closes and the command says so rather than waiting out --timeout.
        nc = await connect(servers, "cli", max_reconnect_attempts=2, connect_timeout=5, error_cb=quiet,
                           closed_cb=watch.on_closed, **settings.nats_tls())
    except (nats.errors.Error, OSError) as exc:
        print(nats_failure(servers, exc), file=sys.stderr)
        return None
    try:
        if isinstance(request, c.InstallRequest):
            return await _install(nc, watch, request, args)
        subject = subjects.INSTALLER_REMOVE if isinstance(request, c.RemoveRequest) else subjects.INSTALLER_LIST
        return await _call(nc, watch, subject, request, args.timeout)
    except (nats.errors.Error, OSError) as exc:  # NATS went away before the request left
        return _refused(HTTPStatus.SERVICE_UNAVAILABLE,
                        f"lost the connection to NATS ({type(exc).__name__}); try again")
    finally:
        with contextlib.suppress(Exception):  # nats-py's close of a lost connection can raise
            await nc.close()


async def _call(nc: Any, watch: Any, subject: str, request: c.InstallerRequest, timeout: float) -> dict[str, Any]:
    from shared.nats_calls import NatsAway, NoAnswer, NoResponders, request_while_connected

    try:
        message = await request_while_connected(
            nc, watch, subject, json.dumps(request.wire()).encode(), timeout,
            lost="lost the connection to NATS before the installer answered; it may still finish: "
                 "see `shardbus module list`")
    except NatsAway as exc:
        return _refused(HTTPStatus.SERVICE_UNAVAILABLE, str(exc))
    except NoResponders:
        return _refused(HTTPStatus.SERVICE_UNAVAILABLE, f"no installer is running (nobody answers {subject})")
    except Exception as exc:  # noqa: BLE001 — mostly a timeout: whatever it is, said as a reply would say it
        said = exc.__cause__ if isinstance(exc, NoAnswer) else exc  # a timeout by nats-py's name for it
        return _refused(HTTPStatus.SERVICE_UNAVAILABLE,
                        f"no answer from the installer on {subject} ({type(said).__name__})")
    try:
        reply = json.loads(message.data)
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        return _refused(HTTPStatus.BAD_GATEWAY,
                        f"the installer answered {subject} with something that is not a JSON object")
    return reply


async def _install(nc: Any, watch: Any, request: c.InstallRequest, args: argparse.Namespace) -> dict[str, Any]:
    assert request.request_id is not None  # _request gives every install one
    request_id = request.request_id
    shown = None if args.quiet else Progress(sys.stderr, bar=sys.stderr.isatty())

    async def on_progress(message: Any) -> None:
        if shown is not None:
            shown.event(message.data)

    subscription = await nc.subscribe(subjects.installer_progress(request_id), cb=on_progress)
    try:
        return await _call(nc, watch, subjects.INSTALLER_INSTALL, request, args.timeout)
    finally:
        # Drain, not unsubscribe: the last stages were published before the reply, but may still
        # wait in the subscription's queue when the reply arrives.
        with contextlib.suppress(Exception):  # a connection already closed has no subscription left
            await asyncio.wait_for(subscription.drain(), DRAIN_WAIT_S)
        if shown is not None:
            shown.close()


STAGES = c.STAGES
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
        self.stage: c.Stage | None = None
        self.bar: Any = None

    def event(self, data: bytes | str) -> None:
        """Show one ``{requestId, stage, done, total}`` event (:class:`~shared.contracts.installer.ProgressEvent`)."""
        try:
            event = c.ProgressEvent.model_validate_json(data)
        except (ValueError, RecursionError):  # not JSON, not UTF-8, not a progress event
            return
        stage, done = event.stage, event.done
        total = event.total if event.total else None  # 0: not known either
        if self.stage is not None and STAGES.index(stage) < STAGES.index(self.stage):
            return  # late or forged: the install has moved on
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


def _outcome(action: str, reply: dict[str, Any]) -> tuple[bool, list[str]]:
    """Whether ``reply`` is the action's 2xx reply, and the lines that say it (on stdout), or
    the ``error <status>: <sentence>`` line (on stderr)."""
    try:
        read = c.read_reply(REPLIES[action], reply)
    except ValidationError as exc:
        detail = describe_validation_error(exc).removeprefix("invalid request: ")
        return False, [f"error {HTTPStatus.BAD_GATEWAY}: the installer's reply does not fit its contract ({detail})"]
    if isinstance(read, c.ErrorReply):
        return False, [f"error {read.status}: {read.error}"]
    if isinstance(read, c.InstallReply):
        return True, [f"{read.action} {read.module.id} {read.module.version}"]
    if isinstance(read, c.RemoveReply):
        return True, [f"removed {read.removed.id}"]
    assert isinstance(read, c.ListReply)
    lines = [f"{m.id} {m.version or ''}".rstrip() for m in read.modules] or ["(no module installed)"]
    for entry in read.declared:
        detail = entry.error or (entry.module.id if entry.module else "")
        lines.append(f"declared {entry.url}: {entry.state} {detail}".rstrip())
    return True, lines
