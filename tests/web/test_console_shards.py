"""The console's shards and boards pages in a real browser (headless Chromium) against a real
gateway process with the shard simulator dialled in over TCP: the connected shard with its
protocol and last line, a dead letter with its reason, and the guild board — a roster that
arrives while the page is open appears on it live; "no roster yet" is not an empty roster."""

from __future__ import annotations

from tests.cleanup.conftest import connect_shard
from tests.web.console_browser import browser, log_in, new_page, no_js_errors, screenshot, wait_live  # noqa: F401


async def test_shards_and_boards_in_a_browser(browser, start_door, services, nc, unique):  # noqa: F811
    shard = f"s{unique}"
    linked = await connect_shard(nc, services, shard)
    door = await start_door()
    page = await new_page(browser)
    try:
        await linked.sim.send("guild.update", id=7, name="The Cartographers", abbr="MAP", members=2, online=1)
        await linked.sim.send_guild(8, "Empty Hall", [], abbr="EH")
        await linked.sim.send("guild.update", id=9, name="Wanderers", abbr="WND", members=5, online=0)
        await linked.sim.send("guild.update", id="not-a-number", name="Broken")  # dead-lettered
        await linked.sim.send("vendor.listing", serial="0x4001", ownerAcct="<b>alice</b>", fees={"charge": 10})

        await log_in(page, door.url, "/console/shards")
        await page.wait_for_url("**/console/shards")
        row = page.locator(f'tr[data-shard="{shard}"]')
        assert (await row.locator("td").nth(1).inner_text()) == "7"  # protocol
        assert "ago" in await row.locator("td").nth(3).inner_text()  # the last line, and how long ago
        reason = page.locator("table.dead-letters td.reason", has_text="its id must be an integer")
        await reason.first.wait_for()  # the page polls: the dead letter shows within seconds
        await screenshot(page, "shards")

        # The boards: a roster that arrives while the page is open shows, live.
        await page.click(f'tr[data-shard="{shard}"] a')
        await page.wait_for_url(f"**/console/boards?shard={shard}")
        await wait_live(page)
        cartographers = page.locator('li.guild[data-guild="7"]')
        assert "no roster yet" in await cartographers.inner_text()
        assert "empty roster" in await page.locator('li.guild[data-guild="8"]').inner_text()
        assert "no roster yet" in await page.locator('li.guild[data-guild="9"]').inner_text()
        assert "<b>alice</b>" in await page.inner_text("#board-market")  # shown as text, not markup
        assert "Not kept by the gateway" in await page.inner_text("#board-ruleset")
        await linked.sim.send("guild.roster", id=7, seq=0, more=False,
                              members=[{"serial": "0x1", "name": "Ada"}, {"serial": "0x2", "name": "Bo"}])
        await cartographers.locator(".roster-known").wait_for()
        assert await cartographers.locator(".member").all_inner_texts() == ["Ada", "Bo"]
        await screenshot(page, "boards")
        no_js_errors(page)
    finally:
        await page.context.close()
        await linked.sim.close()
