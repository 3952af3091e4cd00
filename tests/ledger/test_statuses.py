"""The ledger's state machine is one table, ``services/ledger/statuses.py``: these tests hold
it to what docs/ledger.md and ADR 0001 say, row by row, and check that no other module of the
ledger names a status of its own (every statement binds them from the table)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from services.ledger import statuses as sm
from shared.contracts import ledger_statuses as vocab

ROOT = Path(__file__).resolve().parents[2]
LEDGER_DOC = (ROOT / "docs" / "ledger.md").read_text(encoding="utf-8")

# --- runs ----------------------------------------------------------------------------------

RUN_MOVES = {
    # docs/ledger.md: "Runs: `scheduled → running | cancelled | missed`, `running → completed | cancelled | failed`"
    ("scheduled", "running"), ("scheduled", "cancelled"), ("scheduled", "missed"),
    ("running", "completed"), ("running", "cancelled"), ("running", "failed"),
}


def test_run_transitions_are_the_documented_ones():
    table = {(before, after) for after, befores in sm.RUN_STATUS_FROM.items() for before in befores}
    assert table == RUN_MOVES
    documented = set()
    for before, afters in re.findall(r"`(\w+) → ([\w |]+)`", LEDGER_DOC.split("Runs: ", 1)[1].split("; cleanup", 1)[0]):
        documented |= {(before, after.strip()) for after in afters.split("|")}
    assert documented == RUN_MOVES


def test_terminal_runs_are_the_ones_nothing_leads_from():
    assert set(sm.RUN_TERMINAL) == set(vocab.RUN_STATUSES) - {before for before, _ in RUN_MOVES}
    assert sm.NEW_RUN == "scheduled" and sm.NEW_RUN_CLEANUP == "pending"


# --- a run's cleanup -----------------------------------------------------------------------

# (step, from, to, log kind): docs/ledger.md ("cleanup: `pending → complete` (settle, finish, or an
# expiry of the last unresolved row — even from `incomplete`), `pending → incomplete` (finish …),
# `incomplete → pending` (a person's retry, `cleanup.retried`)") and docs/contracts.md
# (ledger.resource.record: "reopening a `complete` cleanup").
CLEANUP_STEPS = [
    (sm.SETTLE, {"pending"}, "complete", "cleanup.settled"),
    (sm.SETTLE_AFTER_EXPIRY, {"pending", "incomplete"}, "complete", "cleanup.settled"),
    (sm.RETRY, {"incomplete"}, "pending", "cleanup.retried"),
    (sm.REOPEN, {"complete"}, "pending", "resource.recorded"),
]


@pytest.mark.parametrize(("step", "allowed", "to", "log_kind"), CLEANUP_STEPS, ids=[s[0].name for s in CLEANUP_STEPS])
def test_cleanup_steps_are_the_documented_ones(step, allowed, to, log_kind):
    assert (set(step.allowed), step.to, step.log_kind) == (allowed, to, log_kind)


def test_a_sweeps_finish_decides_as_documented():
    # "cleanup → complete (nothing unresolved), incomplete (what is left is beyond the sweep), else stays pending"
    rule = sm.FINISH
    assert (rule.allowed, rule.clean, rule.stuck, rule.unfinished, rule.log_kind) == (
        ("pending",), "complete", "incomplete", "pending", "cleanup.swept")
    pairs = re.findall(r"`(\w+) → (\w+)`", LEDGER_DOC.split("; cleanup: ", 1)[1].split("\n\n", 1)[0])
    assert pairs, "docs/ledger.md lists no cleanup move"
    for pair in pairs:
        assert pair in {(before, step.to) for step, *_ in CLEANUP_STEPS for before in step.allowed} | {
            (before, to) for before in rule.allowed for to in (rule.clean, rule.stuck)}


def test_a_retry_replays_only_where_a_retry_leads():
    assert sm.is_retry_replay("pending", "cleanup.retried")
    assert not sm.is_retry_replay("pending", "cleanup.swept")
    assert not sm.is_retry_replay("incomplete", "cleanup.retried")


# --- resources -----------------------------------------------------------------------------

BEFORE_THE_CLAIM = "the status before the claim"

# docs/ledger.md's table of resource transitions, row by row: (row, the transitions it
# describes, from, to (BEFORE_THE_CLAIM: back where the claim found it), log kinds).
RESOURCE_ROWS = [
    ("reserve / record", [sm.RESERVE, sm.RECORD], set(), {"pending", "confirmed"}, {"resource.recorded"}),
    ("confirm", [sm.CONFIRM], {"pending"}, {"confirmed"}, {"resource.confirmed"}),
    ("fail (creation failed)", [sm.FAIL], {"pending"}, {"reverted"}, {"resource.failed"}),
    ("reconcile (not listed)", [sm.ORPHAN], {"confirmed"}, {"orphaned"}, {"resource.orphaned"}),
    ("expiry", [sm.EXPIRE], {"pending", "confirmed", "orphaned"}, {"expired"}, {"resource.expired"}),
    ("sweep claim", [sm.CLAIM, sm.RECLAIM], {"pending", "confirmed", "orphaned", "reverting"}, {"reverting"},
     {"cleanup.claimed"}),
    ("sweep reverted / drifted", [sm.REVERTED, sm.DRIFTED], {"reverting"}, {"reverted", "drifted"},
     {"cleanup.reverted", "cleanup.drifted"}),
    ("sweep failed", [sm.FAILED], {"reverting"}, {BEFORE_THE_CLAIM, "orphaned"}, {"cleanup.failed"}),
    ("sweep away", [sm.AWAY], {"reverting"}, {BEFORE_THE_CLAIM, "orphaned"}, {"cleanup.away"}),
]


def _doc_rows() -> dict[str, list[str]]:
    table = LEDGER_DOC.split("| resource transition | from | to | log kind |", 1)[1].split("\n\n", 1)[0]
    rows = {}
    for line in table.strip().splitlines()[1:]:
        name, *cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        rows[name.split(" (outcomes only")[0]] = cells
    return rows


def _statuses_in(cell: str) -> set[str]:
    found = {word for word in re.findall(r"`([^`]+)`", cell) if word in vocab.RESOURCE_STATUSES}
    return found | ({BEFORE_THE_CLAIM} if BEFORE_THE_CLAIM in cell else set())


@pytest.mark.parametrize(("row", "steps", "allowed", "to", "log_kinds"), RESOURCE_ROWS,
                         ids=[r[0] for r in RESOURCE_ROWS])
def test_each_resource_transition_is_the_documented_row(row, steps, allowed, to, log_kinds):
    assert {status for step in steps for status in step.allowed} == allowed
    # Back where the claim found it, or DISPLACED when a newer row took that live status's target.
    assert {status for step in steps for status in ((step.to,) if step.to else (BEFORE_THE_CLAIM, sm.DISPLACED))} == to
    assert {step.log_kind for step in steps} == log_kinds
    from_cell, to_cell, kind_cell = _doc_rows()[row]
    assert _statuses_in(from_cell) == allowed
    assert _statuses_in(to_cell) == to
    assert set(re.findall(r"`([\w.]+)`", kind_cell)) == log_kinds


def test_the_documented_table_has_no_row_the_state_machine_lacks():
    assert set(_doc_rows()) == {row for row, *_ in RESOURCE_ROWS}


def test_status_groups():
    assert sm.LIVE == ("pending", "confirmed")  # the partial unique index (docs/ledger.md)
    assert set(sm.UNRESOLVED) == set(vocab.RESOURCE_STATUSES) - {"reverted", "expired"}
    assert sm.CLAIM.allowed == sm.REVERTABLE
    assert sm.RECLAIM.allowed == sm.IN_FLIGHT
    assert sm.IN_FLIGHT == ("reverting",)
    assert set(sm.WAITING) == set(sm.REVERTABLE) | set(sm.IN_FLIGHT)
    assert sm.LEASE_HELD == ("confirmed",)
    assert sm.PREVIOUS_UNKNOWN == "confirmed"
    assert sm.DISPLACED == "orphaned" and sm.DISPLACED not in sm.LIVE


# What each give-back verdict does (docs/ledger.md's rows "sweep …" and docs/contracts.md's
# ledger.sweep.outcomes): (verdict, to, spends an attempt, gives up, away: +1 / reset).
VERDICTS = [
    ("reverted", "reverted", False, False, "reset"),
    ("drifted", "drifted", False, False, "reset"),
    ("failed", BEFORE_THE_CLAIM, True, True, "reset"),
    ("transient", BEFORE_THE_CLAIM, True, False, "reset"),
    ("away", BEFORE_THE_CLAIM, False, False, "+1"),
]


@pytest.mark.parametrize(("verdict", "to", "spends", "gives_up", "away"), VERDICTS, ids=[v[0] for v in VERDICTS])
def test_each_verdict_is_the_documented_step(verdict, to, spends, gives_up, away):
    outcome = sm.OUTCOMES[verdict]
    assert outcome.step.allowed == sm.OUTCOMES_FROM == ("reverting",)
    assert (outcome.step.to or BEFORE_THE_CLAIM, outcome.spends_attempt, outcome.gives_up) == (to, spends, gives_up)
    assert (outcome.counts_away, outcome.clears_away) == ((True, False) if away == "+1" else (False, True))


def test_every_verdict_has_its_step():
    assert set(sm.OUTCOMES) == set(vocab.VERDICTS) == {v[0] for v in VERDICTS}


@pytest.mark.parametrize(("one_row", "verdict"), [(sm.SWEEP_REVERTED, "reverted"), (sm.SWEEP_DRIFTED, "drifted"),
                                                  (sm.SWEEP_FAILED[False], "failed"),
                                                  (sm.SWEEP_FAILED[True], "transient")])
def test_a_one_row_subject_is_its_verdicts_step_that_leaves_away_alone(one_row, verdict):
    assert one_row.step == sm.OUTCOMES[verdict].step
    assert (one_row.spends_attempt, one_row.gives_up) == (sm.OUTCOMES[verdict].spends_attempt,
                                                         sm.OUTCOMES[verdict].gives_up)
    assert (one_row.counts_away, one_row.clears_away) == (False, False)


def test_only_fixed_target_transitions_replay():
    # docs/ledger.md: "`confirm`, `fail`, `sweep.reverted` and `sweep.drifted` replay; `sweep.failed` never does"
    assert sm.REPLAYABLE == (sm.CONFIRM, sm.FAIL, sm.REVERTED, sm.DRIFTED)
    assert sm.is_replay(sm.CONFIRM, "confirmed", "resource.confirmed", None, None)
    assert not sm.is_replay(sm.FAILED, "confirmed", "cleanup.failed", "x", "x")
    assert not sm.is_replay(sm.FAIL, "reverted", "resource.failed", "one", "another")


def test_a_conflict_names_each_transition_as_before():
    assert [step.action for step in (sm.CONFIRM, sm.FAIL, sm.REVERTED, sm.DRIFTED, sm.FAILED)] == [
        "confirm", "fail", "reverted", "drifted", "a failed give-back"]


def test_generated_sql_constants():
    assert sm.sql_one_of("s.status", ("confirmed",)) == "s.status = 'confirmed'"
    assert sm.sql_one_of("status", ("pending", "confirmed")) == "status IN ('pending', 'confirmed')"
    assert sm.sql_case("s.status", {"drifted": "someone's"}) == "CASE s.status WHEN 'drifted' THEN 'someone''s' END"


# --- no status outside the table -------------------------------------------------------------

STATUSES = set(vocab.RUN_STATUSES) | set(vocab.CLEANUP_STATUSES) | set(vocab.RESOURCE_STATUSES)
STATUS_WORDS = STATUSES | set(vocab.VERDICTS)
LEDGER = ROOT / "services" / "ledger"


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """Every string constant of the module's code, docstrings and other bare strings left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    prose = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose]


@pytest.mark.parametrize("path", sorted(p for p in LEDGER.rglob("*.py")
                                        if p.name != "statuses.py" and "migrations" not in p.parts),
                         ids=lambda p: str(p.relative_to(LEDGER)))
def test_no_ledger_module_names_a_status_of_its_own(path):
    found = []
    for line, text in _code_strings(path):
        quoted = set(re.findall(r"'(\w+)'", text))  # a status as a constant inside SQL text
        if text in STATUS_WORDS or quoted & STATUSES:
            found.append((line, text[:80]))
    assert found == []
