"""One run as the console shows it: its rows (``ledger.console``, a page), counts, unresolved,
its leases past their deadline, and its log as a timeline (``ledger.log``).

The ledger says which rows are past their lease deadline (``leaseDeadlinePassed`` on each row:
still ``confirmed`` after its ``leaseDeadline``) and how many the whole run has
(``leasesOverdue``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from services.web.console import times
from services.web.console.reads import ask
from services.web.console.words import log_word
from shared import subjects

ROWS_PER_PAGE = 200
"""Rows shown per page of a run."""

LOG_PAGES = 5
"""At most this many pages of the log (1,000 entries each) are read for the timeline."""

TIMELINE_MAX = 300
"""The newest entries the timeline shows."""

DETAIL_CHARS = 240
"""A log entry's detail is cut to this many characters."""


def detail_text(detail: Any) -> str:
    """A log entry's detail, compact and cut (shown as text, escaped by the template)."""
    if detail is None:
        return ""
    text = json.dumps(detail, ensure_ascii=False, separators=(", ", ": "), sort_keys=True)
    return text if len(text) <= DETAIL_CHARS else text[:DETAIL_CHARS] + "…"


@dataclass
class RunView:
    """Everything the run page shows; ``error`` when the ledger could not say."""

    run_id: str
    run: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    unresolved: int = 0
    next_after: int | None = None
    leases_overdue: int = 0
    timeline: list[dict[str, Any]] = field(default_factory=list)
    log_left_out: int = 0
    log_more: bool = False
    error: str | None = None
    log_error: str | None = None


async def run_view(request: Request, run_id: str, after: int | None) -> RunView:
    view = RunView(run_id)
    body: dict[str, Any] = {"runId": run_id, "limit": ROWS_PER_PAGE}
    if after:
        body["after"] = after
    answer = await ask(request, subjects.LEDGER_CONSOLE, body, "ledger")
    if not answer.ok:
        view.error = answer.error
        return view
    reply = answer.reply
    run = reply.get("run")
    view.run = run if isinstance(run, dict) else {}
    view.rows = [r for r in reply.get("resources") or [] if isinstance(r, dict)]
    counts = reply.get("counts")
    view.counts = {k: v for k, v in counts.items() if isinstance(v, int)} if isinstance(counts, dict) else {}
    unresolved = reply.get("unresolved")
    view.unresolved = unresolved if isinstance(unresolved, int) else 0
    view.next_after = reply.get("next") if isinstance(reply.get("next"), int) else None
    overdue = reply.get("leasesOverdue")
    view.leases_overdue = overdue if isinstance(overdue, int) and not isinstance(overdue, bool) else 0
    await _timeline(request, view)
    return view


async def _timeline(request: Request, view: RunView) -> None:
    entries: list[dict[str, Any]] = []
    after: int | None = None
    for _page in range(LOG_PAGES):
        body: dict[str, Any] = {"runId": view.run_id, "limit": 1000}
        if after:
            body["after"] = after
        answer = await ask(request, subjects.LEDGER_LOG, body, "ledger")
        if not answer.ok:
            view.log_error = answer.error
            break
        entries += [e for e in answer.reply.get("entries") or [] if isinstance(e, dict)]
        after = answer.reply.get("next") if isinstance(answer.reply.get("next"), int) else None
        if after is None:
            break
    else:
        view.log_more = after is not None
    newest = entries[::-1][:TIMELINE_MAX]
    view.log_left_out = len(entries) - len(newest)
    view.timeline = [{"at": times.parse(e.get("at")), "kind": e.get("kind"), "word": log_word(e.get("kind")),
                      "resourceId": e.get("resourceId"), "detail": detail_text(e.get("detail"))}
                     for e in newest]
