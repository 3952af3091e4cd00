"""Runs carry an optional schedule (``startsAt``/``endsAt``, ms) and ``ledger.runs`` lists
them by time window, so a website's calendar shows each scheduled run with its ``runId``;
and ``ledger.runs`` pages through any number of runs with a cursor."""

from __future__ import annotations

import pytest

from shared import subjects

HOUR = 3_600_000
T0 = 1_800_000_000_000  # 2027-01-15, ms


async def _create(ledger, run_id: str, starts: int | None, ends: int | None = None, shard: str = "uo1") -> dict:
    body = {"runId": run_id, "shard": shard, "event": "invasion"}
    if starts is not None:
        body["startsAt"] = starts
    if ends is not None:
        body["endsAt"] = ends
    reply = await ledger.ask(subjects.LEDGER_RUN_CREATE, **body)
    assert reply["status"] == 200, reply
    return reply["run"]


async def test_a_run_keeps_its_schedule_and_every_reply_and_event_carries_it(ledger, unique):
    run = await _create(ledger, f"r{unique}", T0, T0 + HOUR)
    assert (run["startsAt"], run["endsAt"]) == (T0, T0 + HOUR)
    console = await ledger.console(f"r{unique}")
    assert (console["run"]["startsAt"], console["run"]["endsAt"]) == (T0, T0 + HOUR)
    unscheduled = await _create(ledger, f"u{unique}", None)
    assert (unscheduled["startsAt"], unscheduled["endsAt"]) == (None, None)


async def test_the_calendar_lists_the_runs_whose_schedule_meets_the_window_in_time_order(ledger, unique):
    await _create(ledger, f"late{unique}", T0 + 5 * HOUR)
    await _create(ledger, f"early{unique}", T0 + HOUR, T0 + 2 * HOUR)
    await _create(ledger, f"before{unique}", T0 - 3 * HOUR, T0 - 2 * HOUR)   # over before the window
    await _create(ledger, f"spans{unique}", T0 - HOUR, T0 + HOUR)            # began before, still on
    await _create(ledger, f"after{unique}", T0 + 10 * HOUR)                   # after the window
    await _create(ledger, f"none{unique}", None)                              # no schedule: no calendar
    reply = await ledger.ask(subjects.LEDGER_RUNS, startsFrom=T0, startsBefore=T0 + 6 * HOUR)
    assert reply["status"] == 200
    assert [r["runId"] for r in reply["runs"]] == [f"spans{unique}", f"early{unique}", f"late{unique}"]
    open_ended = await ledger.ask(subjects.LEDGER_RUNS, startsFrom=T0 + 4 * HOUR)
    assert [r["runId"] for r in open_ended["runs"]] == [f"late{unique}", f"after{unique}"]


async def test_runs_filter_by_shard(ledger, unique):
    await _create(ledger, f"a{unique}", None, shard="uo1")
    await _create(ledger, f"b{unique}", None, shard="uo2")
    reply = await ledger.ask(subjects.LEDGER_RUNS, shard="uo2")
    assert [r["runId"] for r in reply["runs"]] == [f"b{unique}"]


@pytest.mark.parametrize("window", [False, True], ids=["newest-first", "by-schedule"])
async def test_pages_follow_each_other_with_the_cursor_and_hold_every_run_once(ledger, unique, window):
    ids = [f"p{n:02d}{unique}" for n in range(23)]
    for n, run_id in enumerate(ids):
        await _create(ledger, run_id, T0 + (n // 2) * HOUR)  # pairs share a start: the id breaks the tie
    body = {"startsFrom": T0} if window else {}
    seen, after = [], None
    for _ in range(10):
        reply = await ledger.ask(subjects.LEDGER_RUNS, limit=5, **body, **({"after": after} if after else {}))
        assert reply["status"] == 200 and len(reply["runs"]) <= 5
        seen += [r["runId"] for r in reply["runs"]]
        after = reply["next"]
        assert reply["more"] is (after is not None)
        if after is None:
            break
    assert sorted(seen) == sorted(ids) and len(seen) == len(set(seen))
    if window:
        assert seen == ids  # startsAt, then runId
    else:
        assert seen == sorted(ids, key=lambda i: -ids.index(i))  # newest first


# (name, request, field named in the 400)
BAD = [
    ("ends-before-start", (subjects.LEDGER_RUN_CREATE, {"shard": "uo1", "event": "x", "startsAt": 5, "endsAt": 4}),
     "endsAt"),
    ("negative-start", (subjects.LEDGER_RUN_CREATE, {"shard": "uo1", "event": "x", "startsAt": -1}), "startsAt"),
    ("start-beyond-9999", (subjects.LEDGER_RUN_CREATE, {"shard": "uo1", "event": "x", "startsAt": 10**15}),
     "startsAt"),
    ("start-as-text", (subjects.LEDGER_RUN_CREATE, {"shard": "uo1", "event": "x", "startsAt": "soon"}), "startsAt"),
    ("empty-window", (subjects.LEDGER_RUNS, {"startsFrom": 10, "startsBefore": 10}), "startsBefore"),
    ("forged-cursor", (subjects.LEDGER_RUNS, {"after": "1; DROP TABLE runs"}), "after"),
    ("cursor-with-a-subject", (subjects.LEDGER_RUNS, {"after": "12:a.b"}), "after"),
    ("cursor-past-bigint", (subjects.LEDGER_RUNS, {"after": "9999999999999999999:r1"}), "after"),
    ("bad-shard", (subjects.LEDGER_RUNS, {"shard": "UO 1"}), "shard"),
]


@pytest.mark.parametrize("name,request_,field", BAD, ids=[b[0] for b in BAD])
async def test_a_bad_schedule_or_window_is_a_400_naming_it(ledger, db, name, request_, field):
    subject, body = request_
    reply = await ledger.ask(subject, **body)
    assert reply["status"] == 400 and field in reply["error"], reply
    assert await db.fetchval("SELECT count(*) FROM runs") == 0


async def test_a_repeated_create_with_another_schedule_is_a_conflict(ledger, unique):
    await _create(ledger, f"r{unique}", T0, T0 + HOUR)
    assert (await _create(ledger, f"r{unique}", T0, T0 + HOUR))["startsAt"] == T0  # the same: a replay
    reply = await ledger.ask(subjects.LEDGER_RUN_CREATE, runId=f"r{unique}", shard="uo1", event="invasion",
                             startsAt=T0 + HOUR)
    assert reply["status"] == 409 and "scheduled" in reply["error"]
