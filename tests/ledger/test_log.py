"""``ledger.log``: a run's log, what happened to it and its rows in order, paged like the
console (``after``/``next``, at most ``limit`` entries and at most a page's bytes)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.ledger.console import DETAIL_INLINE_MAX, PAGE_BYTES
from shared import subjects

NATS_MAX_PAYLOAD = 1024 * 1024


async def _log(ledger, run_id: str, **extra: Any) -> dict[str, Any]:
    return await ledger.ask(subjects.LEDGER_LOG, runId=run_id, **extra)


async def _every_entry(ledger, run_id: str, **extra: Any) -> tuple[list[dict[str, Any]], list[int]]:
    """Every entry, page after page; and each page's size on the wire."""
    entries: list[dict[str, Any]] = []
    sizes: list[int] = []
    after = None
    while True:
        body = {"runId": run_id, **extra, **({"after": after} if after is not None else {})}
        msg = await ledger.nc.request(subjects.LEDGER_LOG, json.dumps(body).encode(), timeout=10)
        page = json.loads(msg.data)
        assert page["status"] == 200, page
        sizes.append(len(msg.data))
        entries += page["entries"]
        if page["next"] is None:
            return entries, sizes
        assert page["next"] == page["entries"][-1]["entryId"]
        after = page["next"]


async def test_the_log_lists_what_happened_in_order_with_each_entrys_detail(ledger, unique):
    run = f"r{unique}"
    await ledger.run(run, "running")
    resource = (await ledger.record(run, "c1"))["resource"]
    await ledger.ask(subjects.ledger_expired("world"), kind="creature", ref="c1")
    await ledger.ask(subjects.LEDGER_RUN_STATUS, runId=run, status="completed")

    page = await _log(ledger, run)

    assert page["status"] == 200 and page["runId"] == run and page["next"] is None
    kinds = [e["kind"] for e in page["entries"]]
    assert kinds == ["run.created", "run.status", "resource.recorded", "resource.expired", "run.status"]
    ids = [e["entryId"] for e in page["entries"]]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    created, running, recorded = page["entries"][:3]
    assert created["detail"] == {"shard": "uo1", "event": "invasion"} and created["resourceId"] is None
    assert running["detail"] == {"status": "running"}
    assert recorded["resourceId"] == resource["resourceId"] and recorded["runId"] == run
    assert recorded["detail"] == {"status": "confirmed", "module": "world", "kind": "creature", "ref": "c1"}
    assert all(isinstance(e["at"], str) for e in page["entries"])


async def test_the_log_pages_by_count_with_after_and_next(ledger, unique):
    run = f"r{unique}"
    await ledger.run(run, "running")
    for n in range(7):
        await ledger.record(run, f"c{n}")
    whole = (await _log(ledger, run))["entries"]
    assert len(whole) == 9

    first = await _log(ledger, run, limit=4)
    assert [e["entryId"] for e in first["entries"]] == [e["entryId"] for e in whole[:4]]
    assert first["next"] == whole[3]["entryId"]
    paged, _sizes = await _every_entry(ledger, run, limit=4)
    assert paged == whole
    last = await _log(ledger, run, after=whole[-1]["entryId"])
    assert last["entries"] == [] and last["next"] is None


async def test_a_run_with_no_entries_after_the_cursor_is_an_empty_page_not_missing(ledger, unique):
    await ledger.run(f"r{unique}")
    page = await _log(ledger, f"r{unique}", after=2**63 - 1)
    assert page == {"status": 200, "runId": f"r{unique}", "next": None, "entries": []}


async def test_a_log_of_megabytes_pages_out_under_the_payload_limit(ledger, db, unique):
    # Sweep summaries of up to 64 KiB each, and two entries as a ledger before the caps could
    # have written them (1 MB and 2 MB of detail): every page fits a NATS message, every entry
    # comes out, the old giants with their detail left out and sized.
    run = f"r{unique}"
    await ledger.run(run, "cancelled")
    summary = {"failures": [{"reason": "r" * 390} for _ in range(150)]}  # about 60 KiB
    for _ in range(20):
        reply = await ledger.ask(subjects.LEDGER_SWEEP_FINISH, runId=run, summary=summary)
        assert reply["status"] == 200, reply
    for size in (1_000_000, 2_000_000):
        await db.execute("INSERT INTO run_log (run_id, kind, detail) VALUES ($1, 'cleanup.swept', $2::jsonb)",
                         run, json.dumps({"blob": "x" * size}))

    entries, sizes = await _every_entry(ledger, run)

    assert len(entries) == 3 + 20 + 2 and len(sizes) > 1
    assert max(sizes) < NATS_MAX_PAYLOAD and max(sizes) <= PAGE_BYTES + 4096
    swept = [e for e in entries if e["kind"] == "cleanup.swept"]
    assert all(e["detail"]["failures"] == summary["failures"] for e in swept[:20])
    giants = swept[20:]
    assert [e["detail"] for e in giants] == [None, None]
    assert [e["detailOmitted"] > DETAIL_INLINE_MAX for e in giants] == [True, True]
    assert "detailOmitted" not in swept[0]


async def test_the_log_of_an_unknown_run_is_not_found(ledger, unique):
    reply = await _log(ledger, f"nope{unique}")
    assert reply["status"] == 404 and f"nope{unique}" in reply["error"]


@pytest.mark.parametrize(("body", "field"), [
    ({}, "runId"),
    ({"runId": "a.b"}, "runId"),
    ({"runId": "x" * 65}, "runId"),
    ({"runId": "r", "limit": 0}, "limit"),
    ({"runId": "r", "limit": 1001}, "limit"),
    ({"runId": "r", "limit": "5"}, "limit"),
    ({"runId": "r", "after": -1}, "after"),
    ({"runId": "r", "after": 2**63}, "after"),
    ({"runId": "r", "after": 1.5}, "after"),
])
async def test_a_bad_log_request_is_a_400_naming_the_field(ledger, body, field):
    reply = await ledger.ask(subjects.LEDGER_LOG, **body)
    assert reply["status"] == 400 and field in reply["error"], reply


@pytest.mark.parametrize("payload", [b"[]", b'"r"', b"not json", b"[" * 100_000])
async def test_a_log_request_that_is_not_an_object_is_a_400(ledger, payload):
    reply = await ledger.raw(subjects.LEDGER_LOG, payload)
    assert reply["status"] == 400
