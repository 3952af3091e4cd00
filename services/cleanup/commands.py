"""The cleanup service's CLI commands: ``shardbus cleanup sweep|retry|reconcile`` ask a
running cleanup replica (over ``SHARDBUS_NATS_URL``) and print its JSON answer; a refusal is one
line, ``error <status>: <sentence>`` (``--json``: the raw reply as well)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from http import HTTPStatus
from typing import Any

ASK_TIMEOUT_S = 600.0
"""How long the command waits for a sweep to finish."""


async def _ask(subject: str, payload: dict[str, Any]) -> dict[str, Any]:
    import nats

    from shared.nats_calls import ClosedWatch, quiet, request_while_connected
    from shared.nats_connect import connection_name, inbox_prefix
    from shared.settings import CommonSettings

    settings = CommonSettings()
    servers = settings.nats_servers()
    watch = ClosedWatch()
    nc = await nats.connect(servers, name=connection_name("cleanup-cli"), inbox_prefix=inbox_prefix(servers),
                            connect_timeout=5, allow_reconnect=False, max_reconnect_attempts=1,
                            reconnect_time_wait=0.5, error_cb=quiet, closed_cb=watch.on_closed,
                            **settings.nats_tls())
    try:
        msg = await request_while_connected(
            nc, watch, subject, json.dumps(payload).encode(), ASK_TIMEOUT_S,
            lost="lost the connection to NATS before the cleanup service answered; what it was doing "
                 "may still finish (see `shardbus status`), or ask again")
        try:
            reply = json.loads(msg.data)
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            return {"status": HTTPStatus.BAD_GATEWAY,
                    "error": "the cleanup service answered something that is not a JSON object"}
        return reply
    finally:
        with contextlib.suppress(Exception):  # nats-py's close of a lost connection can raise
            await nc.close()


def _cmd_cleanup(args: argparse.Namespace) -> int:
    import nats.errors
    from pydantic import BaseModel, ValidationError

    from shared import subjects
    from shared.contracts.cleanup import ReconcileRequest, RetryRequest, SweepRequest
    from shared.nats_calls import NatsAway, NoAnswer, NoResponders, nats_failure
    from shared.replies import describe_validation_error
    from shared.settings import CommonSettings

    if args.action == "retry" and not args.run_id:
        print("retry needs --run-id", file=sys.stderr)
        return 2
    request: BaseModel
    try:
        # The service's own request models, read from the wire shape: what the service would
        # refuse is refused here, in its words (fields named as on the wire).
        if args.action == "sweep":
            subject = subjects.CLEANUP_SWEEP
            request = SweepRequest.model_validate({"runId": args.run_id} if args.run_id else {})
        elif args.action == "retry":
            subject, request = subjects.CLEANUP_RETRY, RetryRequest.model_validate({"runId": args.run_id})
        else:
            subject = subjects.CLEANUP_RECONCILE
            request = ReconcileRequest.model_validate({"modules": args.module} if args.module else {})
    except ValidationError as exc:
        print(f"error {HTTPStatus.BAD_REQUEST.value}: {describe_validation_error(exc)}", file=sys.stderr)
        return 1
    payload = request.model_dump(mode="json", by_alias=True, exclude_none=True)
    try:
        reply = asyncio.run(_ask(subject, payload))
    except NoResponders:
        print("no cleanup service is running", file=sys.stderr)
        return 1
    except NoAnswer:
        print(f"the cleanup service did not answer within {ASK_TIMEOUT_S:g} s", file=sys.stderr)
        return 1
    except NatsAway as exc:
        print(str(exc), file=sys.stderr)
        return 1
    except (nats.errors.Error, OSError) as exc:  # the connect failed
        print(nats_failure(CommonSettings().nats_url, exc), file=sys.stderr)
        return 1
    status = reply.get("status")
    succeeded = isinstance(status, int) and HTTPStatus.OK <= status < HTTPStatus.MULTIPLE_CHOICES
    if succeeded or args.json:
        print(json.dumps(reply, indent=2))
    if not succeeded:
        # One line a person reads at once (a typo'd run id is "error 404: no run 'nope'").
        error = " ".join(str(reply.get("error") or "no reason given").split())
        print(f"error {status}: {error}", file=sys.stderr)
    return 0 if succeeded else 1


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``cleanup`` to the ``shardbus`` command."""
    cleanup = subparsers.add_parser("cleanup", help="ask the cleanup service to sweep, retry a run or reconcile")
    cleanup.add_argument("action", choices=("sweep", "retry", "reconcile"))
    cleanup.add_argument("--run-id", default="", help="sweep only this run; the run to retry")
    cleanup.add_argument("--module", action="append", default=[], help="reconcile this module (repeatable)")
    cleanup.add_argument("--json", action="store_true", help="print the raw reply, a refusal's too")
    cleanup.set_defaults(func=_cmd_cleanup)
