"""How claimed resource rows are given back (docs/cleanup.md, "A sweep", step 3).

World objects go back with the shard's ``world.despawn {runId, serials: [...]}``, the way the
seed's shard takes them (docs/cleanup.md, "A sweep"): every world-object row of one run in one
claimed batch in ONE command carrying all their serials (:func:`despawns`; split only when the
line would exceed :data:`DESPAWN_MAX_BYTES`), each row's outcome read from that one answer for
its own serial. Leases go back with ``lease.release {key, target?, expected, baseline}``
(docs/contracts.md, "Gateway command plane"), which takes one key per call, so one command per
row; anything else through the owning module's own ``modules.<module>.revert``, one per row.

Every command carries an idempotency key derived from what it gives back alone — a row's from
the run and the row (:func:`idempotency_key`), a despawn's from the run and the sorted resource
ids it carries (:func:`batch_key`) — so a retry, a second replica or a sweeper that crashed
mid-revert sends the *same* key for the same rows and the shard answers the repeat from its
cache instead of acting twice.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from services.cleanup import classify
from services.cleanup.classify import Outcome, Verdict
from services.cleanup.requester import Requester
from shared import subjects
from shared.contracts.ids import is_shard_id
from shared.nats_calls import NatsAway, NoAnswer, NoResponders

WORLD_KINDS = frozenset({"creature", "boss", "npc", "gate", "decor"})
"""Resource kinds that are world objects (what ``world.spawn`` makes): despawned."""

LEASE_KIND = "lease"
"""The resource kind of a borrowed config value: released with expected and baseline."""


DESPAWN_MAX_BYTES = 64 * 1024
"""The most bytes one ``world.despawn`` command's JSON body may take before the sweep splits the
run's serials over several commands. Well under the gateway's cap on a line (its
``max_line_bytes``, 1 MiB by default, which an operator may lower) and NATS's default payload
cap (1 MiB), with room for what the gateway adds (``kind``, ``reqId``) and for the answer, which
lists every serial again under ``removed``/``gone``/``refused`` with the shard's own framing.
Defined here rather than read from the gateway: cleanup only meets the gateway on NATS. A claim
of 1,000 rows of ordinary serials (``"0x40001234"``, 13 bytes each in the list) is about 13 KB:
one command; only refs near the ledger's 190-character cap split a full claim."""

BATCH_KEY_DIGEST_CHARS = 32
"""Hex characters of the SHA-256 of the sorted resource ids in a despawn's key (128 bits)."""


def idempotency_key(run_id: str, resource_id: int) -> str:
    """The key every give-back of this row carries, whoever sends it and however often."""
    return f"cleanup:{run_id}:{resource_id}"


def batch_key(run_id: str, resource_ids: Iterable[int]) -> str:
    """The key of a ``world.despawn`` giving back these rows of ``run_id``: the same whenever the
    same set is sent again (a retry after a lost reply, a second replica, a sweeper reclaiming the
    rows of one that crashed), whatever order the rows came in, so the shard answers the repeat
    from its cache.

    One row keeps the row's own key (:func:`idempotency_key`, what a despawn carried before
    despawns were batched: a row sent by an older sweeper is still a replay). Several rows:
    ``cleanup:<runId>:despawn:<count>:<first 32 hex of SHA-256 of the sorted ids, comma-joined>``.
    A hash, because the ids themselves would make a key as long as the batch; 128 bits, so two
    different sets of one run never share a key. At most 8 + 64 (the longest run id) + 9 + 4 +
    1 + 32 = 118 characters: within every limit a key meets on the way — the gateway passes it
    through untouched, the seed's sidecar neither makes nor checks one (docs/gateway.md, "Commands"), the
    shard only compares it, and the ledger's own keys may take 200 (IDEMPOTENCY_KEY_MAX)."""
    ids = sorted(set(resource_ids))
    if len(ids) == 1:
        return idempotency_key(run_id, ids[0])
    digest = hashlib.sha256(",".join(str(i) for i in ids).encode()).hexdigest()[:BATCH_KEY_DIGEST_CHARS]
    return f"cleanup:{run_id}:despawn:{len(ids)}:{digest}"


@dataclass(frozen=True)
class Despawn:
    """One ``world.despawn`` ready to send: every serial of some world-object rows of one run."""

    subject: str
    payload: dict[str, Any]
    rows: tuple[dict[str, Any], ...]
    """The rows it gives back (rows naming one serial travel together)."""
    nobody: Outcome

    @property
    def serials(self) -> list[str]:
        serials: list[str] = self.payload["serials"]
        return serials


def _encoded_len(value: Any) -> int:
    """Bytes of ``value`` as the requester sends it (compact JSON, ASCII)."""
    return len(json.dumps(value, separators=(",", ":")))


def despawns(run_id: str, rows: list[dict[str, Any]], shard: str,
             max_bytes: int = DESPAWN_MAX_BYTES) -> list[Despawn]:
    """The ``world.despawn`` commands that give back ``rows`` (world objects of ``run_id`` on a
    valid ``shard``): one carrying every serial, or — only when its body would exceed
    ``max_bytes`` — several, each as full as the budget allows. Deterministic for a set of rows
    (ordered by resource id, rows sharing a serial kept in one command), so a batch sent again
    is split the same way under the same keys. A serial too long for the budget on its own is
    sent alone."""
    by_serial: dict[str, list[dict[str, Any]]] = {}
    for row in sorted(rows, key=lambda r: r["resourceId"]):
        by_serial.setdefault(row["ref"], []).append(row)
    # Room for the body around the serials, with the longest key this batch could carry.
    longest_key = f"cleanup:{run_id}:despawn:{len(rows)}:{'0' * BATCH_KEY_DIGEST_CHARS}"
    frame = _encoded_len({"runId": run_id, "serials": [], "idempotencyKey": longest_key})
    chunks: list[list[str]] = [[]]
    size = frame
    for serial in by_serial:
        cost = _encoded_len(serial) + (1 if chunks[-1] else 0)
        if chunks[-1] and size + cost > max_bytes:
            chunks.append([])
            size, cost = frame, cost - 1
        chunks[-1].append(serial)
        size += cost
    subject, nobody = subjects.command(shard, "world.despawn"), classify.no_gateway(shard)
    out = []
    for serials in chunks:
        if not serials:
            continue
        chunk_rows = tuple(row for serial in serials for row in by_serial[serial])
        key = batch_key(run_id, (row["resourceId"] for row in chunk_rows))
        out.append(Despawn(subject, {"runId": run_id, "serials": serials, "idempotencyKey": key}, chunk_rows,
                           nobody))
    return out


async def despawn(requester: Requester, command: Despawn, timeout_s: float) -> dict[str, Outcome]:
    """Send one ``world.despawn``; each serial's outcome, read from its one answer (never raises
    for an answer: nobody there is ``away`` for every serial, as a garbled answer is ``failed``
    for every serial)."""
    try:
        reply = await requester.request(command.subject, command.payload, timeout_s)
    except NoResponders:
        return dict.fromkeys(command.serials, command.nobody)
    except (NoAnswer, NatsAway):  # NATS away: a kind of no answer
        return dict.fromkeys(command.serials, classify.no_answer("world.despawn", timeout_s))
    return classify.despawn_answers(reply, command.serials)


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
        # One row alone: a despawn of its one serial (the sweep sends a run's rows together:
        # :func:`despawns`), under the row's own key (:func:`batch_key` of one id).
        serial = row["ref"]
        return Command(subjects.command(shard, "world.despawn"),
                       {"runId": run_id, "serials": [serial], "idempotencyKey": batch_key(run_id, [resource_id])},
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


async def send(requester: Requester, command: Command, timeout_s: float) -> Outcome:
    """Send ``command`` and classify whatever comes back (never raises for an answer)."""
    try:
        reply = await requester.request(command.subject, command.payload, timeout_s)
    except NoResponders:
        return command.nobody
    except (NoAnswer, NatsAway):  # NATS away: a kind of no answer
        return classify.no_answer(command.what, timeout_s)
    return command.read(reply)


async def give_back(requester: Requester, row: dict[str, Any], shard: str, timeout_s: float) -> Outcome:
    """Give ``row`` back and say what became of it."""
    command = plan(row, shard)
    if isinstance(command, Outcome):
        return command
    return await send(requester, command, timeout_s)
