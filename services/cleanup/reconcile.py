"""Reconcile: compare the ledger's live rows with what the shard says still exists.

For each module, its live rows are grouped by run; the run's shard is asked what the run
still owns (``world.owned`` for world objects, ``lease.list`` for leases) and the ledger
told which refs are present. The ledger turns the confirmed rows of that run and kind that
the shard no longer lists into ``orphaned``. A shard that does not answer in time (or
answers anything but a well-formed 200) is counted as unanswered and its rows are left
exactly as they are: silence is not evidence that something is gone.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from services.cleanup import classify
from services.cleanup.giveback import LEASE_KIND, WORLD_KINDS
from services.cleanup.ledger_client import LedgerClient, LedgerError
from services.cleanup.port import NoAnswer, NoResponder, Port
from shared import subjects

log = logging.getLogger("shardbus.cleanup.reconcile")


class Unanswered(Exception):
    """The shard gave no usable answer; the reason says why."""


@dataclass
class ReconcileReport:
    """What one reconcile did."""

    modules: int = 0
    runs: int = 0
    orphaned: int = 0
    skipped: int = 0
    unanswered: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The report as a reply's fields."""
        return {"modules": self.modules, "runs": self.runs, "orphaned": self.orphaned,
                "skipped": self.skipped, "unanswered": self.unanswered, "errors": self.errors}


class Reconciler:
    """Runs reconciles over a :class:`Port`; ``shard_of`` names a run's shard."""

    def __init__(self, port: Port, ledger: LedgerClient, shard_of, timeout_s: float) -> None:
        self.port, self.ledger, self.shard_of, self.timeout_s = port, ledger, shard_of, timeout_s

    async def reconcile(self, modules: list[str]) -> ReconcileReport:
        """Reconcile every module named (each one's failure leaves the others going)."""
        report = ReconcileReport()
        for module in modules:
            try:
                await self._module(module, report)
            except LedgerError as exc:
                report.errors.append(f"module {module!r}: {exc}")
                log.warning("reconcile of a module stopped: the ledger failed",
                            extra={"module": module, "reason": str(exc)})
        return report

    async def _module(self, module: str, report: ReconcileReport) -> None:
        rows = await self.ledger.live(module)
        report.modules += 1
        by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in rows:
            if isinstance(row, dict) and isinstance(row.get("runId"), str):
                by_run[row["runId"]].append(row)
        leases: dict[str, list[dict[str, Any]]] = {}  # lease.list of each shard, asked once
        for run_id, run_rows in by_run.items():
            report.runs += 1
            shard = await self.shard_of(run_id)
            kinds = {row.get("kind") for row in run_rows}
            report.skipped += sum(1 for row in run_rows if row.get("kind") not in WORLD_KINDS | {LEASE_KIND})
            try:
                if kinds & WORLD_KINDS:
                    present = await self._world_owned(shard, run_id)
                    for kind in sorted(kinds & WORLD_KINDS):
                        report.orphaned += await self.ledger.reconcile(module, run_id, kind, present)
                if LEASE_KIND in kinds:
                    if shard not in leases:
                        leases[shard] = await self._lease_list(shard)
                    present = [row["ref"] for row in run_rows
                               if row.get("kind") == LEASE_KIND and _lease_held(row, run_id, leases[shard])]
                    report.orphaned += await self.ledger.reconcile(module, run_id, LEASE_KIND, present)
            except Unanswered as exc:
                report.unanswered.append({"module": module, "runId": run_id, "shard": shard, "reason": str(exc)})

    async def _ask(self, shard: str, verb: str, payload: dict[str, Any]) -> list[dict[str, Any]]:
        """The ``items`` of a 200 answer, or :class:`Unanswered`."""
        if not subjects.is_shard_id(shard):
            raise Unanswered(f"the run names no valid shard ({shard!r})")
        try:
            reply = await self.port.request(subjects.command(shard, verb), payload, self.timeout_s)
        except NoResponder:
            raise Unanswered(classify.no_gateway(shard).reason) from None
        except NoAnswer:
            raise Unanswered(classify.no_answer(verb, self.timeout_s).reason) from None
        if not isinstance(reply, dict) or reply.get("status") != 200:
            raise Unanswered(f"{verb} answered {classify.preview(reply)}")
        body = reply.get("body")
        items = body.get("items") if isinstance(body, dict) else None
        if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
            raise Unanswered(f"{verb} answered without a list of items: {classify.preview(reply)}")
        return items

    async def _world_owned(self, shard: str, run_id: str) -> list[str]:
        items = await self._ask(shard, "world.owned", {"runId": run_id})
        return [str(item["ref"]) for item in items if item.get("ref") is not None]

    async def _lease_list(self, shard: str) -> list[dict[str, Any]]:
        return await self._ask(shard, "lease.list", {})


def _lease_held(row: dict[str, Any], run_id: str, items: list[dict[str, Any]]) -> bool:
    """Does the shard still list this run's lease of the row's key (and target)?"""
    revert = row.get("revert") if isinstance(row.get("revert"), dict) else {}
    key = revert.get("key", row.get("ref"))
    target = revert.get("target")
    return any(item.get("runId") == run_id and item.get("key") == key and item.get("target") == target
               for item in items)
