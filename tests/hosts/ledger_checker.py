"""The checker over a ledger hosts run's whole history (docs/reliability.md, "The ledger cut from
PostgreSQL"): what the website asked and was answered, what the shard's world gave back, the
runs' consoles, the run log read from PostgreSQL and the ``LEDGER_EVENTS`` stream read through
its leader. Pure: the test gathers these and hands them in.

The promises it holds them to:

- every ledger request is answered within its attempt's timeout, with a status the docs name for
  it (docs/ledger.md; a 503 while the database is unreachable, docs/reliability.md, "PostgreSQL"),
  and every request is in the end answered 2xx (retried with the same payload after a 503);
- every resource recorded is given back exactly once: each creature's serial despawned once and
  each lease released once by the shard's world (a replay from the shard's idempotency cache
  never reaches the world), nothing given back that was not recorded;
- no run is left with its cleanup anything but ``complete``, no row ``reverting``;
- each committed change (a run-log entry carrying an event, docs/ledger.md, "Update events") has
  exactly one event in ``LEDGER_EVENTS``, of its kind, and no event exists without its change;
- which change makes which event, as the reference model of tests/model counts them
  (``Row.log``): each resource has exactly one ``resource.recorded`` and ends with exactly one
  ``cleanup.reverted``; each run exactly one ``run.created``."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

DOCUMENTED = frozenset({200, 201, 503})
"""The statuses the docs give the requests this workload sends: 200/201 applied or replayed,
503 the database unreachable (or the ledger busy), retry shortly. A 500 is documented too, but
as a bug (docs/reliability.md, "PostgreSQL": "Any other database error … is a bug")."""


@dataclass
class Attempt:
    """One attempt of one ledger request, as the website saw it."""

    subject: str
    key: str
    """What makes retries of one request one request: its subject and payload."""
    status: int | None
    """The reply's status; None: no answer within the attempt's timeout."""
    started: float
    elapsed: float
    during_cut: bool


@dataclass
class LedgerVerdict:
    violations: list[str] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    statuses_during_cut: Counter[str] = field(default_factory=Counter)
    requests: int = 0
    attempts: int = 0
    slowest_s: float = 0.0
    runs: int = 0
    resources: int = 0
    given_back: int = 0
    changes: int = 0
    events: int = 0

    def add(self, what: str, records: list[Any]) -> None:
        if records:
            shown = "; ".join(str(r) for r in records[:5]) + (" …" if len(records) > 5 else "")
            self.violations.append(f"{what}: {len(records)} ({shown})")

    def summary(self) -> str:
        return (f"{self.runs} runs, {self.resources} resources, {self.given_back} given back; "
                f"{self.requests} ledger requests in {self.attempts} attempts, statuses {dict(self.statuses)}, "
                f"during the cut {dict(self.statuses_during_cut)}, slowest answer {self.slowest_s:.1f} s; "
                f"{self.changes} changes, {self.events} events; {len(self.violations)} violations")


def check_requests(verdict: LedgerVerdict, attempts: list[Attempt], unfinished: list[str]) -> None:
    """Every attempt answered with a documented status; every request in the end answered 2xx
    (``unfinished``: the keys of requests still unanswered when the website gave up)."""
    keys: dict[str, list[Attempt]] = {}
    for attempt in attempts:
        keys.setdefault(attempt.key, []).append(attempt)
        label = "no answer" if attempt.status is None else str(attempt.status)
        verdict.statuses[label] += 1
        if attempt.during_cut:
            verdict.statuses_during_cut[label] += 1
        if attempt.status is not None:
            verdict.slowest_s = max(verdict.slowest_s, attempt.elapsed)
    verdict.requests, verdict.attempts = len(keys), len(attempts)
    verdict.add("attempts unanswered within their timeout (a request left hanging)",
                [(a.subject, round(a.elapsed, 1), "during the cut" if a.during_cut else "")
                 for a in attempts if a.status is None])
    verdict.add("attempts answered with a status the docs do not give them",
                [(a.subject, a.status) for a in attempts if a.status is not None and a.status not in DOCUMENTED])
    verdict.add("requests never answered 2xx", unfinished)


def check_give_backs(verdict: LedgerVerdict, recorded: dict[str, tuple[str, str]],
                     despawned: Counter[str], released: Counter[str]) -> None:
    """``recorded``: ref → (run, kind) of every resource the website recorded; ``despawned``: the
    world's despawns by serial; ``released``: the world's lease releases by target."""
    verdict.resources = len(recorded)
    given = Counter({f"{kind}:{ref}": 0 for ref, (_run, kind) in recorded.items()})
    for serial, count in despawned.items():
        given[f"creature:{serial}"] += count
    for target, count in released.items():
        given[f"lease:{target}"] += count
    verdict.given_back = sum(1 for n in given.values() if n == 1)
    verdict.add("resources never given back", sorted(k for k, n in given.items() if n == 0))
    verdict.add("resources given back more than once", sorted((k, n) for k, n in given.items() if n > 1))
    known = {f"{kind}:{ref}" for ref, (_run, kind) in recorded.items()}
    verdict.add("given back but never recorded", sorted(k for k in given if k not in known))


def check_runs(verdict: LedgerVerdict, runs: list[str], consoles: dict[str, dict[str, Any]],
               failed: list[tuple[str, str]]) -> None:
    """Every run's console: cleanup ``complete``, nothing ``reverting``, nothing unresolved;
    ``failed``: the runs the website could not walk through, with why (each a violation)."""
    verdict.runs = len(runs)
    verdict.add("runs the website could not walk through", failed)
    verdict.add("runs not found", [run for run in runs if run not in consoles])
    left = []
    for run in runs:
        console = consoles.get(run)
        if console is None:
            continue
        counts = console.get("counts") or {}
        if (console["run"]["cleanupStatus"] != "complete" or counts.get("reverting", 0)
                or console.get("unresolved", 0)):
            left.append((run, console["run"]["cleanupStatus"], counts))
    verdict.add("runs left pending, incomplete or reverting after the heal", left)


def check_events(verdict: LedgerVerdict, log: list[dict[str, Any]], events: list[dict[str, Any]]) -> None:
    """``log``: every run-log entry carrying an event (``id``, ``kind``, ``run_id``,
    ``resource_id``); ``events``: every message of ``LEDGER_EVENTS`` decoded (``eventId``,
    ``type``, ``run``, ``resource``)."""
    verdict.changes, verdict.events = len(log), len(events)
    published = Counter(int(e["eventId"]) for e in events)
    by_id = {int(e["eventId"]): e for e in events}
    verdict.add("committed changes without their event", [(e["id"], e["kind"], e["run_id"]) for e in log
                                                          if published[int(e["id"])] == 0])
    verdict.add("committed changes with more than one event",
                [(e["id"], e["kind"], published[int(e["id"])]) for e in log if published[int(e["id"])] > 1])
    changes = {int(e["id"]): e for e in log}
    verdict.add("events without a committed change", sorted(i for i in published if i not in changes))
    verdict.add("events of another kind than their change",
                [(i, changes[i]["kind"], by_id[i].get("type")) for i in changes
                 if i in by_id and by_id[i].get("type") != changes[i]["kind"]])
    # Which change makes which event (tests/model/reference.py's Row.log): per resource and run.
    per_resource: dict[int, list[str]] = {}
    per_run: dict[str, list[str]] = {}
    for entry in sorted(log, key=lambda e: int(e["id"])):
        if entry.get("resource_id") is not None:
            per_resource.setdefault(int(entry["resource_id"]), []).append(entry["kind"])
        else:
            per_run.setdefault(entry["run_id"], []).append(entry["kind"])
    verdict.add("resources without exactly one resource.recorded",
                [(rid, kinds) for rid, kinds in per_resource.items() if kinds.count("resource.recorded") != 1])
    verdict.add("resources not ending with exactly one cleanup.reverted",
                [(rid, kinds[-3:]) for rid, kinds in per_resource.items()
                 if kinds.count("cleanup.reverted") != 1 or kinds[-1] != "cleanup.reverted"])
    verdict.add("runs without exactly one run.created",
                [(run, kinds) for run, kinds in per_run.items() if kinds.count("run.created") != 1])
