"""The run console's pages, rendered once per change (``services/ledger/console_cache.py``):
a page read again unchanged is served from this process's memory, byte for byte what a render
gives; a page after any change committed — through the ledger's subjects, by another ledger
sharing the database, by a transaction that began before the page was rendered — or after a
lease deadline passed is the new one; the cache's memory stays within its bound; bad requests
get their 400 as before."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import asyncpg
import pytest

from services.ledger import console
from services.ledger.console_cache import ENTRY_OVERHEAD, ConsoleCache, Mark, Page, cache_of
from services.ledger.database.store import Database, NotFound
from shared import subjects
from tests.ledger.conftest import plain


@pytest.fixture
async def replica(ledger_db: str) -> AsyncIterator[Database]:
    """Another ledger's pool on the same database (its own cache, as a second process has)."""
    db = Database(ledger_db, pool_size=2)
    await db.open()
    try:
        yield db
    finally:
        await db.close()


async def fresh(ledger_db: str, run_id: str, **paging: Any) -> bytes:
    """The page as a render gives it now (a pool of its own, so nothing kept is served)."""
    db = Database(ledger_db, pool_size=1)
    await db.open()
    try:
        return await console.console(db, run_id, **paging)
    finally:
        await db.close()


async def page(db: Database, run_id: str, **paging: Any) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(await console.console(db, run_id, **paging))
    return result


async def test_a_page_read_again_unchanged_is_served_from_the_cache_byte_for_byte(ledger, replica, ledger_db,
                                                                                   unique):
    run = f"r{unique}"
    await ledger.run(run, "running")
    for n in range(5):
        await ledger.record(run, f"c{n}")
    first = await console.console(replica, run)
    again = await console.console(replica, run)
    cache = cache_of(replica)
    assert (cache.misses, cache.hits, cache.stale) == (1, 1, 0)
    assert again is first  # the very bytes kept, not a render
    assert again == await fresh(ledger_db, run)
    # Each page is its own: another limit or another after is rendered and kept apart.
    two = await page(replica, run, limit=2)
    assert [r["ref"] for r in two["resources"]] == ["c0", "c1"] and two["next"] is not None
    rest = await page(replica, run, after=two["next"], limit=2)
    assert [r["ref"] for r in rest["resources"]] == ["c2", "c3"]
    assert await page(replica, run, limit=2) == two and cache.hits == 2 and len(cache) == 3


async def test_a_change_through_the_ledgers_subjects_is_on_the_next_page_never_the_kept_one(ledger, replica, unique):
    run = f"r{unique}"
    await ledger.run(run)

    async def pages() -> list[dict[str, Any]]:
        """The page from the serving ledger's cache and from another ledger's, each read twice
        (the second read of each from a kept page): all four alike."""
        read = [await ledger.console(run), await page(replica, run), await ledger.console(run),
                await page(replica, run)]
        assert all(p == read[0] for p in read)
        return read

    assert (await pages())[0]["run"]["status"] == "scheduled"
    await ledger.ask(subjects.LEDGER_RUN_STATUS, runId=run, status="running")
    assert (await pages())[0]["run"]["status"] == "running"
    await ledger.record(run, "c1")
    await ledger.record(run, "c2", reserve=True)
    now = (await pages())[0]
    assert [(r["ref"], r["status"]) for r in now["resources"]] == [("c1", "confirmed"), ("c2", "pending")]
    assert now["unresolved"] == 2
    await ledger.ask(subjects.ledger_expired("world"), kind="creature", ref="c1")
    now = (await pages())[0]
    assert [(r["ref"], r["status"]) for r in now["resources"]] == [("c1", "expired"), ("c2", "pending")]
    assert now["counts"]["expired"] == 1 and now["unresolved"] == 1
    cache = cache_of(replica)
    assert cache.stale == 3 and cache.hits == 4  # each change found by the check of the kept page


async def test_a_change_by_another_replica_is_seen_by_this_one(ledger, replica, db, ledger_db, unique):
    # ``replica`` keeps the page; the in-process ledger (another replica on the same database)
    # and a plain connection change the run; replica's next page is the new one.
    run = f"r{unique}"
    await ledger.run(run, "running")
    made = (await ledger.record(run, "c1"))["resource"]["resourceId"]
    await page(replica, run)
    await page(replica, run)
    await ledger.record(run, "c2")
    assert [r["ref"] for r in (await page(replica, run))["resources"]] == ["c1", "c2"]
    await db.execute("UPDATE resources SET attempts = 7 WHERE id = $1", made)  # no updated_at, no log entry
    after = await page(replica, run)
    assert after["resources"][0]["attempts"] == 7
    await db.execute("UPDATE runs SET event = 'siege' WHERE run_id = $1", run)
    assert (await page(replica, run))["run"]["event"] == "siege"
    await db.execute("DELETE FROM resources WHERE id = $1", made)
    assert [r["ref"] for r in (await page(replica, run))["resources"]] == ["c2"]
    assert await console.console(replica, run) == await fresh(ledger_db, run)


async def test_a_change_that_began_before_the_page_was_rendered_and_committed_after_it_is_seen(
        ledger, replica, ledger_db, db, unique):
    # The case a writer's own values miss: T1 begins and changes row a; T2 changes row b and
    # commits; the page is rendered (it sees b's change, not a's); then T1 commits with an
    # updated_at (its now()) older than T2's and a run-log id older than T2's. The run's
    # max(updated_at) is unchanged by T1's commit: a cache keyed on it would serve the old page.
    run = f"r{unique}"
    await ledger.run(run, "running")
    a = (await ledger.record(run, "a"))["resource"]["resourceId"]
    b = (await ledger.record(run, "b"))["resource"]["resourceId"]
    t1 = await asyncpg.connect(plain(ledger_db))
    try:
        writer = t1.transaction()
        await writer.start()
        await t1.execute("UPDATE resources SET attempts = 1, updated_at = now() WHERE id = $1", a)
        await asyncio.sleep(0.01)  # T2's now() after T1's
        await db.execute("UPDATE resources SET attempts = 2, updated_at = now() WHERE id = $1", b)
        before = await page(replica, run)
        assert [r["attempts"] for r in before["resources"]] == [0, 2]
        newest = await db.fetchval("SELECT max(updated_at) FROM resources WHERE run_id = $1", run)
        await writer.commit()
    finally:
        await t1.close()
    assert await db.fetchval("SELECT max(updated_at) FROM resources WHERE run_id = $1", run) == newest
    assert [r["attempts"] for r in (await page(replica, run))["resources"]] == [1, 2]


async def test_a_lease_deadline_passing_changes_the_page_with_no_write(ledger, replica, db, unique):
    run = f"r{unique}"
    await ledger.run(run, "running")
    now_ms = "SELECT (extract(epoch FROM now()) * 1000)::bigint"
    deadline = await db.fetchval(now_ms) + 1500
    await ledger.record(run, "lease", kind="lease", leaseDeadline=deadline)
    await ledger.record(run, "later", kind="lease", leaseDeadline=deadline + 3_600_000)
    held = await page(replica, run)
    assert [r["leaseDeadlinePassed"] for r in held["resources"]] == [False, False] and held["leasesOverdue"] == 0
    assert await page(replica, run) == held and cache_of(replica).hits == 1
    while await db.fetchval(now_ms) <= deadline:
        await asyncio.sleep(0.1)
    passed = await page(replica, run)
    assert [r["leaseDeadlinePassed"] for r in passed["resources"]] == [True, False]
    assert passed["leasesOverdue"] == 1
    assert await page(replica, run) == passed and cache_of(replica).hits == 2  # kept again until "later" passes


async def test_a_run_gone_after_its_page_was_kept_is_not_found(ledger, replica, db, unique):
    run = f"r{unique}"
    await ledger.run(run)
    await page(replica, run)
    await db.execute("DELETE FROM run_log WHERE run_id = $1", run)
    await db.execute("DELETE FROM runs WHERE run_id = $1", run)
    with pytest.raises(NotFound):
        await console.console(replica, run)
    assert len(cache_of(replica)) == 0


async def test_the_cache_holds_at_most_its_capacity_least_recently_used_out_first(ledger, replica, ledger_db,
                                                                                  unique):
    runs = [f"r{unique}-{n}" for n in range(6)]
    for run in runs:
        await ledger.run(run, "running")
        assert (await ledger.record(run, f"{run}-c1"))["status"] == 200
    size = max([len(await fresh(ledger_db, run)) for run in runs]) + ENTRY_OVERHEAD
    cache = cache_of(replica)
    cache.capacity = 2 * size + size // 2  # two pages and a half
    for run in runs:
        assert (await page(replica, run))["run"]["runId"] == run  # a hostile caller: one run after another
        assert cache.bytes <= cache.capacity and len(cache) <= 2
    assert cache.evicted == 4
    await page(replica, runs[4])  # kept: now the most recently used
    await page(replica, runs[0])  # evicted: rendered again, evicting runs[5], not runs[4]
    assert cache.hits == 1 and len(cache) == 2
    await page(replica, runs[4])
    assert cache.hits == 2 and cache.bytes <= cache.capacity


def test_a_page_larger_than_the_capacity_is_not_kept_and_the_bytes_add_up():
    mark = Mark(1, 0, Decimal(0), None, None)
    cache = ConsoleCache(capacity=3000)
    cache.put(("a", 0, 10, 100), Page(b"x" * 100, mark))
    cache.put(("a", 0, 10, 100), Page(b"y" * 200, mark))  # replaces, not adds
    assert len(cache) == 1 and cache.bytes == 200 + ENTRY_OVERHEAD
    cache.put(("b", 0, 10, 100), Page(b"z" * 4000, mark))
    assert len(cache) == 1 and cache.get(("b", 0, 10, 100)) is None
    cache.put(("c", 0, 10, 100), Page(b"w" * 2000, mark))  # evicts "a"
    assert cache.get(("a", 0, 10, 100)) is None and cache.bytes == 2000 + ENTRY_OVERHEAD
    cache.drop(("c", 0, 10, 100))
    assert cache.bytes == 0 and len(cache) == 0


def test_a_kept_page_stands_only_between_its_lease_times_and_with_its_marks():
    mark = Mark(5, 2, Decimal(9), 1000, 2000)
    now = {"run_mark": 5, "rows_count": 2, "rows_mark": Decimal(9), "now_ms": 1500}
    assert mark.current(now)
    assert mark.current({**now, "now_ms": 2000}) and not mark.current({**now, "now_ms": 2001})
    assert not mark.current({**now, "now_ms": 1000})  # a clock gone back past a passed deadline
    assert not mark.current({**now, "run_mark": None}) and not mark.current({**now, "run_mark": 6})
    assert not mark.current({**now, "rows_count": 3}) and not mark.current({**now, "rows_mark": Decimal(8)})


@pytest.mark.parametrize("body", [b"{}", b'{"runId": 5}', b'{"runId": "x", "limit": 0}', b'{"runId": "x", "after": -1}',
                                  b'{"runId": "x", "limit": 1001}', b"not json",
                                  b"[" * 100_000, b'{"runId": "x", "after": 9223372036854775808}'])
async def test_bad_requests_still_get_their_400_with_pages_kept(ledger, unique, body):
    run = f"r{unique}"
    await ledger.run(run)
    await ledger.console(run)
    await ledger.console(run)
    reply = await ledger.raw(subjects.LEDGER_CONSOLE, body)
    assert reply["status"] == 400, reply
    assert (await ledger.console(run))["run"]["runId"] == run
