"""The operator's console's pages (docs/console.md): the login, runs, a run, the calendar,
shards, boards and the site's module, each server-rendered; ``?fragment=1`` renders only the
page's live region, which console.js re-fetches when the feed (or a timer) says it changed.
A page without a session goes to the login page. Not in the OpenAPI document."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime
from http import HTTPStatus
from pathlib import Path
from urllib.parse import parse_qsl, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response
from pydantic import ValidationError

from services.web.console import auth, boards, leases, one_run, pages, runs, shards, waiting
from services.web.console.pages import render
from services.web.console.reads import ask
from services.web.console.words import CLEANUP, RUN
from shared import subjects
from shared.contracts import installer as c
from shared.contracts.ids import LEDGER_ID_PATTERN, RUN_ID_MAX, is_ledger_id, is_shard_id
from shared.replies import describe_validation_error

router = APIRouter(include_in_schema=False)

LOGIN_FAILURE_DELAY_S = 0.5
"""A refused token is answered after this long (guessing is slow)."""

STATIC = Path(__file__).with_name("static")
_STATIC_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}
_STATIC_FILES = {p.name: (p.read_bytes(), _STATIC_TYPES[p.suffix]) for p in STATIC.iterdir()
                 if p.suffix in _STATIC_TYPES}


def _page(request: Request) -> Response | None:
    """None when the request has a session (kept in ``request.state``); else the way to log in."""
    pages.started(request)
    nonce = auth.session(request)
    if nonce is None:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse("/console/login?" + urlencode({"next": target}), status_code=HTTPStatus.SEE_OTHER,
                                headers=pages.SECURITY_HEADERS)
    request.state.console_nonce = nonce
    return None


def _next(value: str | None) -> str:
    """Where to go after logging in: a console path only (never another site)."""
    if (value and re.fullmatch(r"/console(/[A-Za-z0-9_\-./]*)?(\?[A-Za-z0-9_\-.=&%:+]*)?", value)
            and "//" not in value and ".." not in value):
        return value
    return "/console/runs"


# --- login -----------------------------------------------------------------------------

@router.get("/console")
async def console_home() -> Response:
    return RedirectResponse("/console/runs", status_code=HTTPStatus.SEE_OTHER)


@router.get("/console/login")
async def login_page(request: Request, next: str | None = None) -> Response:
    pages.started(request)
    if auth.session(request) is not None:
        return RedirectResponse(_next(next), status_code=HTTPStatus.SEE_OTHER)
    return render(request, "login.html", next=_next(next), error=None)


@router.post("/console/login")
async def login(request: Request) -> Response:
    pages.started(request)
    form = await _form(request)
    refused = auth.check_token(request, form.get("token", ""))
    target = _next(form.get("next"))
    if refused is not None:
        await asyncio.sleep(LOGIN_FAILURE_DELAY_S)
        return render(request, "login.html", status=HTTPStatus.UNAUTHORIZED, next=target, error=refused)
    response = RedirectResponse(target, status_code=HTTPStatus.SEE_OTHER, headers=pages.SECURITY_HEADERS)
    response.set_cookie(auth.COOKIE, auth.new_session(request), max_age=auth.SESSION_S,
                        **auth.cookie_flags(request))
    return response


@router.post("/console/logout")
async def logout(request: Request) -> Response:
    pages.started(request)
    form = await _form(request)
    nonce = auth.session(request)
    if nonce is not None and form.get("csrf") != auth.csrf_token(request, nonce):
        return render(request, "login.html", status=HTTPStatus.FORBIDDEN, next="/console/runs",
                      error="the logout form is stale: reload the page and log out again")
    response = RedirectResponse("/console/login", status_code=HTTPStatus.SEE_OTHER,
                                headers=pages.SECURITY_HEADERS)
    response.delete_cookie(auth.COOKIE, **auth.cookie_flags(request))
    return response


async def _form(request: Request) -> dict[str, str]:
    """A small urlencoded form (the BodyCap middleware bounds it)."""
    data = b""
    async for chunk in request.stream():
        data += chunk
        if len(data) > 16 * 1024:
            break
    return dict(parse_qsl(data[:16 * 1024].decode("utf-8", errors="replace"), keep_blank_values=True))


# --- pages -----------------------------------------------------------------------------

def _fragment(request: Request, page: str, fragment: str) -> str:
    return fragment if request.query_params.get("fragment") == "1" else page


@router.get("/console/runs")
async def runs_page(request: Request) -> Response:
    if (login_first := _page(request)) is not None:
        return login_first
    f = runs.RunFilter.parse(request.query_params)
    feed = "types=ledger" + (f"&shards={f.shard}" if f.shard else "")
    if request.query_params.get("fragment") == "1":  # a live reload of the list: the list only
        result, waits = await asyncio.gather(runs.runs_page(request, f), waiting.too_long(request))
        return render(request, "_runs.html", page="runs", f=f, result=result, waits=waits)
    result, overdue, waits = await asyncio.gather(runs.runs_page(request, f),
                                                  leases.overdue(request, leases.ON_RUNS_PAGE, brief=True),
                                                  waiting.too_long(request))
    return render(request, "runs.html", page="runs", f=f, result=result, leases=overdue, feed=feed,
                  run_statuses=list(RUN), cleanup_statuses=list(CLEANUP), waits=waits)


@router.get("/console/leases")
async def leases_page(request: Request) -> Response:
    if (login_first := _page(request)) is not None:
        return login_first
    brief = request.query_params.get("brief") == "1"
    found = await leases.overdue(request, leases.ON_RUNS_PAGE if brief else leases.LISTED,
                                         brief=brief)
    return render(request, _fragment(request, "leases.html", "_leases.html"), page="leases", leases=found)


@router.get("/console/runs/{run_id}")
async def run_page(request: Request, run_id: str, after: str | None = None) -> Response:
    if (login_first := _page(request)) is not None:
        return login_first
    if not is_ledger_id(run_id):
        view = one_run.RunView(run_id[:RUN_ID_MAX], error=f"a run id must match {LEDGER_ID_PATTERN}")
        return render(request, "run.html", status=HTTPStatus.NOT_FOUND, page="runs", view=view, feed="", after=None)
    after_id = int(after) if after and after.isdigit() and len(after) < 19 else None
    view, wait = await asyncio.gather(one_run.run_view(request, run_id, after_id), waiting.of_run(request, run_id))
    shard = view.run.get("shard")
    feed = "types=ledger" + (f"&shards={shard}" if is_shard_id(shard) else "")
    status = HTTPStatus.NOT_FOUND if view.error and view.error.startswith(str(HTTPStatus.NOT_FOUND)) else HTTPStatus.OK
    return render(request, _fragment(request, "run.html", "_run.html"), status=status, page="runs", view=view,
                  feed=feed, after=after_id, wait=wait)


@router.get("/console/calendar")
async def calendar_page(request: Request) -> Response:
    if (login_first := _page(request)) is not None:
        return login_first
    cal = runs.Calendar.parse(request.query_params, datetime.now(UTC).date())
    cal = await runs.calendar(request, cal)
    return render(request, _fragment(request, "calendar.html", "_calendar.html"), page="calendar", cal=cal)


@router.get("/console/shards")
async def shards_page(request: Request) -> Response:
    if (login_first := _page(request)) is not None:
        return login_first
    (rows, error), (letters, letters_error) = await asyncio.gather(shards.shard_rows(request),
                                                                   shards.dead_letters(request))
    return render(request, _fragment(request, "shards.html", "_shards.html"), page="shards", shards=rows,
                  error=error, letters=letters, letters_error=letters_error, silent_s=shards.SILENT_S)


@router.get("/console/boards")
async def boards_page(request: Request, shard: str | None = None) -> Response:
    if (login_first := _page(request)) is not None:
        return login_first
    fragment = request.query_params.get("fragment") == "1"
    connected: list[str] = []
    if not (fragment and shard):  # a live reload knows its shard: no gateway.status round
        rows, _error = await shards.shard_rows(request)
        connected = [r["shard"] for r in rows]
    problem = None
    if shard and not is_shard_id(shard):
        shard, problem = None, "shard: not a shard id ([a-z0-9_-]{1,32})"
    shard = shard or (connected[0] if connected else None)
    items = await boards.read_all(request, shard) if shard else []
    return render(request, _fragment(request, "boards.html", "_boards.html"), page="boards", shard=shard,
                  connected=connected, boards=items, shard_problem=problem)


@router.get("/console/module")
async def module_page(request: Request) -> Response:
    if (login_first := _page(request)) is not None:
        return login_first
    answer = await ask(request, subjects.INSTALLER_LIST, c.ListRequest().wire(), "installer")
    listed, error = None, answer.error
    if answer.ok:
        try:
            listed = c.ListReply.model_validate(answer.reply)
        except ValidationError as exc:
            error = f"the installer's reply does not fit its contract ({describe_validation_error(exc)})"
    return render(request, _fragment(request, "module.html", "_module.html"), page="module",
                  modules=listed.modules if listed else [], declared=listed.declared if listed else [], error=error)


@router.get("/console/static/{name}")
async def static(name: str) -> Response:
    found = _STATIC_FILES.get(name)
    if found is None:
        return Response(b"not found", status_code=HTTPStatus.NOT_FOUND, media_type="text/plain")
    body, media_type = found
    return Response(body, media_type=media_type, headers={"Cache-Control": "no-cache",
                                                          "X-Content-Type-Options": "nosniff"})
