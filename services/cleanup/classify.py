"""What an answer to a give-back means for the row (docs/cleanup.md, "A sweep", step 3).

A give-back ends in one of five verdicts: the thing is back (``reverted``), somebody else
changed it on purpose (``drifted``), it cannot be given back by the sweep (``failed``, with a
reason a person can act on), the shard or module answered "not now" (``transient``: the row
goes back to its previous status with one more attempt), or nobody answered at all (``away``:
the row goes back to its previous status *without* spending an attempt, and is not claimed
again until its back-off passes). Anything the shard or a module answers that is not one of
the documented answers is ``failed`` with a reason that quotes it, so a garbage answer never
crashes a sweep and never passes for success.

Which is which — an attempt is spent only on an answer that came from the shard or the module
itself:

========================================================  =============  ===================
what came back                                            verdict        attempt spent
========================================================  =============  ===================
NATS "no responders": no gateway holds the shard, or no   ``away``       no
module subscribes to ``modules.<module>.revert``
no answer within the command timeout (NATS timeout), or   ``away``       no
NATS itself unreachable
the gateway's own 503 (``{"status":503,"error":…}``: the  ``away``       no
shard is not connected to it any more, or disconnected
before answering) — the shard never got or never
answered the command
the gateway's own 504 (``{"status":504,"error":…}``: the  ``away``       no
shard did not answer within the gateway's command
timeout)
the shard's 425 (``bridge.busy``: the same idempotency    ``transient``  yes
key is still in flight) or 429 (rate limited)
a module's 503, 504, 425 or 429 (the module itself        ``transient``  yes
answered "not now")
any other non-200 answer, or a 200 that is not one of     ``failed``     yes (and the row
the documented answers                                                   wants a person)
========================================================  =============  ===================

A gateway's command reply never carries 503 or 504 for a shard's answer (the shard's answers
map to 200, 400, 403, 404, 409, 425 and 429: services/gateway/commands/reply_mapping.py), so on the
command plane a 503 or a 504 is always the gateway saying the shard was not there to answer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from http import HTTPStatus
from typing import Any

from shared.contracts import ledger_statuses


class Verdict(StrEnum):
    """What became of one give-back: the ledger's verdicts (shared/contracts/ledger_statuses.py),
    as an enum the sweep can match on."""

    REVERTED = ledger_statuses.VERDICT_REVERTED
    DRIFTED = ledger_statuses.VERDICT_DRIFTED
    FAILED = ledger_statuses.VERDICT_FAILED
    TRANSIENT = ledger_statuses.VERDICT_TRANSIENT
    AWAY = ledger_statuses.VERDICT_AWAY


@dataclass(frozen=True)
class Outcome:
    """A verdict and, unless reverted, the reason a person reads on the console."""

    verdict: Verdict
    reason: str = ""


TRANSIENT_STATUSES = frozenset({HTTPStatus.SERVICE_UNAVAILABLE, HTTPStatus.GATEWAY_TIMEOUT, HTTPStatus.TOO_EARLY,
                                HTTPStatus.TOO_MANY_REQUESTS})
"""Statuses that mean "not now": no shard connected, no answer in time, busy, rate limited."""

GATEWAY_AWAY_STATUSES = frozenset({HTTPStatus.SERVICE_UNAVAILABLE, HTTPStatus.GATEWAY_TIMEOUT})
"""The gateway's own answers to a command the shard never got or never answered (no shard
connected, or it disconnected before answering; no answer in time): ``away``, not an attempt."""

GIVEN_BACK = frozenset({"removed", "gone"})
"""A module revert's results that count as given back (``gone``: it was already absent)."""

PREVIEW_CHARS = 200
"""How much of an unexpected answer a reason quotes."""

_STATUS_HINTS: dict[int, str] = {
    HTTPStatus.BAD_REQUEST: "the shard refused the command as invalid",
    HTTPStatus.FORBIDDEN: "the shard's operator refuses it (event plane disabled or protected)",
    HTTPStatus.NOT_FOUND: "the shard does not know what the command names",
    HTTPStatus.CONFLICT: "the shard speaks another protocol version: a deployment fault, fix the versions",
}


def preview(value: Any) -> str:
    """A short, printable rendering of an answer for a reason sentence."""
    try:
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + "…"


def quoted(value: Any) -> str:
    """A value inside a sentence, JSON-quoted so ``"5"`` and ``5`` read differently."""
    try:
        return preview(json.dumps(value, ensure_ascii=False, default=str))
    except (TypeError, ValueError):
        return preview(repr(value))


def _payload(what: str, reply: Any, *, in_body: bool) -> dict[str, Any] | Outcome:
    """What a 200 answer says — the gateway's ``body`` (``in_body``) or a module's reply
    itself; any other answer as its outcome."""
    if not isinstance(reply, dict):
        return Outcome(Verdict.FAILED, f"{what} answered something that is not a JSON object: {preview(reply)}")
    status = reply.get("status")
    if not isinstance(status, int) or isinstance(status, bool):
        return Outcome(Verdict.FAILED, f"{what} answered without an integer status: {preview(reply)}")
    if status != HTTPStatus.OK:
        return _not_ok(what, status, reply, from_gateway=in_body)
    if not in_body:
        return reply
    body = reply.get("body")
    if not isinstance(body, dict):
        return Outcome(Verdict.FAILED, f"{what} answered 200 without a body object: {preview(reply)}")
    return body


def _not_ok(what: str, status: int, reply: dict[str, Any], *, from_gateway: bool) -> Outcome:
    """The outcome of a non-200 answer (``from_gateway``: a command's reply through the
    gateway, whose 503 and 504 say the shard was not there to answer)."""
    detail = reply.get("error")
    body = reply.get("body")
    if not detail and isinstance(body, dict):
        detail = body.get("reason") or body.get("error")
    detail = str(detail) if detail else preview(reply)
    if from_gateway and status in GATEWAY_AWAY_STATUSES:
        return Outcome(Verdict.AWAY, f"{what} answered {status}: {detail}")
    if status in TRANSIENT_STATUSES:
        return Outcome(Verdict.TRANSIENT, f"{what} answered {status}: {detail}")
    hint = _STATUS_HINTS.get(status, "an answer the sweep cannot act on")
    return Outcome(Verdict.FAILED, f"{what} answered {status} ({hint}): {detail}")


DESPAWN_OK = "world.despawn.ok"
"""The kind of the shard's answer to ``world.despawn`` (docs/contracts.md, "Gateway command plane")."""

DESPAWN_LISTS = ("removed", "gone", "refused")
"""``world.despawn.ok``'s three lists of serials: ``removed`` found and deleted, ``gone`` owned
but already absent (a player killed it: a success), ``refused`` never this run's."""


def despawn_answer(reply: Any, serial: str) -> Outcome:
    """Classify the gateway's reply to ``world.despawn {runId, serials: [serial]}`` for that one
    serial (:func:`despawn_answers` of a batch of one)."""
    return despawn_answers(reply, [serial])[serial]


def despawn_answers(reply: Any, serials: list[str]) -> dict[str, Outcome]:
    """Classify the gateway's reply to ``world.despawn {runId, serials}`` for each serial sent
    (one answer listing every serial under ``removed``, ``gone`` or ``refused``:
    docs/contracts.md, "Gateway command plane").

    A serial under ``removed`` or ``gone`` is given back; under ``refused`` alone it fails with
    the reason; under both a success list and ``refused``, or under none of the three, it fails
    quoting the answer. An answer that is not a usable ``world.despawn.ok`` at all (not a 200,
    no body, another kind, a list that is not a list) is the same outcome for every serial it
    was asked about: a 503/504 of the gateway is ``away`` for all of them, a 425/429 ``transient``
    for all of them, anything else ``failed`` for all of them."""
    what = "world.despawn"
    body = _payload(what, reply, in_body=True)
    if isinstance(body, Outcome):
        return dict.fromkeys(serials, body)
    kind = body.get("kind")
    if kind != DESPAWN_OK:
        shown = "no 'kind'" if kind is None else f"kind {quoted(kind)}"
        return dict.fromkeys(serials, Outcome(Verdict.FAILED, f"{what} answered 200 with {shown} (expected "
                                                              f"{DESPAWN_OK}): {preview(body)}"))
    lists: dict[str, set[str]] = {}
    for name in DESPAWN_LISTS:
        value = body.get(name, [])
        if not isinstance(value, list):
            return dict.fromkeys(serials, Outcome(Verdict.FAILED, f"{what} answer's {name!r} is not a list of "
                                                                  f"serials: {preview(body)}"))
        # Only strings can name a serial; anything else in a list names nothing (and a set
        # keeps a batch of a thousand serials linear).
        lists[name] = {item for item in value if isinstance(item, str)}
    return {serial: _one_serial(what, serial, lists, body) for serial in serials}


def _one_serial(what: str, serial: str, lists: dict[str, set[str]], body: dict[str, Any]) -> Outcome:
    named = [name for name in DESPAWN_LISTS if serial in lists[name]]
    if named == ["refused"]:
        return Outcome(Verdict.FAILED, f"the shard refused the despawn of {serial}: it says the object was never "
                                       "this run's; check who owns it before resolving the row by hand")
    if named and "refused" not in named:
        return Outcome(Verdict.REVERTED)
    if named:
        return Outcome(Verdict.FAILED, f"{what} answer names {serial} as both given back and refused "
                                       f"({', '.join(named)}): {preview(body)}")
    return Outcome(Verdict.FAILED, f"{what} answer does not name {serial} under removed, gone or refused: "
                                   f"{preview(body)}")


LEASE_OK = "lease.ok"
"""The shard's answer to a release that put the baseline back (docs/contracts.md, "Gateway command plane")."""

LEASE_DRIFTED = "lease.drifted"
"""The shard's answer to a release it declined: somebody changed the value
(docs/contracts.md, "Gateway command plane")."""


def release_answer(reply: Any, key: str | None = None) -> Outcome:
    """Classify the gateway's reply to ``lease.release`` of ``key``."""
    what = "lease.release"
    body = _payload(what, reply, in_body=True)
    if isinstance(body, Outcome):
        return body
    kind = body.get("kind")
    answered_key = body.get("key")
    if kind in (LEASE_OK, LEASE_DRIFTED) and key is not None and answered_key is not None and answered_key != key:
        return Outcome(Verdict.FAILED, f"{what} of {quoted(key)} answered about another key "
                                       f"{quoted(answered_key)}: {preview(body)}")
    if kind == LEASE_OK:
        return Outcome(Verdict.REVERTED)
    if kind == LEASE_DRIFTED:
        current = body.get("current")
        shown = "unknown" if current is None else quoted(current)
        return Outcome(Verdict.DRIFTED, f"somebody changed the leased value (now {shown}); "
                                        "left alone so their change stands")
    if kind is None:
        return Outcome(Verdict.FAILED, f"{what} answer has no 'kind' (expected {LEASE_OK} or "
                                       f"{LEASE_DRIFTED}): {preview(body)}")
    return Outcome(Verdict.FAILED, f"{what} answered an unknown kind {quoted(kind)} "
                                   f"(expected {LEASE_OK} or {LEASE_DRIFTED}): {preview(body)}")


def module_answer(module: str, reply: Any) -> Outcome:
    """Classify a module's reply to ``modules.<module>.revert``."""
    what = f"module {module!r} revert"
    answer = _payload(what, reply, in_body=False)
    if isinstance(answer, Outcome):
        return answer
    result = answer.get("result")
    if result in GIVEN_BACK:
        return Outcome(Verdict.REVERTED)
    if result == "drifted":
        reason = answer.get("reason") or "the module says somebody changed it"
        return Outcome(Verdict.DRIFTED, f"{reason}; left alone so their change stands")
    if result == "refused":
        reason = answer.get("reason") or "no reason given"
        return Outcome(Verdict.FAILED, f"module {module!r} refused the revert: {reason}")
    if result is None:
        return Outcome(Verdict.FAILED, f"{what} answer has no 'result' (expected removed, gone, drifted "
                                       f"or refused): {preview(answer)}")
    return Outcome(Verdict.FAILED, f"{what} answered an unknown result {quoted(result)} "
                                   "(expected removed, gone, drifted or refused)")


def no_gateway(shard: str) -> Outcome:
    """Nobody answers the shard's command subject: no gateway holds the shard (like a 503)."""
    return Outcome(Verdict.AWAY, f"no gateway holds shard {shard!r} (503): the shard is not connected, or no "
                                 "gateway is running")


def no_answer(what: str, timeout_s: float) -> Outcome:
    """No answer in time (or NATS unreachable): like a 504, try again after a back-off."""
    return Outcome(Verdict.AWAY, f"{what} did not answer within {timeout_s:g} s (504)")


def no_module(module: str, subject: str) -> Outcome:
    """No module answers its revert subject: nobody to give such rows back to now; the sweep
    tries again after a back-off, without spending an attempt."""
    return Outcome(Verdict.AWAY, f"nothing answers {subject}: module {module!r} is not running or does not "
                                 "implement revert; start it, and the sweep gives its rows back")
