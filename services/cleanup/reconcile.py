"""Reconcile: compare the ledger's live rows with what the shard says still exists.

For each module, its live rows are grouped by run; the run's shard is asked what the run
still owns — ``world.owned {runId}`` for world objects (``world.owned.ok``'s ``owned``),
``lease.list`` for leases (``lease.list.ok``'s ``holds``, asked once per shard per module;
both in docs/contracts.md, "Gateway command plane") — and the ledger told which refs are present
(``ledger.reconcile.<module>``): its confirmed rows of that run and kind the shard no longer
lists become ``orphaned``.

A lease whose hold the shard lists ``expired: true`` is the game ending it at its deadline,
as it was told to: the shard restored the baseline by itself and keeps the hold listed until
teardown collects it, precisely so that a reconcile in that window does not write a working
backstop off as orphaned (docs/cleanup.md, "Reconcile"). Such a row is reported present and recorded as
``expired`` through the module's expiry request (``ledger.expired.<module>``), never orphaned.

A shard that does not answer in time (or answers anything but a well-formed 200 of the kind
asked for) is counted as unanswered and its rows are left exactly as they are: silence is
not evidence that something is gone.

``reconcile_all`` is the website seed's ``reconcileAll``: every module owning a live row
(``ledger.live.modules``, its ``modulesWithLiveRows``), plus any configured ones.

A module's live rows are read page after page (``ledger.live``'s ``next``: one page is at most
one NATS message), keeping of each row only what the comparison needs.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from services.cleanup import classify
from services.cleanup.giveback import LEASE_KIND, WORLD_KINDS
from services.cleanup.ledger_client import LedgerClient, LedgerError
from services.cleanup.requester import Requester
from shared import subjects
from shared.contracts import ledger as ledger_contract
from shared.contracts.ids import is_shard_id
from shared.errors import ShardbusError
from shared.nats_calls import NatsAway, NoAnswer, NoResponders

REF_MAX = ledger_contract.REF_MAX
"""The ledger's longest ref: a serial the shard lists that is longer (or holds what PostgreSQL
cannot store) names no row, and is not sent back as present (the ledger would refuse it)."""

log = logging.getLogger("shardbus.cleanup.reconcile")

OWNED_OK = "world.owned.ok"
"""The kind of the shard's answer to ``world.owned`` (docs/contracts.md, "Gateway command plane")."""

LEASE_LIST_OK = "lease.list.ok"
"""The kind of the shard's answer to ``lease.list`` (docs/contracts.md, "Gateway command plane")."""


class Unanswered(ShardbusError):
    """The shard gave no usable answer; the sentence says why."""

    status = HTTPStatus.BAD_GATEWAY


@dataclass
class ModuleReport:
    """What one reconcile found for one module."""

    runs: int = 0
    orphaned: int = 0
    expired: int = 0
    skipped: int = 0
    unanswered: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"runs": self.runs, "orphaned": self.orphaned, "expired": self.expired,
                "skipped": self.skipped, "unanswered": self.unanswered}


@dataclass
class ReconcileReport:
    """What one reconcile did: totals, each module's share, and every run left unanswered."""

    modules: int = 0
    runs: int = 0
    orphaned: int = 0
    expired: int = 0
    skipped: int = 0
    unanswered: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    by_module: dict[str, ModuleReport] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The report as a reply's fields."""
        return {"modules": self.modules, "runs": self.runs, "orphaned": self.orphaned, "expired": self.expired,
                "skipped": self.skipped, "unanswered": self.unanswered, "errors": self.errors,
                "byModule": {name: part.to_dict() for name, part in self.by_module.items()}}


class Reconciler:
    """Runs reconciles over a :class:`Requester`; ``shard_of`` names a run's shard."""

    def __init__(self, requester: Requester, ledger: LedgerClient, shard_of: Callable[[str], Awaitable[str]],
                 timeout_s: float) -> None:
        self.requester, self.ledger, self.shard_of, self.timeout_s = requester, ledger, shard_of, timeout_s

    async def modules_to_reconcile(self, configured: list[str] | None = None) -> list[str]:
        """Every module owning a live row (the ledger says which), and the ``configured`` ones;
        :class:`LedgerError` when the ledger cannot say."""
        return sorted(set(await self.ledger.live_modules()) | set(configured or ()))

    async def reconcile_all(self, configured: list[str] | None = None) -> ReconcileReport:
        """Reconcile every module owning a live row (and the ``configured`` ones)."""
        return await self.reconcile(await self.modules_to_reconcile(configured))

    async def reconcile(self, modules: list[str]) -> ReconcileReport:
        """Reconcile every module named (each one's failure leaves the others going)."""
        report = ReconcileReport()
        for module in dict.fromkeys(modules):
            part = report.by_module.setdefault(module, ModuleReport())
            try:
                await self._module(module, report, part)
            except LedgerError as exc:
                report.errors.append(f"module {module!r}: {exc}")
                log.warning("reconcile of a module stopped: the ledger failed",
                            extra={"module": module, "reason": str(exc)})
        for name in ("runs", "orphaned", "expired", "skipped"):
            setattr(report, name, sum(getattr(part, name) for part in report.by_module.values()))
        return report

    async def _module(self, module: str, report: ReconcileReport, part: ModuleReport) -> None:
        by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
        holds: dict[str, list[dict[str, Any]] | Unanswered] = {}  # each shard's lease holds, asked once
        async for rows in self.ledger.live_pages(module):
            for row in rows:
                if isinstance(row, dict) and isinstance(row.get("runId"), str) and isinstance(row.get("ref"), str):
                    by_run[row["runId"]].append(_essentials(row))
        report.modules += 1
        for run_id, run_rows in by_run.items():
            part.runs += 1
            shard = await self.shard_of(run_id)
            kinds = {row.get("kind") for row in run_rows}
            part.skipped += sum(1 for row in run_rows if row.get("kind") not in WORLD_KINDS | {LEASE_KIND})
            try:
                if kinds & WORLD_KINDS:
                    await self._world_rows(module, run_id, shard, kinds, part)
                if LEASE_KIND in kinds:
                    await self._lease_rows(module, run_id, shard, run_rows, await self._holds_once(shard, holds), part)
            except Unanswered as exc:
                part.unanswered += 1
                report.unanswered.append({"module": module, "runId": run_id, "shard": shard, "reason": str(exc)})

    async def _world_rows(self, module: str, run_id: str, shard: str, kinds: set[Any], part: ModuleReport) -> None:
        """A run's world objects: those the shard no longer says it owns are orphaned."""
        present = [serial for serial in await self._world_owned(shard, run_id) if _may_be_ref(serial)]
        for kind in sorted(WORLD_KINDS.intersection(kinds)):
            part.orphaned += await self.ledger.reconcile(module, run_id, kind, present)

    async def _holds_once(self, shard: str, holds: dict[str, list[dict[str, Any]] | Unanswered]
                          ) -> list[dict[str, Any]]:
        """The shard's lease holds, asked once a module (an unanswered ask is remembered too)."""
        if shard not in holds:
            try:
                holds[shard] = await self._lease_holds(shard)
            except Unanswered as exc:
                holds[shard] = exc
        shard_holds = holds[shard]
        if isinstance(shard_holds, Unanswered):
            raise Unanswered(str(shard_holds))
        return shard_holds

    async def _lease_rows(self, module: str, run_id: str, shard: str, run_rows: list[dict[str, Any]],
                          shard_holds: list[dict[str, Any]], part: ModuleReport) -> None:
        """A run's leases against the shard's holds: expired ones marked, unheld ones orphaned."""
        present, expired = [], []
        for row in run_rows:
            if row.get("kind") != LEASE_KIND:
                continue
            if row.get("revertOmitted") is not None:
                # Its revert (written before the ledger's cap) was too large to be sent: without
                # its key and target it cannot be matched to a hold, and "not found" would orphan
                # it on no evidence. Left as it is.
                present.append(row["ref"])
                part.skipped += 1
                continue
            hold = _hold_of(row, run_id, shard_holds)
            if hold is not None:
                present.append(row["ref"])
                if hold.get("expired") is True:
                    expired.append(row["ref"])
        # Expired first: a row the game ended on time is never orphaned, not even for a moment
        # (the reconcile below leaves it alone, being listed present).
        for ref in expired:
            part.expired += await self.ledger.expired(module, LEASE_KIND, ref)
        part.orphaned += await self.ledger.reconcile(module, run_id, LEASE_KIND, present)

    async def _ask(self, shard: str, verb: str, payload: dict[str, Any], kind: str) -> dict[str, Any]:
        """The body of a 200 answer of ``kind``, or :class:`Unanswered`."""
        if not is_shard_id(shard):
            raise Unanswered(f"the run names no valid shard ({shard!r})")
        try:
            reply = await self.requester.request(subjects.command(shard, verb), payload, self.timeout_s)
        except NoResponders:
            raise Unanswered(classify.no_gateway(shard).reason) from None
        except (NoAnswer, NatsAway):  # NATS away: a kind of no answer
            raise Unanswered(classify.no_answer(verb, self.timeout_s).reason) from None
        if not isinstance(reply, dict) or reply.get("status") != HTTPStatus.OK:
            raise Unanswered(f"{verb} answered {classify.preview(reply)}")
        body = reply.get("body")
        if not isinstance(body, dict) or body.get("kind") != kind:
            raise Unanswered(f"{verb} answered 200 without a {kind} body: {classify.preview(reply)}")
        return body

    async def _world_owned(self, shard: str, run_id: str) -> list[str]:
        """The serials the shard says ``run_id`` still owns."""
        body = await self._ask(shard, "world.owned", {"runId": run_id}, OWNED_OK)
        if "runId" in body and str(body["runId"]) != run_id:
            raise Unanswered(f"world.owned for run {run_id!r} answered about run {classify.quoted(body['runId'])}")
        owned = body.get("owned")
        serials = [_serial(item) for item in owned] if isinstance(owned, list) else [None]
        if None in serials:
            raise Unanswered(f"world.owned answered without a list of owned serials: {classify.preview(body)}")
        return [serial for serial in serials if serial is not None]

    async def _lease_holds(self, shard: str) -> list[dict[str, Any]]:
        """Every lease the shard holds (``lease.list.ok``'s ``holds``)."""
        body = await self._ask(shard, "lease.list", {}, LEASE_LIST_OK)
        holds = body.get("holds")
        if not isinstance(holds, list) or not all(isinstance(hold, dict) for hold in holds):
            raise Unanswered(f"lease.list answered without a list of holds: {classify.preview(body)}")
        return holds


def _essentials(row: dict[str, Any]) -> dict[str, Any]:
    """What a reconcile needs of a live row (a lease's revert key and target, not the rest of
    its revert): a module's rows are held in memory until every page is read."""
    kept = {name: row.get(name) for name in ("runId", "kind", "ref", "revertOmitted")}
    revert = row.get("revert")
    if row.get("kind") == LEASE_KIND and isinstance(revert, dict):
        kept["revert"] = {name: revert[name] for name in ("key", "target") if name in revert}
    return kept


def _may_be_ref(serial: str) -> bool:
    """Whether a serial the shard lists could be a ledger row's ref (the ledger refuses the rest)."""
    if not 0 < len(serial) <= REF_MAX or "\x00" in serial:
        return False
    try:
        serial.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _serial(item: Any) -> str | None:
    """An ``owned`` element's serial: ``{"serial", "what"}`` or a plain serial."""
    if isinstance(item, dict):
        item = item.get("serial")
    return item if isinstance(item, str) and item else None


def _target(value: Any) -> str | None:
    """A lease target as compared: absent and empty are no target (the shard omits it then)."""
    return None if value is None or value == "" else str(value)


def _hold_of(row: dict[str, Any], run_id: str, holds: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The hold the shard lists for this row's lease: its key and target, and its run when the
    hold names one. None when the shard no longer holds it."""
    revert = row.get("revert")
    if not isinstance(revert, dict):
        revert = {}
    key, target = revert.get("key", row.get("ref")), _target(revert.get("target"))
    for hold in holds:
        if hold.get("key") != key or _target(hold.get("target")) != target:
            continue
        if hold.get("runId") is not None and str(hold["runId"]) != run_id:
            continue
        return hold
    return None
