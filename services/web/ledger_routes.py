"""The ledger and the cleanup service over HTTP, for websites that keep their event logic
elsewhere: each route is one NATS request of docs/contracts.md ("Ledger", "Cleanup"), its reply
relayed verbatim (nats_route.py). Who may call what mirrors the NATS users (deploy/nats/nats.conf):
the website runs, resources, reads and a cleanup retry; a module its own expiries and
reconciles, the owner taken from the token and the path, never the body; the operator all of
it, plus sweeps and reconciles of the cleanup service.

A value in the path that becomes a subject token (a module) is matched whole against the
ledger's pattern here; one that goes into the body (a run id) is put there, over anything the
body says, and the ledger judges it as it judges any request."""

from __future__ import annotations

from http import HTTPStatus
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import Response

from services.web import auth
from services.web.auth import Caller
from services.web.nats_route import json_object, relay
from shared import subjects
from shared.contracts.ids import LEDGER_ID_PATTERN, is_ledger_id

router = APIRouter(tags=["ledger", "cleanup"])

Website = Annotated[Caller, Depends(auth.website)]
Operator = Annotated[Caller, Depends(auth.operator)]
Module = Annotated[Caller, Depends(auth.module)]
Body = Annotated[dict[str, Any], Depends(json_object)]
After = Annotated[int | None, Query(description="The `next` of the page before.")]
Limit = Annotated[int | None, Query(description="At most this many rows (the ledger's default when absent).")]

CLEANUP_TIMEOUT_S = 600.0
"""How long a sweep, retry or reconcile may take before the door answers 504 (the CLI's wait)."""


def _page(after: int | None, limit: int | None) -> dict[str, Any]:
    return {k: v for k, v in (("after", after), ("limit", limit)) if v is not None}


async def _ledger(request: Request, subject: str, body: dict[str, Any]) -> Response:
    return await relay(request, subject, body, service="ledger")


async def _cleanup(request: Request, subject: str, body: dict[str, Any]) -> Response:
    return await relay(request, subject, body, service="cleanup service", timeout_s=CLEANUP_TIMEOUT_S)


# --- runs ------------------------------------------------------------------------------

@router.post("/runs", summary="Create a run (ledger.run.create)")
async def create_run(request: Request, _caller: Website, body: Body) -> Response:
    return await _ledger(request, subjects.LEDGER_RUN_CREATE, body)


@router.get("/runs", summary="Runs by status and cleanup status (ledger.runs)")
async def list_runs(request: Request, _caller: Website, status: str | None = None,
                    cleanup_status: Annotated[str | None, Query(alias="cleanupStatus")] = None,
                    limit: Limit = None) -> Response:
    # An empty filter (``?status=``) is no filter.
    body = {k: v for k, v in (("status", status), ("cleanupStatus", cleanup_status)) if v}
    return await _ledger(request, subjects.LEDGER_RUNS, {**body, **_page(None, limit)})


@router.get("/runs/{runId}", summary="The run console: the run, a page of its resources, counts (ledger.console)")
async def run_console(request: Request, _caller: Website, runId: str, after: After = None,
                      limit: Limit = None) -> Response:
    return await _ledger(request, subjects.LEDGER_CONSOLE, {"runId": runId, **_page(after, limit)})


@router.get("/runs/{runId}/log", summary="A page of the run's log (ledger.log)")
async def run_log(request: Request, _caller: Website, runId: str, after: After = None,
                  limit: Limit = None) -> Response:
    return await _ledger(request, subjects.LEDGER_LOG, {"runId": runId, **_page(after, limit)})


@router.post("/runs/{runId}/status", summary="Move a run's status (ledger.run.status)")
async def run_status(request: Request, _caller: Website, runId: str, body: Body) -> Response:
    return await _ledger(request, subjects.LEDGER_RUN_STATUS, {**body, "runId": runId})


# --- resources -------------------------------------------------------------------------

RESOURCE_SUBJECTS = {
    "reserve": subjects.LEDGER_RESOURCE_RESERVE,
    "record": subjects.LEDGER_RESOURCE_RECORD,
    "confirm": subjects.LEDGER_RESOURCE_CONFIRM,
    "fail": subjects.LEDGER_RESOURCE_FAIL,
}


def _resource_route(action: str, subject: str) -> None:
    async def resource(request: Request, _caller: Website, body: Body) -> Response:
        return await _ledger(request, subject, body)

    resource.__name__ = f"resource_{action}"
    router.post(f"/resources/{action}", summary=f"{action.title()} a resource ({subject})")(resource)


for _action, _subject in RESOURCE_SUBJECTS.items():
    _resource_route(_action, _subject)


@router.get("/live", summary="A page of a module's live rows (ledger.live)")
async def live(request: Request, _caller: Website, module: str = "", after: After = None,
               limit: Limit = None) -> Response:
    return await _ledger(request, subjects.LEDGER_LIVE, {"module": module, **_page(after, limit)})


# --- a module's own reports ------------------------------------------------------------

def _owned(caller: Caller, module: str) -> str:
    """``module`` from the path, once it is a subject token and the caller's to act for."""
    if not is_ledger_id(module):
        raise HTTPException(HTTPStatus.BAD_REQUEST, f"module must match {LEDGER_ID_PATTERN}")
    if caller.role == "module" and caller.module != module:
        raise HTTPException(HTTPStatus.FORBIDDEN,
                            f"module {caller.module!r} may only report its own expiries and reconciles, "
                            f"not those of module {module!r}")
    return module


@router.post("/modules/{module}/expired", summary="The game ended a module's target on time (ledger.expired.<module>)")
async def expired(request: Request, caller: Module, module: str, body: Body) -> Response:
    return await _ledger(request, subjects.ledger_expired(_owned(caller, module)), body)


@router.post("/modules/{module}/reconcile",
             summary="Which refs of a run a module's shard still lists (ledger.reconcile.<module>)")
async def reconcile(request: Request, caller: Module, module: str, body: Body) -> Response:
    return await _ledger(request, subjects.ledger_reconcile(_owned(caller, module)), body)


# --- cleanup ---------------------------------------------------------------------------

@router.post("/cleanup/retry", summary="Retry an incomplete run's cleanup now (cleanup.retry)")
async def cleanup_retry(request: Request, _caller: Website, body: Body) -> Response:
    return await _cleanup(request, subjects.CLEANUP_RETRY, body)


@router.post("/cleanup/sweep", summary="Sweep now: every candidate run, or one (cleanup.sweep)")
async def cleanup_sweep(request: Request, _caller: Operator, body: Body) -> Response:
    return await _cleanup(request, subjects.CLEANUP_SWEEP, body)


@router.post("/cleanup/reconcile", summary="Reconcile modules' live rows now (cleanup.reconcile)")
async def cleanup_reconcile(request: Request, _caller: Operator, body: Body) -> Response:
    return await _cleanup(request, subjects.CLEANUP_RECONCILE, body)
