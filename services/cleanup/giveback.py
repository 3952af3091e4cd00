"""How one claimed resource row is given back (SPEC section 4, step 2).

World objects go back with the shard's ``world.despawn {runId, serials: [ref]}`` (one row,
one serial: its answer is read for that serial alone), leases with ``lease.release
{key, target?, expected, baseline}`` (S004:1186), anything else through the owning module's
own ``modules.<module>.revert``. Every command carries an idempotency key derived from the row
alone, so a retry, a second replica or a sweeper that crashed mid-revert sends the *same*
key and the shard answers the repeat from its cache instead of acting twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from services.cleanup import classify
from services.cleanup.classify import Outcome, Verdict
from services.cleanup.port import NoAnswer, NoResponder, Port
from shared import subjects
from shared.contracts.ids import is_shard_id

WORLD_KINDS = frozenset({"creature", "boss", "npc", "gate", "decor"})
"""Resource kinds that are world objects (what ``world.spawn`` makes): despawned."""

LEASE_KIND = "lease"
"""The resource kind of a borrowed config value: released with expected and baseline."""


def idempotency_key(run_id: str, resource_id: int) -> str:
    """The key every give-back of this row carries, whoever sends it and however often."""
    return f"cleanup:{run_id}:{resource_id}"


@dataclass(frozen=True)
class Command:
    """A give-back ready to send: where, what, and how to read the answer."""

    subject: str
    payload: dict[str, Any]
    what: str
    read: Callable[[Any], Outcome]
    nobody: Outcome


def plan(row: dict[str, Any], shard: str) -> Command | Outcome:
    """The command that gives ``row`` back, or a failed outcome saying why there is none."""
    run_id, resource_id, kind = row["runId"], row["resourceId"], row["kind"]
    key = idempotency_key(run_id, resource_id)
    if (kind in WORLD_KINDS or kind == LEASE_KIND) and not is_shard_id(shard):
        return Outcome(Verdict.FAILED, f"run {run_id!r} names no valid shard ({shard!r}); "
                                       "cannot send the give-back anywhere")
    if kind in WORLD_KINDS:
        serial = row["ref"]
        return Command(subjects.command(shard, "world.despawn"),
                       {"runId": run_id, "serials": [serial], "idempotencyKey": key},
                       "world.despawn", lambda reply: classify.despawn_answer(reply, serial),
                       classify.no_gateway(shard))
    if kind == LEASE_KIND:
        return _lease_release(row, shard, key)
    module = row["module"]
    subject = subjects.module_revert(module)
    return Command(subject,
                   {"runId": run_id, "kind": kind, "ref": row["ref"], "revert": row.get("revert") or {},
                    "idempotencyKey": key},
                   f"module {module!r} revert", lambda reply: classify.module_answer(module, reply),
                   classify.no_module(module, subject))


def _lease_release(row: dict[str, Any], shard: str, key: str) -> Command | Outcome:
    revert = row.get("revert")
    if not isinstance(revert, dict):
        return Outcome(Verdict.FAILED, "the lease's row holds no revert data (key, expected, baseline); "
                                       "restore the value by hand, then resolve the row")
    missing = [name for name in ("key", "expected", "baseline") if revert.get(name) is None]
    if missing:
        names = ", ".join(repr(m) for m in missing)
        return Outcome(Verdict.FAILED, f"the lease's revert data lacks {names}: without the value to restore "
                                       "and the value to expect the sweep cannot release it safely; "
                                       "restore it by hand, then resolve the row")
    payload = {"key": revert["key"], "expected": revert["expected"], "baseline": revert["baseline"],
               "idempotencyKey": key}
    if revert.get("target") is not None:
        payload["target"] = revert["target"]
    lease_key = revert["key"]
    return Command(subjects.command(shard, "lease.release"), payload, "lease.release",
                   lambda reply: classify.release_answer(reply, lease_key), classify.no_gateway(shard))


async def send(port: Port, command: Command, timeout_s: float) -> Outcome:
    """Send ``command`` and classify whatever comes back (never raises for an answer)."""
    try:
        reply = await port.request(command.subject, command.payload, timeout_s)
    except NoResponder:
        return command.nobody
    except NoAnswer:
        return classify.no_answer(command.what, timeout_s)
    return command.read(reply)


async def give_back(port: Port, row: dict[str, Any], shard: str, timeout_s: float) -> Outcome:
    """Give ``row`` back and say what became of it."""
    command = plan(row, shard)
    if isinstance(command, Outcome):
        return command
    return await send(port, command, timeout_s)
