"""The console's module page in a real browser (headless Chromium) against a real installer
process and the installer tests' local HTTPS release host: an install from a manifest URL shows
its progress (installer.progress) and then the module; a removal asks first, then frees the site."""

from __future__ import annotations

from tests.installer.conftest import ca_file, releases, service_settings, settings  # noqa: F401 — fixtures
from tests.web.console_browser import browser, log_in, new_page, no_js_errors, screenshot  # noqa: F401


async def test_install_and_remove_the_module_in_a_browser(browser, start_door, services, settings,  # noqa: F811
                                                          releases, unique):  # noqa: F811
    services.start("installer", **service_settings(settings))
    manifest = releases.release(f"/{unique}", "uo-events", "1.4.0")
    releases.routes[f"/{unique}/uo-events-1.4.0.tar.gz"].delay_s = 1.5  # a slow host: progress to watch
    door = await start_door()
    page = await new_page(browser)
    try:
        await log_in(page, door.url, "/console/module")
        await page.wait_for_url("**/console/module")
        await page.wait_for_selector("#no-module")

        await page.fill("#manifest-url", manifest)
        await page.click("#install-button")
        await page.wait_for_selector('#install-progress[data-stages~="manifest"]')  # while it downloads
        assert await page.get_attribute("#answer", "data-status") in ("", None)
        await screenshot(page, "module-progress")
        await page.wait_for_selector('#answer[data-status="201"]')
        assert "installed uo-events 1.4.0" in await page.inner_text("#answer")
        stages = (await page.get_attribute("#install-progress", "data-stages")).split()
        assert stages[0] == "manifest" and "download" in stages and stages[-1] == "done", stages
        assert await page.eval_on_selector("#install-bar", "bar => bar.value") == 100
        installed = page.locator('#installed li[data-module="uo-events"]')
        await installed.wait_for()
        assert "1.4.0" in await installed.inner_text()
        await screenshot(page, "module")

        # Removal asks first.
        await installed.locator("text=Remove…").click()
        await page.click("text=Yes, remove it")
        await page.wait_for_selector('#answer[data-status="200"]')
        assert "removed uo-events 1.4.0" in await page.inner_text("#answer")
        await page.wait_for_selector("#no-module")

        # A refusal is shown with the installer's sentence.
        await page.fill("#manifest-url", f"https://127.0.0.1:{releases.port}/{unique}/missing.json")
        await page.click("#install-button")
        await page.wait_for_selector('#answer[data-status="400"]')
        assert "no such release" in await page.inner_text("#answer")
        no_js_errors(page)
    finally:
        await page.context.close()
