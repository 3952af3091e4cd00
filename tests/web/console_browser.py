"""The console's browser fixture: Debian's Chromium (``/usr/bin/chromium``, installed by ``make
browser``, which ``make test`` and .ci/run run) driven by Playwright for Python through
``executable_path`` — Playwright's own browser downloads are never used. A missing browser is a
failure, never a skip. Every wait is bounded (:data:`WAIT_MS`); the browser is closed by its
own handle.

``SHARDBUS_CONSOLE_SCREENSHOTS=1`` makes the tests write the screenshots of docs/console.md
(docs/console/*.png); a normal run leaves the tree alone."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.web.conftest import OPERATOR_TOKEN

CHROMIUM = os.environ.get("SHARDBUS_TEST_CHROMIUM", "/usr/bin/chromium")
ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "docs" / "console"
WAIT_MS = 20_000
"""The longest any one browser wait takes."""


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    """A headless Chromium; closed after the test."""
    assert Path(CHROMIUM).exists(), (
        f"no Chromium at {CHROMIUM}: the console's tests need Debian's chromium package "
        "(`make browser` installs it: apt-get install -y chromium)")
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        chromium = await playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, timeout=WAIT_MS,
            args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"])
        try:
            yield chromium
        finally:
            await chromium.close()


async def new_page(browser: Any) -> Any:
    """A fresh page (its own cookies) with every wait bounded."""
    context = await browser.new_context(viewport={"width": 1360, "height": 900})
    page = await context.new_page()
    page.set_default_timeout(WAIT_MS)
    page.set_default_navigation_timeout(WAIT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text)
            if msg.type == "error" and ("Refused to" in msg.text or "Content Security Policy" in msg.text) else None)
    page.js_errors = errors  # type: ignore[attr-defined]
    return page


async def log_in(page: Any, url: str, path: str = "/console/runs", token: str = OPERATOR_TOKEN) -> None:
    """Open ``path`` (the login page comes first) and log in with ``token``."""
    await page.goto(url + path)
    await page.wait_for_url("**/console/login**")
    await page.fill("#token", token)
    await page.click("button[type=submit]")


async def wait_live(page: Any) -> None:
    """Until the page's feed is connected (the header's badge says "live")."""
    await page.wait_for_selector('#live[data-live-state="live"]', timeout=WAIT_MS)


async def screenshot(page: Any, name: str) -> None:
    """docs/console/<name>.png, when SHARDBUS_CONSOLE_SCREENSHOTS=1."""
    if os.environ.get("SHARDBUS_CONSOLE_SCREENSHOTS") == "1":
        SHOTS.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def no_js_errors(page: Any) -> None:
    """The page raised no script error and the browser refused nothing under the CSP."""
    assert page.js_errors == [], page.js_errors
