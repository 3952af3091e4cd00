"""The console's HTML: Jinja2 templates (services/web/console/templates) rendered with
autoescaping — every value from a shard, a website or a module is escaped — and sent with a
strict Content-Security-Policy (scripts and styles from the console's own static files only,
no inline script, style or event handler), no caching, and a ``Server-Timing`` header."""

from __future__ import annotations

import time
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape

from services.web.console import auth, times, words

TEMPLATES = Path(__file__).with_name("templates")

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")

SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

NAV = (("runs", "/console/runs", "Runs"), ("calendar", "/console/calendar", "Calendar"),
       ("shards", "/console/shards", "Shards"), ("boards", "/console/boards", "Boards"),
       ("module", "/console/module", "Module"))

_env = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=select_autoescape(["html"], default=True),
                   trim_blocks=True, lstrip_blocks=True, auto_reload=False)
_env.globals.update(
    nav=NAV, run_badge=words.run_badge, cleanup_badge=words.cleanup_badge,
    resource_badge=words.resource_badge, module_badge=words.module_badge,
    shown=times.shown, since=times.since, parse_time=times.parse,
    form_text=times.form_text, qs=lambda values: urlencode(values),
)


def started(request: Request) -> None:
    """Mark when the request's handling began (for ``Server-Timing``)."""
    request.state.console_t0 = time.perf_counter()


def headers(request: Request) -> dict[str, str]:
    out = dict(SECURITY_HEADERS)
    t0 = getattr(request.state, "console_t0", None)
    if t0 is not None:
        out["Server-Timing"] = f"app;dur={(time.perf_counter() - t0) * 1000:.2f}"
    return out


def render(request: Request, template: str, status: int = HTTPStatus.OK, **context: Any) -> HTMLResponse:
    """``template`` with ``context``, the session's CSRF token and the page's security headers."""
    nonce = getattr(request.state, "console_nonce", None)
    context.setdefault("csrf", auth.csrf_token(request, nonce) if nonce else "")
    context.setdefault("fragment", request.query_params.get("fragment") == "1")
    html = _env.get_template(template).render(request=request, **context)
    return HTMLResponse(html, status_code=status, headers=headers(request))
