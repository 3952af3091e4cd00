"""The periodic sweep: a sweep the ledger could not serve (it was not up yet, or away) is
tried again within seconds, backing off, instead of a whole period later."""

from __future__ import annotations

import asyncio
import json

from shared import subjects
from tests.cleanup.conftest import Ledger, ok, start_cleanup, wait_for


async def test_a_cleanup_started_before_the_ledger_sweeps_once_the_ledger_is_up(nc, services, database_url,
                                                                                unique):
    first = await asyncio.to_thread(services.start, "ledger", database_url=database_url)
    await Ledger(nc, first).run(f"r{unique}", "uo1", status="completed")  # holds nothing: settles
    services.stop(first)

    cleanup = await start_cleanup(services, sweep_period_s="3600")  # its first sweep finds no ledger
    await asyncio.sleep(0.5)
    await asyncio.to_thread(services.start, "ledger", database_url=database_url)

    async def settled() -> bool:
        reply = await ok(nc, subjects.LEDGER_RUNS, {"cleanupStatus": "complete"})
        return f"r{unique}" in {run["runId"] for run in reply["runs"]}

    await wait_for(settled, "the run settled by a periodic sweep, well before the hour's period", timeout=20,
                   every=0.2)
    # A cleanup that starts before the ledger is the ordinary start-up, not a warning.
    lines = [json.loads(line) for line in cleanup.log().splitlines() if line.startswith("{")]
    assert [e["msg"] for e in lines if e["level"] == "warning"] == []
    assert "waiting for the ledger before the first sweep" in [e["msg"] for e in lines if e["level"] == "info"]
