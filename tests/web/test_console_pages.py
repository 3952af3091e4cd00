"""The console's pages over plain HTTP against the real ledger: the runs list (incomplete first,
pages that follow the ledger's cursor past 1,000 runs, the shard and time filters sent to the
ledger, hostile query values), the calendar by ``startsAt``, the leases past their deadline,
everything a service sends escaped, and the shards page's silent shards from every gateway
replica's ``gateway.status``. Plus the pure pieces: the filter as the ledger takes it, rates."""

from __future__ import annotations

import contextlib
import html as htmllib
import json
import re
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import httpx

from services.web.console import auth as console_auth
from services.web.console import runs as console_runs
from services.web.console.runs import RunFilter
from services.web.console.shards import _rates
from shared import subjects
from tests.ledger.conftest import db, ledger, ledger_db  # noqa: F401 — fixtures
from tests.web.conftest import OPERATOR_TOKEN

HOSTILE = '<script>alert("x")</script>"><img src=x onerror=alert(1)>'


@contextlib.asynccontextmanager
async def _console(door) -> AsyncIterator[httpx.AsyncClient]:
    """A logged-in browser-like client."""
    async with door.client(None, follow_redirects=False) as http:
        reply = await http.post("/console/login", data={"token": OPERATOR_TOKEN})
        assert reply.status_code == 303 and console_auth.COOKIE in reply.cookies
        yield http


def _runs(html: str) -> list[str]:
    return re.findall(r'<tr data-run="([^"]+)"', html)


def _next(html: str) -> str | None:
    """The page's "next page" link (unescaped), or None on the last page."""
    found = re.search(r'<a rel="next" href="([^"]+)"', html)
    return htmllib.unescape(found.group(1)) if found else None


def _p(*numbers: int) -> list[str]:
    return [f"p{n:04d}" for n in numbers]


async def _fill(db, count: int, incomplete: str = "g IN (5, 77)") -> None:  # noqa: F811
    """``count`` runs straight into the ledger's table, created one a minute apart from
    2026-01-01 00:00 UTC, newest last; every tenth on shard uo2; those matching ``incomplete``
    (SQL over ``g``, the run's number) with an incomplete cleanup. Each is scheduled to start
    when it was created, the even ones ending 5 minutes later (the odd ones without an end);
    every 13th is not scheduled."""
    await db.execute(f"""
        INSERT INTO runs (run_id, shard, event, status, cleanup_status, created_at, updated_at, starts_at, ends_at)
        SELECT 'p' || lpad(g::text, 4, '0'), CASE WHEN g % 10 = 0 THEN 'uo2' ELSE 'uo1' END, 'invasion',
               'completed', CASE WHEN {incomplete} THEN 'incomplete' ELSE 'complete' END,
               timestamptz '2026-01-01 00:00:00+00' + g * interval '1 minute', now(),
               CASE WHEN g % 13 <> 0 THEN 1767225600000 + g::bigint * 60000 END,
               CASE WHEN g % 13 <> 0 AND g % 2 = 0 THEN 1767225600000 + g::bigint * 60000 + 300000 END
        FROM generate_series(1, $1) g""", count)


async def _walk(http: httpx.AsyncClient, path: str, params: dict[str, str] | None = None) -> list[list[str]]:
    """Every page of a runs list, following its "next page" links: each page's runs."""
    pages = []
    reply = await http.get(path, params=params)
    while True:
        assert reply.status_code == 200 and 'class="problem"' not in reply.text, reply.text[-2000:]
        pages.append(_runs(reply.text))
        link = _next(reply.text)
        if link is None:
            return pages
        assert len(pages) < 100, "the pages do not end"
        reply = await http.get(link)


async def test_the_runs_list_puts_incomplete_first_pages_and_filters(door, ledger, db):  # noqa: F811
    await _fill(db, 130)
    async with _console(door) as http:
        pages = await _walk(http, "/console/runs")
        assert pages == [_p(77, 5, *range(130, 82, -1)),  # incomplete first, then the newest
                         _p(*(n for n in range(82, 31, -1) if n != 77)),
                         _p(*(n for n in range(31, 0, -1) if n != 5))]
        assert [len(p) for p in pages] == [50, 50, 30]
        last = (await http.get(_next((await http.get(_next((await http.get("/console/runs")).text))).text))).text
        assert "Page 3." in last and 'rel="first"' in last and 'rel="next"' not in last

        assert await _walk(http, "/console/runs", {"cleanupStatus": "incomplete"}) == [_p(77, 5)]
        assert await _walk(http, "/console/runs", {"shard": "uo2"}) == [_p(*range(130, 0, -10))]
        # The window: runs whose schedule overlaps it, by start time (p0078 has none; p0070 ends at 01:15).
        window = {"from": "2026-01-01T01:15", "to": "2026-01-01T01:20"}
        assert await _walk(http, "/console/runs", window) == [_p(77, 70, 72, 74, 75, 76, 79)]
        assert await _walk(http, "/console/runs", {**window, "cleanupStatus": "complete"}) == \
            [_p(70, 72, 74, 75, 76, 79)]
        page = (await http.get("/console/runs", params=window)).text
        assert 'value="2026-01-01T01:15"' in page and "overlaps the window" in page
        assert "not scheduled" in (await http.get("/console/runs", params={"shard": "uo1"})).text  # p0039
        assert await _walk(http, "/console/runs", {"from": "2026-01-01T02:05"}) == \
            [_p(120, 122, 124, 125, 126, 127, 128, 129)]  # p0120 ends at 02:05; p0130 is not scheduled

        hostile = await http.get("/console/runs", params={"status": HOSTILE, "shard": HOSTILE, "from": "soon",
                                                          "to": "1969-12-31T23:00", "after": HOSTILE,
                                                          "page": "9" * 40})
        assert hostile.status_code == 200
        for said in ("status: not a run status", "from: not a time", "to: not between 1970 and 9999",
                     "after: not a page of this list"):
            assert said in hostile.text, said
        assert "<script>alert" not in hostile.text
        backwards = (await http.get("/console/runs", params={"from": "2026-01-01T02:00", "to": "2026-01-01T01:00"}))
        assert "to: must be after from" in backwards.text and _runs(backwards.text)[0] == "p0116"  # from only
        foreign = await http.get("/console/runs", params={"after": "c:1:p0001"})  # a cleanup-filtered list's
        assert "after: not a page of this list" in foreign.text and _runs(foreign.text)[0] == "p0077"
        refused = await http.get("/console/runs", params={"after": "r:nonsense"})  # the ledger's 400, said
        assert refused.status_code == 200 and "400: " in refused.text


async def test_pages_go_past_a_thousand_runs_and_skip_the_incomplete_in_the_rest(door, ledger, db,  # noqa: F811
                                                                                 monkeypatch):
    await _fill(db, 1230, incomplete="g % 24 = 0 AND g <= 1200")  # 50 incomplete: exactly one page
    incomplete = list(range(1200, 0, -24))
    rest = [n for n in range(1230, 0, -1) if n not in incomplete]
    async with _console(door) as http:
        pages = await _walk(http, "/console/runs")
        assert [len(p) for p in pages] == [50] * 24 + [30]
        assert [run for page in pages for run in page] == _p(*incomplete, *rest)
        # However few runs a page's requests find, the next page goes on where it stopped.
        monkeypatch.setattr(console_runs, "REST_ROUNDS", 1)
        pages = await _walk(http, "/console/runs", {"status": "completed"})
        assert [run for page in pages for run in page] == _p(*incomplete, *rest)
        assert min(len(p) for p in pages[1:-1]) < 50 and len(pages) > 25


def test_the_filters_go_to_the_ledger_as_it_takes_them():
    f = RunFilter.parse({"status": "running", "shard": "uo2", "from": "2026-01-01T01:15",
                         "to": "2026-01-01T01:20:30Z", "cleanupStatus": ""})
    assert f.problems == []
    assert f.ledger_body() == {"status": "running", "shard": "uo2", "startsFrom": 1767230100000,
                               "startsBefore": 1767230430000}
    assert f.query() == {"status": "running", "shard": "uo2", "from": "2026-01-01T01:15",
                         "to": "2026-01-01T01:20:30"}
    later = RunFilter.parse({"after": "r:1767230100000:p0001", "page": "3"})
    assert (later.position, later.page) == (("r", "1767230100000:p0001"), 3)
    assert later.query()["after"] == "r:1767230100000:p0001"
    assert RunFilter.parse({"page": "3"}).page == 1  # a page number alone is not a position


async def test_the_calendar_places_scheduled_runs_by_their_start(door, ledger, db):  # noqa: F811
    await _fill(db, 130)
    await db.execute("""
        INSERT INTO runs (run_id, shard, event, status, cleanup_status, created_at, updated_at, starts_at, ends_at)
        VALUES ('q0001', 'uo1', 'vigil', 'running', 'pending', now(), now(), 1767224400000, 1767226200000),
               ('q0002', 'uo1', 'fair', 'scheduled', 'pending', now(), now(), 1767416400000, NULL),
               ('q0003', 'uo1', 'unplanned', 'scheduled', 'pending', now(), now(), NULL, NULL)""")
    async with _console(door) as http:
        page = (await http.get("/console/calendar", params={"start": "2026-01-01", "days": "1"})).text
        assert re.findall(r'<section class="day" data-day="([^"]+)"', page) == ["2026-01-01"]
        # q0001 began the day before (23:40) and ends at 00:30: on the first day, said so.
        assert _calendar(page) == ["q0001", *_p(*(n for n in range(1, 131) if n % 13))]
        assert "(started 2025-12-31 23:40:00 UTC)" in page and "q0003" not in page
        assert "A run without a start time (<code>startsAt</code>) is not on the calendar" in page

        fortnight = (await http.get("/console/calendar", params={"start": "2026-01-01"})).text
        assert re.findall(r'data-day="([^"]+)"', fortnight) == ["2026-01-01", "2026-01-03"]
        assert _calendar(fortnight)[-1] == "q0002" and "2026-01-01 to 2026-01-14" in fortnight
        assert 'href="/console/calendar?start=2026-01-15"' in fortnight  # later →

        empty = (await http.get("/console/calendar", params={"start": "2026-02-01"})).text
        assert "No run is scheduled in these days." in empty
        hostile = await http.get("/console/calendar", params={"start": HOSTILE, "days": "0"})
        assert hostile.status_code == 200 and "<script>alert" not in hostile.text
        assert "start: not a day" in hostile.text and "days: a number from 1 to 31" in hostile.text
        far = await http.get("/console/calendar", params={"start": "9999-12-30"})
        assert far.status_code == 200 and "start: not between 1970 and 9999" in far.text


def _calendar(html: str) -> list[str]:
    return re.findall(r'<li data-run="([^"]+)"', html)


def _ms(offset_s: float) -> int:
    return int((time.time() + offset_s) * 1000)


async def _lease(ledger, run: str, ref: str, deadline: int | None, reserve: bool = False) -> int:  # noqa: F811
    body: dict[str, Any] = {"runId": run, "module": "events", "kind": "lease", "ref": ref,
                            "idempotencyKey": f"{run}:{ref}"}
    if deadline is not None:
        body["leaseDeadline"] = deadline
    reply = await ledger.ask(subjects.LEDGER_RESOURCE_RESERVE if reserve else subjects.LEDGER_RESOURCE_RECORD,
                             **body)
    assert reply["status"] == 200, reply
    return reply["resource"]["resourceId"]


def _leases(html: str) -> list[int]:
    return [int(n) for n in re.findall(r'<tr data-lease="(\d+)"', html)]


async def test_leases_past_their_deadline_are_listed_with_their_runs(door, ledger, db, unique):  # noqa: F811
    async with _console(door) as http:
        assert "No lease is past its deadline." in (await http.get("/console/runs")).text
        a, b = f"a{unique}", f"b{unique}"
        for run in (a, b):
            await ledger.run(run, "running")
        older = await _lease(ledger, a, "older", _ms(-86_400))
        old = await _lease(ledger, b, HOSTILE, _ms(-3_600))
        await _lease(ledger, a, "later", _ms(3_600))
        await _lease(ledger, a, "none", None)
        await _lease(ledger, b, "pending", _ms(-60), reserve=True)  # not out there yet: not a lease overdue
        runs = (await http.get("/console/runs")).text
        assert _leases(runs) == [older, old]  # most overdue first
        assert re.search(r'id="leases-overdue-count">2<', runs) and f'href="/console/runs/{a}"' in runs
        assert "<script>alert" not in runs and "24 h ago" in runs and "60 min ago" in runs
        detail = (await http.get(f"/console/runs/{b}")).text
        assert re.search(r'id="leases-overdue">1<', detail) and detail.count("deadline passed") == 1

        many = [await _lease(ledger, b, f"m{i}", _ms(-60 - i)) for i in range(12)]
        runs = (await http.get("/console/runs")).text
        assert re.search(r'id="leases-overdue-count">14<', runs) and len(_leases(runs)) == 10
        assert "and 4 more" in runs and 'href="/console/leases"' in runs
        brief = (await http.get("/console/leases", params={"brief": "1", "fragment": "1"})).text
        assert _leases(brief) == _leases(runs) and "<html" not in brief
        every = (await http.get("/console/leases")).text
        assert _leases(every) == [older, old, *many[::-1]] and "more" not in every
        await db.execute("UPDATE resources SET status = 'reverted' WHERE id = $1", older)  # given back
        assert _leases((await http.get("/console/leases")).text)[0] == old


async def test_what_services_send_is_escaped_and_deadlines_show(door, ledger, unique):  # noqa: F811
    run = f"x{unique}"
    await ledger.ask(subjects.LEDGER_RUN_CREATE, runId=run, shard="uo1", event=HOSTILE, startsAt=_ms(60))
    await ledger.ask(subjects.LEDGER_RUN_STATUS, runId=run, status="running")
    for ref, deadline in ((HOSTILE, 1_000), ("later", 253_402_300_799_999), ("none", None)):
        await _lease(ledger, run, ref, deadline)
    async with _console(door) as http:
        for path in ("/console/runs", f"/console/runs/{run}", "/console/calendar", "/console/leases"):
            page = await http.get(path)
            assert page.status_code == 200, path
            assert "<script>alert" not in page.text and "<img src=x" not in page.text, path
            assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in page.text, path
            assert re.findall(r"<script[^>]*>", page.text) == ['<script src="/console/static/console.js" defer>']
        detail = (await http.get(f"/console/runs/{run}")).text
        assert detail.count("deadline passed") == 1
        assert re.search(r'id="leases-overdue">1<', detail) and re.search(r'id="unresolved">3<', detail)
        missing = await http.get(f"/console/runs/nope{unique}")
        assert missing.status_code == 404 and "no run" in missing.text
        bad = await http.get("/console/runs/a.b")
        assert bad.status_code == 404 and "a run id must match" in bad.text


async def test_the_shards_page_gathers_every_gateway_and_marks_the_silent(door, nc):
    def replica(shards: list[dict[str, Any]]):
        async def answer(msg: Any) -> None:
            await msg.respond(json.dumps({"status": 200, "shards": shards}).encode())
        return answer

    common = {"protocol": 7, "connectedAt": 1_733_000_000_000, "frames": 10, "deadLetters": 0, "unpublished": 0,
              "boardWritesPending": 0}
    subs = [await nc.subscribe(subjects.GATEWAY_STATUS, cb=replica(
                [{**common, "shard": "quiet1", "lastLineAt": 1_733_000_000_000, "silentForS": 120.0}])),
            await nc.subscribe(subjects.GATEWAY_STATUS, cb=replica(
                [{**common, "shard": "busy1", "lastLineAt": 1_733_000_000_000, "silentForS": 0.5},
                 {**common, "shard": "<b>", "silentForS": 1}]))]  # not a shard id: left out
    await nc.flush()
    try:
        async with _console(door) as http:
            page = (await http.get("/console/shards", params={"fragment": "1"})).text
    finally:
        for sub in subs:
            await sub.unsubscribe()
    assert re.findall(r'<tr data-shard="([^"]+)" class="([^"]*)"', page) == [("busy1", ""), ("quiet1", "silent")]
    assert page.count("> silent</span>") == 2  # the quiet shard's row, and the legend


def test_rates_per_minute_from_two_readings_and_a_reconnect_starts_afresh():
    samples: dict[str, deque] = {}
    shard = {"shard": "uo1", "connectedAt": 1_000_000, "frames": 100, "deadLetters": 1}
    frames, dead, over = _rates(samples, shard, 1_060.0)  # one reading: the average since connecting
    assert (round(frames), round(dead), over) == (100, 1, "since it connected")
    frames, dead, over = _rates(samples, {**shard, "frames": 400, "deadLetters": 4}, 1_090.0)
    assert (round(frames), round(dead), over) == (600, 6, "last 30 s")
    frames, _dead, over = _rates(samples, {**shard, "connectedAt": 1_085_000, "frames": 5}, 1_095.0)
    assert over == "since it connected" and round(frames) == 30
