"""The ledger checker finds what it is for (docs/reliability.md, "The ledger cut from
PostgreSQL"): a clean history passes, and each kind of broken promise is named. Pure, no hosts."""

from __future__ import annotations

from collections import Counter
from typing import Any

from tests.hosts import ledger_checker as checker


def history() -> dict[str, Any]:
    """One run with a creature and a lease, recorded, given back, every change with its event."""
    log = [{"id": 1, "run_id": "r", "resource_id": None, "kind": "run.created"},
           {"id": 2, "run_id": "r", "resource_id": 10, "kind": "resource.recorded"},
           {"id": 3, "run_id": "r", "resource_id": 11, "kind": "resource.recorded"},
           {"id": 4, "run_id": "r", "resource_id": 10, "kind": "cleanup.claimed"},
           {"id": 5, "run_id": "r", "resource_id": 10, "kind": "cleanup.reverted"},
           {"id": 6, "run_id": "r", "resource_id": 11, "kind": "cleanup.claimed"},
           {"id": 7, "run_id": "r", "resource_id": 11, "kind": "cleanup.reverted"}]
    return {
        "attempts": [checker.Attempt("ledger.run.create", "a", 503, 0.0, 6.0, True),
                     checker.Attempt("ledger.run.create", "a", 200, 6.2, 0.1, False)],
        "recorded": {"s1": ("r", "creature"), "K@t": ("r", "lease")},
        "despawned": Counter({"s1": 1}), "released": Counter({"K@t": 1}),
        "consoles": {"r": {"run": {"cleanupStatus": "complete"}, "counts": {"reverting": 0}, "unresolved": 0}},
        "log": log,
        "events": [{"eventId": e["id"], "type": e["kind"]} for e in log],
    }


def verdict_of(h: dict[str, Any]) -> checker.LedgerVerdict:
    verdict = checker.LedgerVerdict()
    checker.check_requests(verdict, h["attempts"], [])
    checker.check_give_backs(verdict, h["recorded"], h["despawned"], h["released"])
    checker.check_runs(verdict, ["r"], h["consoles"], h.get("failed", []))
    checker.check_events(verdict, h["log"], h["events"])
    return verdict


def test_a_clean_history_passes() -> None:
    verdict = verdict_of(history())
    assert verdict.violations == []
    assert (verdict.requests, verdict.attempts, verdict.resources, verdict.given_back) == (1, 2, 2, 2)
    assert verdict.statuses_during_cut == {"503": 1}


def test_each_broken_promise_is_named() -> None:
    h = history()
    h["attempts"].append(checker.Attempt("ledger.resource.record", "b", None, 1.0, 12.0, True))
    h["despawned"]["s1"] += 1
    h["released"] = Counter()
    h["consoles"]["r"]["run"]["cleanupStatus"] = "pending"
    h["events"] = [*h["events"][1:], h["events"][2]]
    h["failed"] = [("r2", "AssertionError('ledger.run.create not answered 2xx: 500')")]
    found = "\n".join(verdict_of(h).violations)
    for what in ("unanswered within their timeout", "given back more than once: 1 (('creature:s1', 2))",
                 "never given back: 1 (lease:K@t)", "runs left pending", "could not walk through: 1 (('r2',",
                 "changes without their event: 1",
                 "changes with more than one event: 1 ((3, 'resource.recorded', 2))"):
        assert what in found, found
