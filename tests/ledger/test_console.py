"""Reads (the run console, runs by status, a module's live rows, the modules owning live rows)
and the update events a website subscribes to instead of polling."""

from __future__ import annotations

import json

import pytest

from shared import subjects
from tests.ledger.conftest import next_message


async def test_the_console_shows_the_run_its_rows_counts_and_unresolved_with_pending_placeholders(ledger, unique):
    run = f"r{unique}"
    await ledger.run(run, "running")
    await ledger.record(run, "c1")
    await ledger.record(run, "c2", reserve=True)
    await ledger.record(run, "c3")
    await ledger.ask(subjects.ledger_expired("world"), kind="creature", ref="c3")
    console = await ledger.console(run)
    assert console["status"] == 200 and console["run"]["runId"] == run
    assert [r["ref"] for r in console["resources"]] == ["c1", "c2", "c3"]
    assert console["counts"] == {"pending": 1, "confirmed": 1, "reverting": 0, "reverted": 0,
                                 "orphaned": 0, "drifted": 0, "expired": 1}
    assert console["unresolved"] == 2


async def test_the_console_of_a_run_with_no_rows_is_empty_not_missing(ledger, unique):
    await ledger.run(f"r{unique}")
    console = await ledger.console(f"r{unique}")
    assert console["resources"] == [] and console["unresolved"] == 0


async def test_the_console_of_an_unknown_run_is_not_found(ledger, unique):
    reply = await ledger.console(f"nope{unique}")
    assert reply["status"] == 404 and f"nope{unique}" in reply["error"]


async def test_runs_are_listed_by_status_and_cleanup_status(ledger, unique):
    await ledger.run(f"a{unique}", "running")
    await ledger.run(f"b{unique}", "completed")
    await ledger.run(f"c{unique}", "completed")
    await ledger.ask(subjects.LEDGER_SWEEP_SETTLE)
    await ledger.run(f"d{unique}", "completed")
    running = await ledger.ask(subjects.LEDGER_RUNS, status="running")
    assert [r["runId"] for r in running["runs"]] == [f"a{unique}"]
    pending = await ledger.ask(subjects.LEDGER_RUNS, status="completed", cleanupStatus="pending")
    assert [r["runId"] for r in pending["runs"]] == [f"d{unique}"]
    assert len((await ledger.ask(subjects.LEDGER_RUNS, limit=2))["runs"]) == 2


async def test_live_rows_are_the_modules_pending_and_confirmed_rows(ledger, unique):
    run = f"r{unique}"
    await ledger.run(run, "running")
    await ledger.record(run, "c1", module="lease")
    await ledger.record(run, "c2", module="lease", reserve=True)
    await ledger.record(run, "c3", module="lease")
    await ledger.record(run, "c4", module="world")
    await ledger.ask(subjects.ledger_expired("lease"), kind="creature", ref="c3")
    live = await ledger.ask(subjects.LEDGER_LIVE, module="lease")
    assert [(r["ref"], r["status"]) for r in live["resources"]] == [("c1", "confirmed"), ("c2", "pending")]


async def test_the_modules_with_live_rows_are_those_owning_a_pending_or_confirmed_row(ledger, unique):
    assert await ledger.ask(subjects.LEDGER_LIVE_MODULES) == {"status": 200, "modules": []}
    live, ended = f"live{unique}", f"ended{unique}"
    await ledger.run(live, "running")
    await ledger.run(ended, "running")
    await ledger.record(live, "c1", module="siege")                  # confirmed
    await ledger.record(live, "c2", module="arena", reserve=True)    # a pending placeholder
    await ledger.record(live, "c3", module="arena")
    await ledger.record(ended, "z1", module="zones", kind="zone")     # expired below: resolved
    await ledger.record(ended, "c9", module="faded")                 # orphaned below: not live
    await ledger.ask(subjects.ledger_expired("zones"), kind="zone", ref="z1")
    assert (await ledger.ask(subjects.ledger_reconcile("faded"), runId=ended, present=[]))["orphaned"] == 1

    reply = await ledger.ask(subjects.LEDGER_LIVE_MODULES)

    assert reply == {"status": 200, "modules": ["arena", "siege"]}  # each once, by name
    assert (await ledger.ask(subjects.LEDGER_LIVE_MODULES, limit=1))["modules"] == ["arena"]
    bad = await ledger.ask(subjects.LEDGER_LIVE_MODULES, limit=0)
    assert bad["status"] == 400 and "limit" in bad["error"]


async def test_every_change_is_published_on_the_runs_event_subject_after_commit(ledger, nc, db, unique):
    run = f"r{unique}"
    sub = await nc.subscribe(subjects.ledger_run_events(run))
    await ledger.run(run, "running")
    row = (await ledger.record(run, "c1", reserve=True))["resource"]
    await ledger.ask(subjects.LEDGER_RESOURCE_CONFIRM, resourceId=row["resourceId"])
    await ledger.ask(subjects.ledger_expired("world"), kind="creature", ref="c1")
    events = [json.loads((await next_message(sub)).data) for _ in range(5)]
    assert [e["type"] for e in events] == ["run.created", "run.status", "resource.recorded",
                                           "resource.confirmed", "resource.expired"]
    assert events[-1]["resource"]["status"] == "expired" and events[-1]["run"]["runId"] == run
    # What the event says is what the database holds.
    assert await db.fetchval("SELECT status FROM resources WHERE id = $1", row["resourceId"]) == "expired"
    await sub.unsubscribe()


async def test_a_refused_request_publishes_no_event(ledger, nc, unique):
    run = f"r{unique}"
    sub = await nc.subscribe(subjects.ledger_run_events(run))
    await ledger.run(run, "completed")
    assert [json.loads((await next_message(sub)).data)["type"] for _ in range(3)] == ["run.created", "run.status",
                                                                                       "run.status"]
    assert (await ledger.ask(subjects.LEDGER_RUN_STATUS, runId=run, status="running"))["status"] == 409
    assert (await ledger.record(run, "c1", reserve=True))["status"] == 409
    # Events leave in commit order: the next one is the next accepted change's, nothing between.
    assert (await ledger.record(run, "c2"))["status"] == 200
    event = json.loads((await next_message(sub)).data)
    assert (event["type"], event["resource"]["ref"]) == ("resource.recorded", "c2")
    await sub.unsubscribe()


# (status, the console's word, colour) where the website core seed gives them
# (docs/console.md, "Statuses: words and colours", has the whole table)
SEED_WORDS = [
    ("reverted", "given back", "green"),
    ("orphaned", "gone", "amber"),
    ("drifted", "someone else moved it", "amber"),
    ("expired", "ended by the game on time", "green"),
    ("reverting", None, "amber"),   # the seed colours it, its word is shardbus's
    ("confirmed", "still out there", None),
]


async def test_every_console_row_carries_its_status_word_and_colour_in_the_seeds_words(ledger, db, unique):
    run = f"r{unique}"
    await ledger.run(run, "running")
    ids = {}
    for status, *_ in SEED_WORDS:
        ids[status] = (await ledger.record(run, f"c-{status}"))["resource"]["resourceId"]
        if status != "confirmed":  # the status itself is set directly: this test reads, it does not sweep
            await db.execute("UPDATE resources SET status = $1 WHERE id = $2", status, ids[status])
    rows = {r["status"]: r for r in (await ledger.console(run))["resources"]}
    for status, word, colour in SEED_WORDS:
        if word is not None:
            assert rows[status]["word"] == word, status
        if colour is not None:
            assert rows[status]["colour"] == colour, status
        assert rows[status]["word"] and rows[status]["colour"] in ("green", "amber", "grey", "blue")


async def test_an_expiry_writes_the_seeds_last_error_sentence(ledger, unique):
    # The seed's markExpired(row.id, 'the game ended it at its deadline') (docs/ledger.md, "Expiry").
    run = f"r{unique}"
    await ledger.run(run, "running")
    await ledger.record(run, "c1")
    await ledger.ask(subjects.ledger_expired("world"), kind="creature", ref="c1")
    (row,) = (await ledger.console(run))["resources"]
    assert row["status"] == "expired" and row["lastError"] == "the game ended it at its deadline"
    assert row["word"] == "ended by the game on time" and row["colour"] == "green"


# (run status, colour, the seed's line or None: shardbus's own)
RUN_COLOURS = [("completed", "green", 56), ("running", "blue", None), ("failed", "red", 63),
               ("scheduled", "grey", None), ("missed", "amber", None), ("cancelled", "grey", None)]


@pytest.mark.parametrize("status,colour,line", RUN_COLOURS, ids=[r[0] for r in RUN_COLOURS])
async def test_every_run_in_ledger_runs_carries_its_colour_and_its_cleanups_word(ledger, unique, status, colour, line):
    run = f"r{unique}"
    await ledger.run(run, status)
    (listed,) = [r for r in (await ledger.ask(subjects.LEDGER_RUNS, status=status))["runs"] if r["runId"] == run]
    assert listed["colour"] == colour
    assert (listed["cleanupStatus"], listed["cleanupWord"], listed["cleanupColour"]) == (
        "pending", "cleanup pending", "grey")


async def test_an_incomplete_cleanup_says_it_wants_a_person_in_amber(ledger, db, unique):
    run = f"r{unique}"
    await ledger.run(run, "completed")
    await db.execute("UPDATE runs SET cleanup_status = 'incomplete' WHERE run_id = $1", run)
    listed = (await ledger.ask(subjects.LEDGER_RUNS, cleanupStatus="incomplete"))["runs"][0]
    assert (listed["cleanupWord"], listed["cleanupColour"]) == ("cleanup incomplete: wants a person", "amber")
