"""Two sweeps finishing one run at once (two cleanup replicas): the one that comes second must
answer, log and publish the run as the first one left it — not as it read it before the first
committed. Found by the model test (tests/model): the second finish answered ``pending`` for a
run whose cleanup the first had just made ``complete``, and its update event said so too."""

from __future__ import annotations

import asyncio
import json

from shared import subjects

ROUNDS = 15
AT_ONCE = 4


async def test_racing_finishes_of_an_empty_run_all_answer_complete(ledger, db, unique):
    stale = []
    for i in range(ROUNDS):
        run_id = f"{unique}-{i}"
        await ledger.run(run_id, "completed")
        replies = await asyncio.gather(*(ledger.ask(subjects.LEDGER_SWEEP_FINISH, runId=run_id, maxAttempts=3,
                                                    summary={}) for _ in range(AT_ONCE)))
        assert all(r["status"] == 200 for r in replies), replies
        stale += [(run_id, "reply") for r in replies if r["run"]["cleanupStatus"] != "complete"]
        logged = await db.fetch("SELECT detail FROM run_log WHERE run_id = $1 AND kind = 'cleanup.swept'", run_id)
        stale += [(run_id, "log") for row in logged if json.loads(row["detail"])["cleanupStatus"] != "complete"]
    assert not stale, f"finishes that reported the run as it was before another finish: {stale}"
