"""A small reference model of the ledger's state machine, written from docs/ledger.md's tables
and docs/contracts.md's "Ledger" rows — deliberately not from ``services/ledger/statuses.py``,
so that the two can disagree. Only the vocabulary (the status words) is shared.

The model is a checker: :func:`check` takes a request, the reply the real ledger gave and the
model's state before it, and says whether that reply is one the documented state machine allows
(returning the state after it), or why not. A new row's id comes from the reply (the database
picks ids); the model only insists it is new."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from shared.contracts import ledger_statuses as v

# docs/ledger.md, "How a transition is made" and the run/cleanup paragraph.
LIVE = (v.PENDING, v.CONFIRMED)                      # one such row per target
UNRESOLVED = (v.PENDING, v.CONFIRMED, v.REVERTING, v.ORPHANED, v.DRIFTED)
REVERTABLE = (v.PENDING, v.CONFIRMED, v.ORPHANED)    # sweep claim's "from"
EXPIRABLE = (v.PENDING, v.CONFIRMED, v.ORPHANED)     # expiry's "from"
TERMINAL = (v.COMPLETED, v.CANCELLED, v.RUN_FAILED, v.MISSED)
RUN_MOVES = {v.RUNNING: (v.SCHEDULED,), v.COMPLETED: (v.RUNNING,), v.RUN_FAILED: (v.RUNNING,),
             v.CANCELLED: (v.SCHEDULED, v.RUNNING), v.MISSED: (v.SCHEDULED,)}
MAX_ATTEMPTS = 3
EXPIRED_ERROR = "the game ended it at its deadline"  # the lastError an expiry writes (docs/ledger.md, "Expiry")
class _Unknown:
    """The one value of :data:`UNKNOWN`: it stays itself through ``copy.deepcopy`` (the model is
    copied to try each order of a step's requests; a plain ``object()`` came back as another
    object, and ``is UNKNOWN`` failed on a copied row)."""

    def __deepcopy__(self, _memo: object) -> _Unknown:
        return self

    def __copy__(self) -> _Unknown:
        return self

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = _Unknown()
"""A field the docs do not pin down after some step (e.g. ``lastError`` after a give-back)."""


@dataclass
class Row:
    id: int
    run: str
    ref: str
    key: str
    status: str
    attempts: int = 0
    gave_up: bool = False
    before_claim: str | None = None
    last_error: Any = None
    log: list[str] = field(default_factory=list)
    """The log kinds (= event types) of this row's committed changes, in order."""


@dataclass
class RunState:
    id: str
    status: str = v.SCHEDULED
    cleanup: str = v.CLEANUP_PENDING
    events: list[str] = field(default_factory=list)
    """Event types of the run's own changes (those without a row)."""
    last_cleanup_kind: str | None = None
    """The latest of ``cleanup.retried`` / ``cleanup.swept`` (a retry's replay rule)."""


@dataclass
class Model:
    module: str
    kind: str
    runs: dict[str, RunState] = field(default_factory=dict)
    rows: dict[int, Row] = field(default_factory=dict)

    def copy(self) -> Model:
        return copy.deepcopy(self)

    def by_key(self, key: str) -> Row | None:
        return next((r for r in self.rows.values() if r.key == key), None)

    def holder(self, ref: str) -> Row | None:
        return next((r for r in self.rows.values() if r.ref == ref and r.status in LIVE), None)

    def of_run(self, run_id: str) -> list[Row]:
        return [r for r in self.rows.values() if r.run == run_id]

    def unresolved(self, run_id: str) -> list[Row]:
        return [r for r in self.of_run(run_id) if r.status in UNRESOLVED]

    def claimable(self, run_id: str) -> list[Row]:
        return [r for r in self.of_run(run_id)
                if r.status in REVERTABLE and r.attempts < MAX_ATTEMPTS and not r.gave_up]


class Refused(AssertionError):
    """The reply is not one the model allows from this state."""


def _expect(cond: bool, why: str) -> None:
    if not cond:
        raise Refused(why)


def _row_reply(m: Model, reply: dict[str, Any], row: Row) -> None:
    """A 200 ``{resource}`` reply must show ``row`` as the model has it."""
    _expect(reply.get("status") == 200, f"expected 200 with resource {row.id}, got {reply}")
    got = reply["resource"]
    _expect(got["resourceId"] == row.id and got["status"] == row.status,
            f"expected resource {row.id} {row.status}, got {got['resourceId']} {got['status']}")


def _code(reply: dict[str, Any], code: int, why: str) -> None:
    _expect(reply.get("status") == code, f"expected {code} ({why}), got {reply}")


def check(m: Model, op: str, req: dict[str, Any], reply: dict[str, Any]) -> Model:
    """The model's state after ``op`` answered ``reply``; :class:`Refused` when not allowed."""
    m = m.copy()
    handler = globals()[f"_{op}"]
    handler(m, req, reply)
    return m


def _add(m: Model, req: dict[str, Any], reply: dict[str, Any], status: str) -> None:
    run = m.runs[req["runId"]]
    known = m.by_key(req["idempotencyKey"])
    if known is not None:  # a retry with the same key: the first row, or 409 for another target
        if (known.run, known.ref) == (req["runId"], req["ref"]):
            _row_reply(m, reply, known)
        else:
            _code(reply, 409, "key names another target")
        return
    if status == v.PENDING and run.status in TERMINAL:
        _code(reply, 409, f"reserve on a {run.status} run")
        return
    if m.holder(req["ref"]) is not None:
        _code(reply, 409, f"target held by resource {m.holder(req['ref']).id}")  # type: ignore[union-attr]
        return
    _expect(reply.get("status") == 200, f"expected a new row, got {reply}")
    new_id = reply["resource"]["resourceId"]
    _expect(new_id not in m.rows, f"new row reuses id {new_id}")
    _expect(reply["resource"]["status"] == status, f"new row is {reply['resource']['status']}, not {status}")
    m.rows[new_id] = Row(new_id, req["runId"], req["ref"], req["idempotencyKey"], status, log=["resource.recorded"])
    if status == v.CONFIRMED and run.status in TERMINAL and run.cleanup == v.CLEANUP_COMPLETE:
        run.cleanup = v.CLEANUP_PENDING  # a record reopens a complete cleanup (no event of its own)


def _reserve(m: Model, req: dict[str, Any], reply: dict[str, Any]) -> None:
    _add(m, req, reply, v.PENDING)


def _record(m: Model, req: dict[str, Any], reply: dict[str, Any]) -> None:
    _add(m, req, reply, v.CONFIRMED)


def _step(m: Model, req: dict[str, Any], reply: dict[str, Any], allowed: tuple[str, ...], to: str, kind: str,
          replayable: bool, error: Any = None) -> Row | None:
    """A fixed-target transition with the docs' replay rule; the changed row, else None."""
    row = m.rows.get(req["resourceId"])
    if row is None:
        _code(reply, 404, "unknown resource")
        return None
    if row.status in allowed:
        row.status = to
        row.log.append(kind)
        _row_reply(m, reply, row)
        return row
    if (replayable and row.status == to and row.log and row.log[-1] == kind
            and (error is None or error == row.last_error)):
        _row_reply(m, reply, row)  # the same request again: 200, no log entry, no event
        return None
    _code(reply, 409, f"{kind} from {row.status}")
    return None


def _confirm(m: Model, req: dict[str, Any], reply: dict[str, Any]) -> None:
    _step(m, req, reply, (v.PENDING,), v.CONFIRMED, "resource.confirmed", True)


def _fail(m: Model, req: dict[str, Any], reply: dict[str, Any]) -> None:
    row = _step(m, req, reply, (v.PENDING,), v.REVERTED, "resource.failed", True, req["error"])
    if row is not None:
        row.last_error = req["error"]


def _reverted(m: Model, req: dict[str, Any], reply: dict[str, Any]) -> None:
    row = _step(m, req, reply, (v.REVERTING,), v.REVERTED, "cleanup.reverted", True)
    if row is not None:
        row.last_error = UNKNOWN


def _give_back_failed(m: Model, row: Row, error: str, transient: bool) -> None:
    back = row.before_claim or v.CONFIRMED
    # docs/ledger.md, "sweep failed": back to a live status only while no newer row holds the
    # target (one was free to take it while this row was reverting); else orphaned.
    row.status = v.ORPHANED if back in LIVE and m.holder(row.ref) is not None else back
    row.attempts += 1
    row.gave_up = row.gave_up or not transient
    row.last_error = error
    row.log.append("cleanup.failed")


def _failed(m: Model, req: dict[str, Any], reply: dict[str, Any]) -> None:
    row = m.rows.get(req["resourceId"])
    if row is None:
        _code(reply, 404, "unknown resource")
        return
    if row.status != v.REVERTING:  # never a replay: each one spends an attempt
        _code(reply, 409, f"sweep.failed from {row.status}")
        return
    _give_back_failed(m, row, req["error"], req["transient"])
    _row_reply(m, reply, row)


def _outcomes(m: Model, req: dict[str, Any], reply: dict[str, Any]) -> None:
    _code(reply, 200, "outcomes")
    recorded, conflicts, missing = [], [], []
    for outcome in sorted(req["outcomes"], key=lambda o: o["resourceId"]):  # the ledger: id order
        row = m.rows.get(outcome["resourceId"])
        if row is None:
            missing.append(outcome["resourceId"])
            continue
        if row.status != v.REVERTING:
            conflicts.append({"resourceId": row.id, "status": row.status})
            continue
        recorded.append(row.id)
        verdict = outcome["verdict"]
        if verdict in (v.VERDICT_REVERTED, v.VERDICT_DRIFTED):
            row.status = v.REVERTED if verdict == v.VERDICT_REVERTED else v.DRIFTED
            row.log.append(f"cleanup.{row.status}")
            row.last_error = UNKNOWN
        else:
            _give_back_failed(m, row, outcome["error"], verdict == v.VERDICT_TRANSIENT)
    _expect(sorted(reply["recorded"]) == sorted(recorded), f"recorded {reply['recorded']}, model {recorded}")
    _expect(sorted(reply["missing"]) == sorted(missing), f"missing {reply['missing']}, model {missing}")
    got = sorted((c["resourceId"], c["status"]) for c in reply["conflicts"])
    _expect(got == sorted((c["resourceId"], c["status"]) for c in conflicts), f"conflicts {got}, model {conflicts}")


def _settle_if_done(m: Model, run: RunState, allowed: tuple[str, ...]) -> bool:
    if run.status in TERMINAL and run.cleanup in allowed and not m.unresolved(run.id):
        run.cleanup = v.CLEANUP_COMPLETE
        run.events.append("cleanup.settled")
        return True
    return False


def _expire(m: Model, req: dict[str, Any], reply: dict[str, Any]) -> None:
    hit = [r for r in m.rows.values() if r.ref == req["ref"] and r.status in EXPIRABLE]
    for row in hit:
        row.status = v.EXPIRED
        row.last_error = EXPIRED_ERROR
        row.log.append("resource.expired")
    _expect(reply == {"status": 200, "expired": len(hit)}, f"expected {len(hit)} expired, got {reply}")
    for run_id in sorted({r.run for r in hit}):  # even from incomplete: nobody has anything left to do
        _settle_if_done(m, m.runs[run_id], (v.CLEANUP_PENDING, v.CLEANUP_INCOMPLETE))


def _reconcile(m: Model, req: dict[str, Any], reply: dict[str, Any]) -> None:
    hit = [r for r in m.of_run(req["runId"]) if r.status == v.CONFIRMED and r.ref not in req["present"]]
    for row in hit:
        row.status = v.ORPHANED
        row.log.append("resource.orphaned")
    _expect(reply == {"status": 200, "orphaned": len(hit)}, f"expected {len(hit)} orphaned, got {reply}")


def _create(m: Model, req: dict[str, Any], reply: dict[str, Any]) -> None:
    _code(reply, 200, "a new run")
    if req["runId"] not in m.runs:
        m.runs[req["runId"]] = RunState(req["runId"], events=["run.created"])


def _run_status(m: Model, req: dict[str, Any], reply: dict[str, Any]) -> None:
    run, to = m.runs[req["runId"]], req["status"]
    if run.status in RUN_MOVES.get(to, ()):
        run.status = to
        run.events.append("run.status")
    elif run.status != to:
        _code(reply, 409, f"run {run.status} → {to}")
        return
    _code(reply, 200, "run status")
    _expect(reply["run"]["status"] == run.status, f"run is {reply['run']['status']}, model {run.status}")


def _claim(m: Model, req: dict[str, Any], reply: dict[str, Any]) -> None:
    """Rows claimed: a subset of the claimable ones (concurrent claims share them out, SKIP
    LOCKED); the caller checks that a group of claims took all of them, each once."""
    run = m.runs[req["runId"]]
    if run.status not in TERMINAL:
        _code(reply, 409, "claim on a run not over")
        return
    _code(reply, 200, "claim")
    claimable = {r.id for r in m.claimable(run.id)}
    for got in reply["resources"]:
        _expect(got["resourceId"] in claimable, f"claimed resource {got['resourceId']}, not claimable")
        row = m.rows[got["resourceId"]]
        row.before_claim, row.status = row.status, v.REVERTING
        row.log.append("cleanup.claimed")
        _expect(got["status"] == v.REVERTING, f"claimed row is {got['status']}")


def _finish(m: Model, req: dict[str, Any], reply: dict[str, Any]) -> None:
    run = m.runs[req["runId"]]
    if run.status not in TERMINAL:
        _code(reply, 409, "finish on a run not over")
        return
    _code(reply, 200, "finish")
    run.events.append("cleanup.swept")
    run.last_cleanup_kind = "cleanup.swept"
    if run.cleanup == v.CLEANUP_PENDING:
        left = m.unresolved(run.id)
        reach = [r for r in left if r in m.claimable(run.id) or r.status == v.REVERTING]
        run.cleanup = (v.CLEANUP_COMPLETE if not left else v.CLEANUP_PENDING if reach else v.CLEANUP_INCOMPLETE)
    _expect(reply["run"]["cleanupStatus"] == run.cleanup, f"cleanup {reply['run']['cleanupStatus']}, "
                                                          f"model {run.cleanup}")


def _retry(m: Model, req: dict[str, Any], reply: dict[str, Any]) -> None:
    run = m.runs[req["runId"]]
    if run.cleanup == v.CLEANUP_INCOMPLETE:
        run.cleanup = v.CLEANUP_PENDING
        run.events.append("cleanup.retried")
        run.last_cleanup_kind = "cleanup.retried"
        for row in m.unresolved(run.id):
            row.attempts, row.gave_up = 0, False
    elif not (run.cleanup == v.CLEANUP_PENDING and run.last_cleanup_kind == "cleanup.retried"):
        _code(reply, 409, f"retry of a {run.cleanup} cleanup")
        return
    _code(reply, 200, "retry")
    _expect(reply["run"]["cleanupStatus"] == run.cleanup, f"cleanup {reply['run']['cleanupStatus']}")


def _settle(m: Model, req: dict[str, Any], reply: dict[str, Any]) -> None:
    settled = sum(_settle_if_done(m, run, (v.CLEANUP_PENDING,)) for run in m.runs.values())
    _expect(reply == {"status": 200, "settled": settled}, f"expected {settled} settled, got {reply}")
