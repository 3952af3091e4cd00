"""The console's runs in a real browser (headless Chromium) against the real stack: the door,
the ledger on PostgreSQL, a cleanup process, and a game module giving back its banners over
NATS. One browser, several pages: a wrong token is refused, the operator logs in, a run created
and cleaned while its page is open turns "given back" live, an incomplete run is listed first
and its "sweep now" and "retry cleanup" buttons answer and complete it, a passed lease deadline
shows (on the run and in the runs page's leases past their deadline), and the calendar places
runs by their start and links each to its page."""

from __future__ import annotations

import json
import time
from typing import Any

from shared import subjects
from tests.cleanup.conftest import start_cleanup
from tests.ledger.conftest import ledger, ledger_db  # noqa: F401 — fixtures
from tests.web.conftest import WEBSITE_TOKEN
from tests.web.console_browser import browser, log_in, new_page, no_js_errors, screenshot, wait_live  # noqa: F401


async def _ok(nc: Any, subject: str, **body: Any) -> dict[str, Any]:
    reply = json.loads((await nc.request(subject, json.dumps(body).encode(), timeout=60)).data)
    assert 200 <= reply["status"] < 300, (subject, body, reply)
    return reply


async def _running_run(nc: Any, run: str, shard: str, refs: list[str], **schedule: Any) -> None:
    await _ok(nc, subjects.LEDGER_RUN_CREATE, runId=run, shard=shard, event="invasion", **schedule)
    await _ok(nc, subjects.LEDGER_RUN_STATUS, runId=run, status="running")
    for ref in refs:
        await _ok(nc, subjects.LEDGER_RESOURCE_RECORD, runId=run, module="events", kind="banner", ref=ref,
                  idempotencyKey=f"{run}:{ref}")


def _row(page: Any, ref: str) -> Any:
    return page.locator("tr[data-resource]", has=page.locator(f"code:text-is('{ref}')"))


async def test_the_runs_console_in_a_browser(browser, start_door, ledger, services, nc, unique):  # noqa: F811
    answers = {"result": "removed"}

    async def module_revert(msg: Any) -> None:  # the game module giving back its banners
        await msg.respond(json.dumps({"status": 200, "result": answers["result"], "reason": "not now"}).encode())

    revert = await nc.subscribe(subjects.module_revert("events"), cb=module_revert)
    await nc.flush()
    await start_cleanup(services, max_attempts="1")
    door = await start_door()
    shard = f"c{unique}"
    page = await new_page(browser)
    try:
        # A wrong token is refused: the website's is not the operator's.
        await log_in(page, door.url, token=WEBSITE_TOKEN)
        await page.wait_for_selector("#login-error")
        assert "not the operator's" in await page.inner_text("#login-error")
        assert "/console/login" in page.url
        assert [c for c in await page.context.cookies() if c["name"] == "shardbus_console"] == []
        await screenshot(page, "login")

        # The operator logs in and lands on the runs page, live.
        await page.fill("#token", door.settings.web_operator_token.get_secret_value())
        await page.click("button[type=submit]")
        await page.wait_for_url("**/console/runs")
        cookie = next(c for c in await page.context.cookies() if c["name"] == "shardbus_console")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert door.settings.web_operator_token.get_secret_value() not in cookie["value"]
        await wait_live(page)

        # A run created while the list is open appears in it.
        run = f"a{unique}"
        await _ok(nc, subjects.LEDGER_RUN_CREATE, runId=run, shard=shard, event="invasion")
        await page.wait_for_selector(f'tr[data-run="{run}"]')

        # Its page: rows arrive live, a passed lease deadline shows, and a cleanup done elsewhere
        # turns every row "given back" without a reload.
        await page.click(f'a[href="/console/runs/{run}"]')
        await page.wait_for_url(f"**/console/runs/{run}")
        await wait_live(page)
        await _ok(nc, subjects.LEDGER_RUN_STATUS, runId=run, status="running")
        await _ok(nc, subjects.LEDGER_RESOURCE_RECORD, runId=run, module="events", kind="banner", ref="b1",
                  idempotencyKey=f"{run}:b1")
        await _ok(nc, subjects.LEDGER_RESOURCE_RECORD, runId=run, module="events", kind="banner", ref="b2",
                  idempotencyKey=f"{run}:b2", leaseDeadline=int(time.time() * 1000) - 60_000)
        await _row(page, "b2").locator("text=deadline passed").wait_for()
        assert await _row(page, "b1").locator(".badge[data-status=confirmed]").inner_text() == "● still out there"
        assert await page.inner_text("#leases-overdue") == "1"
        assert await page.inner_text("#unresolved") == "2"
        b2 = await _row(page, "b2").get_attribute("data-resource")
        await page.goto(f"{door.url}/console/runs")  # the runs page lists it among the leases past their deadline
        await page.locator(f'#leases tr[data-lease="{b2}"] a[href="/console/runs/{run}"]').click()
        await page.wait_for_url(f"**/console/runs/{run}")
        await wait_live(page)
        await _ok(nc, subjects.LEDGER_RUN_STATUS, runId=run, status="completed")
        swept = await _ok(nc, subjects.CLEANUP_SWEEP, runId=run)
        assert swept["run"]["reverted"] == 2
        for ref in ("b1", "b2"):
            await _row(page, ref).locator(".badge[data-status=reverted]:has-text('given back')").wait_for()
        await page.wait_for_selector("#run-cleanup .badge[data-status=complete]")
        assert await page.inner_text("#unresolved") == "0"
        assert "given back" in await page.inner_text("#timeline")
        await screenshot(page, "run")

        # An incomplete run: "sweep now" answers, the list puts it first, "retry cleanup" completes it.
        stuck = f"b{unique}"
        await _running_run(nc, stuck, shard, ["s1"])
        await _ok(nc, subjects.LEDGER_RUN_STATUS, runId=stuck, status="failed")
        answers["result"] = "refused"
        await page.goto(f"{door.url}/console/runs/{stuck}")
        await wait_live(page)
        assert await page.locator("#retry-cleanup").count() == 0
        await page.click("#sweep-now")
        await page.wait_for_selector('#answer[data-status="200"]')
        assert "cleanup incomplete" in await page.inner_text("#answer")
        await page.wait_for_selector("#retry-cleanup")  # the page caught up with the ledger's event
        await page.wait_for_selector("#run-cleanup .badge[data-status=incomplete]")

        newer = f"c{unique}"
        await _ok(nc, subjects.LEDGER_RUN_CREATE, runId=newer, shard=shard, event="festival",
                  startsAt=int(time.time() * 1000) + 3_600_000)
        await page.goto(f"{door.url}/console/runs")
        first = page.locator("table.runs tbody tr").first
        assert await first.get_attribute("data-run") == stuck  # incomplete first, though older
        assert "wants a person" in await first.inner_text()
        await screenshot(page, "runs")

        answers["result"] = "removed"
        await page.goto(f"{door.url}/console/runs/{stuck}")
        await page.click("#retry-cleanup")
        await page.wait_for_selector('#answer[data-status="200"]')
        assert "cleanup complete" in await page.inner_text("#answer")
        await _row(page, "s1").locator(".badge[data-status=reverted]").wait_for()
        await page.wait_for_selector("#run-cleanup .badge[data-status=complete]")
        assert await page.locator("#retry-cleanup").count() == 0

        # The calendar: runs by the time they start, each linking to its run.
        going = f"d{unique}"
        now_ms = int(time.time() * 1000)
        await _running_run(nc, going, shard, [], startsAt=now_ms - 60_000, endsAt=now_ms + 7_200_000)
        await page.goto(f"{door.url}/console/calendar")
        assert "running" in await page.locator(f'li[data-run="{going}"]').inner_text()
        entry = page.locator(f'li[data-run="{newer}"]')
        assert "festival" in await entry.inner_text() and "scheduled" in await entry.inner_text()
        assert await page.locator(f'li[data-run="{run}"]').count() == 0  # not scheduled: not on the calendar
        assert "not on the calendar" in await page.inner_text("p.legend")
        await screenshot(page, "calendar")
        await entry.locator("a").click()
        await page.wait_for_url(f"**/console/runs/{newer}")
        await page.wait_for_selector("#run-status .badge[data-status=scheduled]")
        no_js_errors(page)
    finally:
        await page.context.close()
        await revert.unsubscribe()


async def test_a_run_waiting_too_long_for_its_shard_is_flagged_on_the_runs_list_and_its_page(
        browser, start_door, ledger, services, nc, unique):  # noqa: F811
    """A finished run on a shard no gateway holds: its give-back meets nobody, it stays pending.
    A door whose ``SHARDBUS_AWAY_ALERT_S`` is 0 flags it amber in words on the runs list and its
    page (with "Retry cleanup", which tries it now); one with the default (900 s) says it waits,
    without the flag."""
    await start_cleanup(services, away_backoff_s="600", away_backoff_max_s="600")
    alerting, patient = await start_door(away_alert_s=0), await start_door()
    run = f"w{unique}"
    await _ok(nc, subjects.LEDGER_RUN_CREATE, runId=run, shard=f"gone{unique}", event="invasion")
    await _ok(nc, subjects.LEDGER_RUN_STATUS, runId=run, status="running")
    await _ok(nc, subjects.LEDGER_RESOURCE_RECORD, runId=run, module="events", kind="creature", ref="c1",
              idempotencyKey=f"{run}:c1")
    await _ok(nc, subjects.LEDGER_RUN_STATUS, runId=run, status="completed")
    swept = await _ok(nc, subjects.CLEANUP_SWEEP, runId=run)
    assert (swept["run"]["away"], swept["run"]["cleanupStatus"]) == (1, "pending"), swept

    page = await new_page(browser)
    try:
        await log_in(page, alerting.url)
        await page.wait_for_url("**/console/runs")
        row = page.locator(f'tr[data-run="{run}"]')
        assert "wants-person" in (await row.get_attribute("class") or "")
        flag = row.locator(".badge.c-amber.waiting-too-long")
        assert "for its shard" in await flag.inner_text() and "waiting" in await flag.inner_text()
        await page.goto(f"{alerting.url}/console/runs/{run}")
        flag = page.locator("#run-waiting.waiting-too-long.c-amber")
        assert "for its shard" in await flag.inner_text()
        assert "wants-person" in (await page.locator("#run-cleanup").get_attribute("class") or "")
        await page.click("#retry-cleanup")  # tries now: the shard is still away, so it waits on
        await page.wait_for_selector('#answer[data-status="200"]')
        assert "cleanup pending" in await page.inner_text("#answer")
        no_js_errors(page)
    finally:
        await page.context.close()

    page = await new_page(browser)
    try:
        await log_in(page, patient.url)
        await page.wait_for_url("**/console/runs")
        row = page.locator(f'tr[data-run="{run}"]')
        await row.wait_for()
        assert await row.locator(".waiting-too-long").count() == 0
        assert "wants-person" not in (await row.get_attribute("class") or "")
        await page.goto(f"{patient.url}/console/runs/{run}")
        assert "for its shard" in await page.inner_text("#run-waiting.waiting")
        assert await page.locator(".waiting-too-long").count() == 0
    finally:
        await page.context.close()
