"""The ledger's hot subjects and their coalescers: reserve, record, confirm, fail and the one-row
give-back outcomes (reverted, drifted, failed), each request waiting for the next statement of
its kind (services/ledger/serving/coalescer.py) that ``batches.py`` writes for many and ``resources.py``
or ``sweep.py`` for one. ``ledger.sweep.outcomes`` is a batch already: it is served on the same
nats-py path (``dispatcher.py``) but needs no coalescer, as do a sweep's candidates, claim and
finish. Which path serves each subject is ``request_paths.SERVED``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any

from services.ledger import resources, statuses, sweep
from services.ledger.database.store import Change, Database, Json, is_unreachable
from services.ledger.serving import batches
from services.ledger.serving.coalescer import Coalescer
from services.ledger.statuses import Outcome
from shared.contracts import ledger as c
from shared.metrics import Buckets

Answer = tuple[Json, list[Change]]
OneOutcome = tuple[int, Outcome, str | None]


@dataclass(frozen=True)
class Batching:
    """How the hot subjects coalesce: at most ``batch_max`` requests a statement (1: none), at
    most ``in_flight_max`` statements of one kind at once."""

    batch_max: int = 64
    in_flight_max: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.batch_max <= c.OUTCOMES_MAX or self.in_flight_max < 1:
            raise ValueError(f"batch_max must be 1..{c.OUTCOMES_MAX} and in_flight_max at least 1")


def _outcome_key(given: OneOutcome) -> tuple[Hashable, ...]:
    return (given[0],)


class HotActions:
    """The hot subjects' actions (``(row, changes)`` from a request), each through its coalescer."""

    def __init__(self, db: Database, batching: Batching) -> None:
        def coalescer(name: str, run_batch: Callable[[Any], Awaitable[Any]], run_one: Callable[[Any], Awaitable[Any]],
                      key: Callable[[Any], tuple[Hashable, ...]]) -> Coalescer[Any, Answer]:
            return Coalescer(name, run_batch, run_one, key, batching.batch_max, batching.in_flight_max,
                             fails_all=is_unreachable)

        def add(confirmed: bool) -> Coalescer[Any, Answer]:
            async def one(body: c.AddResource) -> Answer:
                return await resources.add_resource(
                    db, run_id=body.run_id, module=body.module, kind=body.kind, ref=body.ref,
                    idempotency_key=body.idempotency_key, revert=body.revert, lease_deadline=body.lease_deadline,
                    confirmed=confirmed)

            async def many(bodies: list[c.AddResource]) -> list[Any]:
                return await batches.add_resources(db, bodies, confirmed)

            return coalescer("record" if confirmed else "reserve", many, one, batches.add_keys)

        def transition(step: statuses.Transition) -> Coalescer[Any, Answer]:
            async def one(body: c.ResourceRef | c.FailResource) -> Answer:
                return await resources.transition(db, body.resource_id, step, getattr(body, "error", None))

            async def many(bodies: list[c.ResourceRef | c.FailResource]) -> list[Any]:
                return await batches.transitions(db, [(b.resource_id, getattr(b, "error", None)) for b in bodies], step)

            return coalescer(step.name, many, one, batches.resource_keys)

        async def one_outcome(given: OneOutcome) -> Answer:
            return await sweep.one_outcome(db, *given)

        async def outcomes(given: list[OneOutcome]) -> list[Any]:
            return await batches.outcomes(db, given)

        self._reserve, self._record = add(confirmed=False), add(confirmed=True)
        self._confirm, self._fail = transition(statuses.CONFIRM), transition(statuses.FAIL)
        # One coalescer for the three one-row outcome subjects: OUTCOMES carries each row's rule.
        self._outcome = coalescer("outcome", outcomes, one_outcome, _outcome_key)

    async def reserve(self, body: c.AddResource) -> Answer:
        return await self._reserve.submit(body)

    async def record(self, body: c.AddResource) -> Answer:
        return await self._record.submit(body)

    async def confirm(self, body: c.ResourceRef) -> Answer:
        return await self._confirm.submit(body)

    async def fail(self, body: c.FailResource) -> Answer:
        return await self._fail.submit(body)

    async def outcome(self, resource_id: int, outcome: Outcome, error: str | None) -> Answer:
        return await self._outcome.submit((resource_id, outcome, error))

    def batch_sizes(self) -> dict[str, Buckets]:
        """Each coalescer's requests per statement, by its name."""
        return {co.name: co.sizes for co in (self._reserve, self._record, self._confirm, self._fail, self._outcome)}

    def stats(self) -> dict[str, dict[str, int]]:
        """Each coalescer's counts, by its name."""
        return {co.name: co.stats.as_dict()
                for co in (self._reserve, self._record, self._confirm, self._fail, self._outcome)}
