"""The console's runs list and calendar, from ``ledger.runs``.

The runs list: filters (status, cleanup status, shard, a time window), incomplete cleanups
first, pages of :data:`PAGE_SIZE` that follow the ledger's cursor (``next``, sent back as
``after``) as far as the runs go. The ledger filters everything: ``status``,
``cleanupStatus``, ``shard``, and the window as ``startsFrom`` / ``startsBefore`` (epoch ms;
the runs whose schedule overlaps it, ordered by ``startsAt``; without a window, newest first).

Incomplete cleanups first, then the rest: the page walks two lists, each with its own
cursor. A page's position (the ``after`` of the page's link) is ``<list>:<ledger cursor>``:

- ``i`` — the incomplete runs (``cleanupStatus: incomplete``); when they run out, the same
  page goes on with the rest from its start;
- ``r`` — every run in the ledger's order, the incomplete ones skipped (they were listed
  first); the ledger cannot leave them out, so a page of the rest may take a few requests
  (at most :data:`REST_ROUNDS`; a page cut short there still goes on where it stopped);
- ``c`` — with a cleanup-status filter, that one list.

The calendar: every run whose schedule overlaps the days shown, by ``startsAt``. A run
without ``startsAt`` is not on it."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any

from fastapi import Request

from services.web.console import times
from services.web.console.reads import ask
from services.web.console.words import CLEANUP, RUN
from shared import subjects
from shared.contracts.ids import is_shard_id
from shared.contracts.ledger_statuses import CLEANUP_INCOMPLETE as INCOMPLETE

PAGE_SIZE = 50
"""Runs on one page."""

LEDGER_LIMIT = 1000
"""The most runs one ``ledger.runs`` answers (its ``limit`` at most)."""

REST_ROUNDS = 8
"""The most ``ledger.runs`` requests one page of the rest makes to skip incomplete runs."""

POSITION = re.compile(r"([icr]):([A-Za-z0-9_:-]{0,100})")
"""A page's position: its list and the ledger's cursor (opaque: only its characters are checked)."""

PAGE_NUMBER_MAX = 10**6

CALENDAR_DAYS = 14
"""Days the calendar shows unless asked for others."""

CALENDAR_DAYS_MAX = 31

CALENDAR_PAGES = 5
"""The most ``ledger.runs`` pages (1,000 runs each) the calendar reads."""


@dataclass
class RunFilter:
    """The runs page's query, each value checked."""

    status: str | None = None
    cleanup: str | None = None
    shard: str | None = None
    start: datetime | None = None
    end: datetime | None = None
    position: tuple[str, str | None] | None = None
    page: int = 1
    problems: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, query: Any) -> RunFilter:
        f = cls()
        status, cleanup = query.get("status") or None, query.get("cleanupStatus") or None
        if status is not None and status not in RUN:
            f.problems.append("status: not a run status")
        else:
            f.status = status
        if cleanup is not None and cleanup not in CLEANUP:
            f.problems.append("cleanup status: not a cleanup status")
        else:
            f.cleanup = cleanup
        shard = (query.get("shard") or "").strip() or None
        if shard is not None and not is_shard_id(shard):
            f.problems.append("shard: not a shard id ([a-z0-9_-]{1,32})")
        else:
            f.shard = shard
        for name in ("from", "to"):
            text = query.get(name)
            when = times.form_value(text)
            if text and text.strip() and when is None:
                f.problems.append(f"{name}: not a time")
            elif when is not None and times.to_ms(when) is None:
                f.problems.append(f"{name}: not between 1970 and 9999")
                when = None
            setattr(f, "start" if name == "from" else "end", when)
        if f.start and f.end and f.end <= f.start:
            f.problems.append("to: must be after from")
            f.end = None
        after = query.get("after") or ""
        found = POSITION.fullmatch(after)
        if found and (found.group(1) == "c") == bool(f.cleanup):
            f.position = (found.group(1), found.group(2) or None)
            page = query.get("page") or ""
            f.page = int(page) if page.isdigit() and 0 < int(page) <= PAGE_NUMBER_MAX else 2
        elif after:
            f.problems.append("after: not a page of this list; the first page is shown")
        return f

    @property
    def windowed(self) -> bool:
        """A time window orders the lists by ``startsAt`` (else newest first)."""
        return bool(self.start or self.end)

    def ledger_body(self) -> dict[str, Any]:
        """The filters as ``ledger.runs`` takes them (without the cleanup status, set per list)."""
        body: dict[str, Any] = {"status": self.status, "shard": self.shard,
                                "startsFrom": self.start and times.to_ms(self.start),
                                "startsBefore": self.end and times.to_ms(self.end)}
        return {k: v for k, v in body.items() if v is not None}

    def query(self, **changes: Any) -> dict[str, str]:
        """The page's query string values (for links), with ``changes``."""
        values = {"status": self.status, "cleanupStatus": self.cleanup, "shard": self.shard,
                  "from": self.start and times.form_text(self.start),
                  "to": self.end and times.form_text(self.end),
                  "after": self.position and f"{self.position[0]}:{self.position[1] or ''}",
                  "page": self.page if self.position else None}
        values.update(changes)
        return {k: str(v) for k, v in values.items() if v not in (None, "")}


@dataclass
class RunsPage:
    """One page of runs and the position of the next one (None on the last page)."""

    runs: list[dict[str, Any]]
    next: str | None = None
    error: str | None = None


async def _ask_runs(request: Request, f: RunFilter, cleanup: str | None, after: str | None,
                    limit: int) -> tuple[list[dict[str, Any]], str | None, str | None]:
    """(runs, the ledger's ``next``, error) of one ``ledger.runs`` with ``f``'s filters."""
    body = {**f.ledger_body(), "limit": limit}
    if cleanup:
        body["cleanupStatus"] = cleanup
    if after:
        body["after"] = after
    answer = await ask(request, subjects.LEDGER_RUNS, body, "ledger")
    if not answer.ok:
        return [], None, answer.error
    runs = [r for r in answer.reply.get("runs") or [] if isinstance(r, dict)]
    nxt = answer.reply.get("next")
    return runs, nxt if isinstance(nxt, str) and nxt else None, None


async def _rest_has_runs(request: Request, f: RunFilter) -> bool:
    """Whether any run that is not incomplete matches ``f`` (one run asked per other status)."""
    answers = await asyncio.gather(*(_ask_runs(request, f, status, None, 1) for status in CLEANUP
                                     if status != INCOMPLETE))
    return any(runs or error for runs, _next, error in answers)


async def runs_page(request: Request, f: RunFilter) -> RunsPage:
    """The page at ``f.position`` of the runs ``f`` selects, incomplete cleanups first."""
    phase, cursor = f.position or ("c" if f.cleanup else "i", None)
    shown: list[dict[str, Any]] = []
    if phase in ("c", "i"):
        runs, nxt, error = await _ask_runs(request, f, f.cleanup if phase == "c" else INCOMPLETE, cursor, PAGE_SIZE)
        if error:
            return RunsPage([], error=error)
        if nxt or phase == "c":
            return RunsPage(runs, next=nxt and f"{phase}:{nxt}")
        shown, phase, cursor = runs, "r", None  # the incomplete ones are done: the rest follows
        if len(shown) >= PAGE_SIZE:
            return RunsPage(shown, next="r:" if await _rest_has_runs(request, f) else None)
    for _round in range(REST_ROUNDS):
        runs, cursor, error = await _ask_runs(request, f, None, cursor, PAGE_SIZE - len(shown))
        if error:
            return RunsPage(shown, error=error)
        shown += [r for r in runs if r.get("cleanupStatus") != INCOMPLETE]
        if cursor is None or len(shown) >= PAGE_SIZE:
            break
    return RunsPage(shown, next=cursor and f"r:{cursor}")


# --- the calendar ----------------------------------------------------------------------

@dataclass
class Calendar:
    """The days shown (``first`` for ``days`` days), their runs, and what the page could not say."""

    first: date
    days: int
    by_day: list[tuple[date, list[dict[str, Any]]]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def start(self) -> datetime:
        return times.day_start(self.first)

    @property
    def end(self) -> datetime:
        return self.start + timedelta(days=self.days)

    @property
    def last(self) -> date:
        """The last day shown."""
        return self.first + timedelta(days=self.days - 1)

    def query(self, first: date | None = None) -> dict[str, str]:
        values = {"start": (first or self.first).isoformat()}
        if self.days != CALENDAR_DAYS:
            values["days"] = str(self.days)
        return values

    @property
    def earlier(self) -> dict[str, str]:
        return self.query(self.first - timedelta(days=self.days))

    @property
    def later(self) -> dict[str, str]:
        return self.query(self.first + timedelta(days=self.days))

    @classmethod
    def parse(cls, query: Any, today: date) -> Calendar:
        problems = []
        first, text = today, (query.get("start") or "").strip()
        if text:
            try:
                first = date.fromisoformat(text)
            except ValueError:
                problems.append("start: not a day (YYYY-MM-DD)")
        days, text = CALENDAR_DAYS, (query.get("days") or "").strip()
        if text:
            if text.isdigit() and len(text) <= 3 and 1 <= int(text) <= CALENDAR_DAYS_MAX:
                days = int(text)
            else:
                problems.append(f"days: a number from 1 to {CALENDAR_DAYS_MAX}")
        cal = cls(first, days, problems=problems)
        start_ms = times.to_ms(cal.start)
        if start_ms is None or start_ms + days * 86_400_000 > times.MS_MAX:
            cal.problems.append("start: not between 1970 and 9999")
            cal.first = today
        return cal


async def calendar(request: Request, cal: Calendar) -> Calendar:
    """Fill ``cal`` with the runs whose schedule overlaps its days (the ledger's order: by
    ``startsAt``), each on the day it starts (or the first day shown, when it began before)."""
    body: dict[str, Any] = {"startsFrom": times.to_ms(cal.start),
                            "startsBefore": times.to_ms(cal.end), "limit": LEDGER_LIMIT}
    found: list[dict[str, Any]] = []
    for _page in range(CALENDAR_PAGES):
        answer = await ask(request, subjects.LEDGER_RUNS, body, "ledger")
        if not answer.ok:
            cal.error = answer.error
            return cal
        found += [r for r in answer.reply.get("runs") or [] if isinstance(r, dict)]
        nxt = answer.reply.get("next")
        if not (isinstance(nxt, str) and nxt):
            break
        body["after"] = nxt
    else:
        cal.notes.append(f"more than {len(found)} runs in these days: only the first {len(found)} are shown "
                         "(show fewer days)")
    days: dict[date, list[dict[str, Any]]] = {}
    for run in found:
        starts = times.parse(run.get("startsAt"))
        if starts is None:  # the ledger lists scheduled runs only; this would be a ledger's bug
            continue
        run["_starts"] = starts
        run["_before"] = starts < cal.start
        run["_ends"] = times.parse(run.get("endsAt"))
        days.setdefault(max(starts, cal.start).date(), []).append(run)
    cal.by_day = sorted(days.items())
    return cal
