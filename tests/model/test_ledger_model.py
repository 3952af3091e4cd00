"""The ledger's whole history against a reference model (issue 29, item 1).

A Hypothesis state machine drives the real ledger — two replica processes over the real
nats-server and PostgreSQL — through its documented subjects only: reserve, record, confirm,
fail, expire, reconcile, run moves, sweep claim, outcomes, finish, retry, settle; replays with
the same idempotency key; several callers racing on one target or one row (asyncio.gather);
and a replica SIGKILLed while requests are in flight (each retried with its same body until
answered, so it must have happened exactly once). Every step's replies must be explained by
some order of its requests in the model (tests/model/reference.py, written from docs/ledger.md);
at the end, the ledger's console and log of every run equal the model's state, and every
committed change has exactly one event on LEDGER_EVENTS.

A short run is part of ``make test``; ``make test-model`` runs it long
(``SHARDBUS_MODEL_EXAMPLES``, ``SHARDBUS_MODEL_STEPS``)."""

from __future__ import annotations

import collections
import os
import time
import uuid
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test

from shared.contracts import ledger_statuses as v
from tests.model.driver import Ledger, Loop, Servers, Step, explain, read_events, read_state
from tests.model.reference import MAX_ATTEMPTS, TERMINAL, UNKNOWN, Model
from tests.processes import ServiceProcesses

EXAMPLES = int(os.environ.get("SHARDBUS_MODEL_EXAMPLES", "5"))
STEPS = int(os.environ.get("SHARDBUS_MODEL_STEPS", "20"))
FAULTS = int(os.environ.get("SHARDBUS_MODEL_FAULTS", "2"))
"""At most this many faults an example (each costs a process start or a restart: seconds)."""
KIND = "creature"
REFS = ("r0", "r1", "r2")
"""Few targets, so that reservations meet live rows and expiries meet several rows."""
FAIL_ERROR = "the shard could not create it"
pick = st.integers(0, 63)


def chosen(items: list[Any], index: int) -> Any:
    return items[index % len(items)]


class LedgerHistory(RuleBasedStateMachine):
    """Preconditions depend only on what the rules chose (the runs made, the faults spent), never
    on what the ledger answered: which of two racing requests won decides whether a row is
    pending or confirmed, so a precondition on that made Hypothesis choose rules from another
    list when it replayed the same choices, and every long run ended in FlakyStrategyDefinition
    within a minute. A rule with nothing to act on returns at once instead."""

    ledger: ClassVar[Ledger]
    record: ClassVar[dict[str, Any]]

    def __init__(self) -> None:
        super().__init__()
        tag = uuid.uuid4().hex[:8]
        self.model = Model(module=f"m{tag}", kind=KIND)
        self.tag = tag
        self.history: list[Step] = []
        self.keys = 0
        self.faults = 0
        self.in_sync = True

    # --- driving ------------------------------------------------------------------------

    def step(self, rule_name: str, requests: list[tuple[str, dict[str, Any]]], during: Any = None) -> Step:
        step = Step(rule_name, requests)
        self.history.append(step)
        self.in_sync = False  # until the step's replies are explained
        try:
            self.ledger.fire(step, self.model.module, during)
        except Exception as failure:
            raise AssertionError(self.story() + f"\n{rule_name} failed: {failure!r}") from failure
        try:
            self.model = explain(self.model, step)
        except AssertionError as failure:
            raise AssertionError(self.story() + "\n" + str(failure)) from None
        self.in_sync = True
        self.record["steps"] += 1
        self.record["replies"].update(f"{op} {reply['status']}" for (op, _), reply in zip(step.requests, step.replies,
                                                                                          strict=True))
        return step

    def story(self) -> str:
        return "history:\n" + "\n".join(line for step in self.history for line in step.lines())

    def new_key(self) -> str:
        self.keys += 1
        return f"{self.tag}-k{self.keys}"

    def runs(self, *, terminal: bool | None = None, cleanup: str | None = None) -> list[str]:
        """The example's run ids, those over (or not) and with that cleanup status when asked."""
        return sorted(r.id for r in self.model.runs.values()
                      if (terminal is None or (r.status in TERMINAL) == terminal)
                      and (cleanup is None or r.cleanup == cleanup))

    def any_run(self, **which: Any) -> bool:
        return bool(self.runs(**which))

    def add_request(self, op: str, run_id: str, ref: str, key: str) -> tuple[str, dict[str, Any]]:
        return op, {"runId": run_id, "module": self.model.module, "kind": KIND, "ref": ref, "idempotencyKey": key,
                    "revert": {"despawn": ref}}

    # --- rules --------------------------------------------------------------------------

    @initialize()
    def two_runs(self) -> None:
        for _ in range(2):
            self.new_run()

    @precondition(lambda self: len(self.model.runs) < 4)
    @rule()
    def new_run(self) -> None:
        run_id = f"{self.tag}-run{len(self.model.runs)}"
        self.step("new run", [("create", {"runId": run_id, "shard": "uo1", "event": "invasion"})])
        self.step("run starts", [("run_status", {"runId": run_id, "status": v.RUNNING})])

    @rule(run=pick, ref=st.sampled_from(REFS), ops=st.lists(st.sampled_from(["reserve", "record"]), min_size=1,
                                                               max_size=3),
          same_key=st.booleans())
    def add_race(self, run: int, ref: str, ops: list[str], same_key: bool) -> None:
        """Callers racing for one target: one live row at most, the rest 409 or replays."""
        run_id = chosen(self.runs(), run)
        key = self.new_key()
        self.step("add race", [self.add_request(op, run_id, ref, key if same_key else self.new_key()) for op in ops])

    @rule(run=pick, ref=st.sampled_from(REFS), times=st.integers(1, 3))
    def reserve_race(self, run: int, ref: str, times: int) -> None:
        """Shards of a running run reserving one target with keys of their own."""
        if not self.any_run(terminal=False):
            return
        run_id = chosen(self.runs(terminal=False), run)
        self.step("reserve race", [self.add_request("reserve", run_id, ref, self.new_key()) for _ in range(times)])

    @rule(row=pick, times=st.integers(1, 3), other_ref=st.booleans())
    def add_replay(self, row: int, times: int, other_ref: bool) -> None:
        """A known key again: its first row (200, whatever became of it), or 409 for another target."""
        if not self.model.rows:
            return
        first = chosen(sorted(self.model.rows.values(), key=lambda r: r.id), row)
        ref = chosen([r for r in REFS if r != first.ref], row) if other_ref else first.ref
        op = "reserve" if row % 2 else "record"
        self.step("add replay", [self.add_request(op, first.run, ref, first.key)] * times)

    @rule(row=pick, ops=st.lists(st.sampled_from(["confirm", "fail", "expire", "reverted", "failed", "failed!"]),
                                 min_size=1, max_size=3))
    def row_race(self, row: int, ops: list[str]) -> None:
        """Callers racing on one row: a change, replays of it, conflicts."""
        if not self.model.rows:
            return
        target = chosen(sorted(self.model.rows.values(), key=lambda r: r.id), row)
        requests: list[tuple[str, dict[str, Any]]] = []
        for op in ops:
            body: dict[str, Any] = {"resourceId": target.id}
            if op == "fail":
                body["error"] = FAIL_ERROR
            elif op.startswith("failed"):
                body.update(error="the shard refused" if op.endswith("!") else "no answer", transient=op == "failed")
                op = "failed"
            elif op == "expire":
                body = {"kind": KIND, "ref": target.ref}
            requests.append((op, body))
        self.step("row race", requests)

    @rule(run=pick, present=st.sets(st.sampled_from(REFS)))
    def reconcile(self, run: int, present: set[str]) -> None:
        if not any(r.status == v.CONFIRMED for r in self.model.rows.values()):
            return
        self.step("reconcile", [("reconcile", {"runId": chosen(self.runs(), run), "kind": KIND,
                                               "present": sorted(present)})])

    @rule(run=pick, to=st.sampled_from([v.COMPLETED, v.CANCELLED, v.RUN_FAILED]), times=st.integers(1, 2))
    def end_run(self, run: int, to: str, times: int) -> None:
        if not self.any_run(terminal=False):
            return
        run_id = chosen(self.runs(terminal=False), run)
        self.step("end run", [("run_status", {"runId": run_id, "status": to})] * times)

    @rule(run=pick, times=st.integers(1, 3))
    def claim_race(self, run: int, times: int) -> None:
        if not self.any_run(terminal=True):
            return
        self.claim(chosen(self.runs(terminal=True), run), times)

    def claim(self, run_id: str, times: int) -> list[int]:
        """Sweepers racing to claim one run: together they take every claimable row, each once."""
        before = {r.id for r in self.model.claimable(run_id)}
        body = {"runId": run_id, "maxAttempts": MAX_ATTEMPTS, "limit": 1000, "claimTimeoutS": 3600}
        step = self.step("claim race", [("claim", body)] * times)
        if self.model.runs[run_id].status in TERMINAL:
            taken = [r["resourceId"] for reply in step.replies for r in reply["resources"]]
            assert sorted(taken) == sorted(before), self.story() + f"\nclaimed {taken}, claimable {sorted(before)}"
            return taken
        return []

    @rule(run=pick, verdicts=st.lists(st.sampled_from(["reverted", "drifted", "failed", "transient"]), min_size=1,
                                      max_size=6),
          stray=st.booleans())
    def outcomes(self, run: int, verdicts: list[str], stray: bool) -> None:
        """One batch of give-back outcomes (a stray row: a conflict; an unknown id: missing)."""
        if not any(r.status == v.REVERTING for r in self.model.rows.values()):
            return
        run_id = chosen(sorted({r.run for r in self.model.rows.values() if r.status == v.REVERTING}), run)
        rows = sorted(self.model.of_run(run_id), key=lambda r: r.id)
        given = [r for r in rows if r.status == v.REVERTING] + ([r for r in rows if r.status != v.REVERTING][:1]
                                                                  if stray else [])
        outcomes: list[dict[str, Any]] = [{"resourceId": 9_000_000_000_000}] if stray else []
        outcomes[:0] = [{"resourceId": r.id} for r in given]
        for i, outcome in enumerate(outcomes):
            outcome["verdict"] = chosen(verdicts, i)
            if outcome["verdict"] in ("failed", "transient"):
                outcome["error"] = "the shard said no"
        if outcomes:
            self.step("outcomes", [("outcomes", {"outcomes": outcomes})])

    @rule(run=pick, times=st.integers(1, 2))
    def finish(self, run: int, times: int) -> None:
        if not any(r.status in TERMINAL and r.cleanup == v.CLEANUP_PENDING for r in self.model.runs.values()):
            return
        run_id = chosen([r.id for r in self.model.runs.values() if r.status in TERMINAL
                         and r.cleanup == v.CLEANUP_PENDING], run)
        self.step("finish", [("finish", {"runId": run_id, "maxAttempts": MAX_ATTEMPTS, "summary": {}})] * times)

    @rule(run=pick, times=st.integers(1, 3))
    def retry(self, run: int, times: int) -> None:
        """A person's retry, asked once or by several at once (the rest: replays)."""
        if not self.any_run(cleanup=v.CLEANUP_INCOMPLETE):
            return
        self.step("retry", [("retry", {"runId": chosen(self.runs(cleanup=v.CLEANUP_INCOMPLETE), run)})] * times)

    @rule(run=pick, verdicts=st.lists(st.sampled_from(["reverted", "drifted", "failed", "transient"]),
                                      min_size=1, max_size=4), sweepers=st.integers(1, 2))
    def sweep_run(self, run: int, verdicts: list[str], sweepers: int) -> None:
        """What the cleanup service does with a run, in its order: end it (if it is not over),
        claim (one or two sweepers at once), record the outcomes, finish."""
        run_id = chosen(self.runs(), run)
        if self.model.runs[run_id].status not in TERMINAL:
            self.step("end run", [("run_status", {"runId": run_id, "status": v.COMPLETED})])
        claimed = self.claim(run_id, sweepers)
        if claimed:
            outcomes = [{"resourceId": rid, "verdict": chosen(verdicts, i)} for i, rid in enumerate(claimed)]
            for outcome in outcomes:
                if outcome["verdict"] in ("failed", "transient"):
                    outcome["error"] = "the shard said no"
            self.step("outcomes", [("outcomes", {"outcomes": outcomes})])
        if self.model.runs[run_id].cleanup == v.CLEANUP_PENDING:
            self.step("finish", [("finish", {"runId": run_id, "maxAttempts": MAX_ATTEMPTS, "summary": {}})])

    @rule()
    def settle(self) -> None:
        self.step("settle", [("settle", {})])

    @precondition(lambda self: self.faults < FAULTS)
    @rule(fault=st.sampled_from(["kill a replica", "pause NATS", "restart PostgreSQL"]), replica=st.integers(0, 1),
          ref=st.sampled_from(REFS), row=pick)
    def fault(self, fault: str, replica: int, ref: str, row: int) -> None:
        """A fault while requests are in flight — a ledger replica SIGKILLed (and a new one
        started), nats-server frozen, PostgreSQL restarted — each request retried with its
        same key or body until answered: each must then have happened exactly once."""
        run_id = chosen(self.runs(), row)
        requests = [self.add_request("reserve", run_id, ref, self.new_key()),
                    self.add_request("record", run_id, chosen(REFS, row + 1), self.new_key())]
        pending = sorted(r.id for r in self.model.rows.values() if r.status == v.PENDING)
        if pending:
            requests.append(("confirm" if row % 2 else "fail", {"resourceId": chosen(pending, row),
                                                                "error": FAIL_ERROR}))
        inject = {"kill a replica": lambda: self.ledger.kill_and_restart(replica),
                  "pause NATS": self.ledger.servers.pause_nats,
                  "restart PostgreSQL": self.ledger.servers.restart_postgres}[fault]
        self.faults += 1
        self.step(fault, requests, during=inject)
        self.record["faults"][fault] += 1

    # --- the end: what the ledger says equals the model ------------------------------------

    def teardown(self) -> None:
        try:
            if self.history and self.in_sync:  # else a step failed already, with its history
                self.check_final_state()
        finally:
            # Settle what this example left, so that a later example's settle counts only its own.
            self.ledger.loop.run(self.ledger.ask("settle", {}, self.model.module), 60)

    def check_final_state(self) -> None:
        loop, nc = self.ledger.loop, self.ledger.nc
        for run_id, run in self.model.runs.items():
            state = loop.run(read_state(nc, run_id), 30)
            console, where = state["console"], f"\nrun {run_id}:\n"
            got_run = (console["run"]["status"], console["run"]["cleanupStatus"])
            assert got_run == (run.status, run.cleanup), self.story() + where + f"run {got_run}, model " \
                                                                                f"{(run.status, run.cleanup)}"
            rows = {r.id: r for r in self.model.of_run(run_id)}
            got = {r["resourceId"]: r for r in console["resources"]}
            assert sorted(got) == sorted(rows), self.story() + where + f"rows {sorted(got)}, model {sorted(rows)}"
            for rid, row in rows.items():
                seen = got[rid]
                expect = (row.status, row.attempts, row.gave_up, row.ref, row.key)
                actual = (seen["status"], seen["attempts"], seen["gaveUp"], seen["ref"], seen["idempotencyKey"])
                assert actual == expect, self.story() + where + f"resource {rid} {actual}, model {expect}"
                if row.last_error is not UNKNOWN:
                    assert seen["lastError"] == row.last_error, self.story() + where + \
                        f"resource {rid} lastError {seen['lastError']!r}, model {row.last_error!r}"
            logged = collections.defaultdict(list)
            for entry in state["log"]:
                logged[entry["resourceId"]].append(entry["kind"])
            for rid, row in rows.items():
                assert logged.pop(rid, []) == row.log, self.story() + where + \
                    f"resource {rid} log {logged.get(rid)}, model {row.log}"
            assert collections.Counter(logged.pop(None, [])) == collections.Counter(run.events), \
                self.story() + where + f"run log {state['log']}, model {run.events}"
            assert not logged, self.story() + where + f"log entries of unknown rows {dict(logged)}"
            # Every committed change: exactly one event (match by Nats-Msg-Id and eventId).
            expected = collections.Counter([(None, kind) for kind in run.events]
                                           + [(rid, kind) for rid, row in rows.items() for kind in row.log])
            events = loop.run(read_events(nc, run_id, sum(expected.values())), 60)
            msg_ids = [msg_id for msg_id, _ in events]
            assert len(set(msg_ids)) == len(msg_ids) and all(msg_ids), self.story() + where + f"Nats-Msg-Ids {msg_ids}"
            assert len({e["eventId"] for _, e in events}) == len(events), self.story() + where + "an eventId twice"
            assert all(msg_id.endswith(f":{e['eventId']}") for msg_id, e in events), msg_ids
            seen_events = collections.Counter(((e.get("resource") or {}).get("resourceId"), e["type"])
                                              for _, e in events)
            assert seen_events == expected, self.story() + where + \
                f"events beyond the model {seen_events - expected}, missing {expected - seen_events}"
            self.record["events"] += len(events)


def run_model(tmp_path, examples: int, steps: int) -> dict[str, Any]:
    """Run the state machine against two ledger replicas on servers of its own; a record of
    what it did."""
    loop = Loop()
    servers = Servers()
    procs = ServiceProcesses(tmp_path, servers.nats.url)
    record: dict[str, Any] = {"examples": examples, "steps": 0, "faults": collections.Counter(), "events": 0,
                              "replies": collections.Counter()}
    started = time.monotonic()
    try:
        LedgerHistory.ledger = Ledger(loop, procs, servers, replicas=2)
        LedgerHistory.record = record
        try:
            run_state_machine_as_test(LedgerHistory, settings=settings(
                max_examples=examples, stateful_step_count=steps, deadline=None, database=None,
                suppress_health_check=list(HealthCheck)))
        finally:
            LedgerHistory.ledger.close()
    finally:
        procs.stop_all()
        loop.close()
        servers.stop()
    record["seconds"] = round(time.monotonic() - started, 1)
    return record


# pytest's 300 s would cut a long run, or the shrinking of a failure (each step is real I/O).
@pytest.mark.timeout(max(900, EXAMPLES * STEPS * 2))
def test_the_ledgers_history_is_one_the_model_allows(tmp_path):
    record = run_model(tmp_path, EXAMPLES, STEPS)
    print(f"model run: {record}")
    assert record["steps"] > 0
