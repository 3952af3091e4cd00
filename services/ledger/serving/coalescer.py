"""Coalescing requests of one kind into one statement.

While a statement of one subject is in flight, the requests that arrive for that subject wait;
when it is done they go together, as one batch, into the next (at most ``batch_max`` a batch).
A lone request runs on the single-row path as before: coalescing costs nothing when the
ledger is quiet, and under load one statement carries many changes (issue 15, ADR 5).

The coalescer knows nothing of SQL: it is given two functions. ``run_batch`` applies a batch
in one statement and says, per request, what it answered, or :data:`UNCHANGED` for a request
the batch did not change (a replay, a conflict, an unknown id: the single-row path explains
it). ``run_one`` is the single-row path. A batch that raises retries each of its requests alone
(one bad request must not fail the others), unless ``fails_all`` says its failure is everyone's
(the database away): then every request of the batch, and every one waiting for the next
statement, gets that failure at once, rather than waiting in turn for statements bound to fail
the same way. So while the database is away a request waits for one statement at most
(docs/reliability.md, "PostgreSQL").
Requests that a batch must not hold together (two on one row, one target) are split by
``key``: the later ones wait for the batch and then run alone. So every request is answered by
exactly one committed statement, and each change still commits with its log entry."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar

from shared.metrics import Buckets

log = logging.getLogger("shardbus.ledger.coalescer")

BATCH_SIZE_BOUNDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
"""Upper bounds of the requests-per-statement histogram (``shardbus_ledger_batch_size``)."""

Request = TypeVar("Request")
Result = TypeVar("Result")


class _Unchanged:
    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED: Final = _Unchanged()
"""What ``run_batch`` says of a request its statement did not change."""


@dataclass
class CoalescerStats:
    """What one coalescer did since it started (the ledger's health reply carries them)."""

    requests: int = 0
    """Requests submitted."""
    batches: int = 0
    """Statements that carried more than one request."""
    batched: int = 0
    """Requests answered by such a statement."""
    largest: int = 0
    """The most requests one statement carried."""
    alone: int = 0
    """Requests run on the single-row path: lone ones, and the rest below."""
    unchanged: int = 0
    """Requests a batch did not change, then answered alone (replays, conflicts, unknown ids)."""
    split: int = 0
    """Requests held out of a batch because an earlier one in it had the same key."""
    failed_batches: int = 0
    """Batches whose statement raised; each of their requests was retried alone."""

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class _Waiting(Generic[Request, Result]):
    request: Request
    answer: asyncio.Future[Result] = field(repr=False)


class Coalescer(Generic[Request, Result]):
    """One subject's coalescer: :meth:`submit` a request, await its result. At most
    ``in_flight_max`` of its statements run at once; requests arriving meanwhile wait for one
    to finish and then go together."""

    def __init__(self, name: str, run_batch: Callable[[Sequence[Request]], Awaitable[Sequence[Result | _Unchanged]]],
                 run_one: Callable[[Request], Awaitable[Result]], key: Callable[[Request], Sequence[Hashable]],
                 batch_max: int, in_flight_max: int = 1,
                 fails_all: Callable[[BaseException], bool] = lambda exc: False) -> None:
        if batch_max < 1 or in_flight_max < 1:
            raise ValueError(f"batch_max and in_flight_max must be at least 1, not {batch_max} and {in_flight_max}")
        self.name = name
        self.batch_max = batch_max
        self.in_flight_max = in_flight_max
        self.stats = CoalescerStats()
        self.sizes = Buckets(BATCH_SIZE_BOUNDS)
        """Requests per statement (the ledger's metrics)."""
        self._run_batch = run_batch
        self._run_one = run_one
        self._key = key
        self._fails_all = fails_all
        self._waiting: list[_Waiting[Request, Result]] = []
        self._in_flight = 0
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def waiting(self) -> int:
        """Requests submitted and not yet taken into a statement."""
        return len(self._waiting)

    async def submit(self, request: Request) -> Result:
        """``request``'s result, from whichever statement carries it (its exception, if that fails)."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Result] = loop.create_future()
        self._waiting.append(_Waiting(request, answer))
        self.stats.requests += 1
        if not self._scheduled:
            # At the end of this turn of the loop, not now: requests submitted in the same turn join.
            self._scheduled = True
            loop.call_soon(self._dispatch)
        return await answer

    def _dispatch(self) -> None:
        self._scheduled = False
        while self._waiting and self._in_flight < self.in_flight_max:
            taken, self._waiting = self._waiting[:self.batch_max], self._waiting[self.batch_max:]
            batch, held = self._split(taken)
            if batch:
                self._in_flight += 1
                self._spawn(self._statement(batch, held))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work, name=f"coalescer-{self.name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _split(self, taken: list[_Waiting[Request, Result]]) -> tuple[list[_Waiting[Request, Result]],
                                                                      list[_Waiting[Request, Result]]]:
        """The requests that may share a statement, and those whose key an earlier one has."""
        seen: set[Hashable] = set()
        batch, held = [], []
        for waiting in taken:
            if waiting.answer.done():  # its caller gave up (cancelled): nothing to run
                continue
            keys = self._key(waiting.request)
            if seen.isdisjoint(keys):
                seen.update(keys)
                batch.append(waiting)
            else:
                held.append(waiting)
        self.stats.split += len(held)
        return batch, held

    async def _statement(self, batch: list[_Waiting[Request, Result]], held: list[_Waiting[Request, Result]]) -> None:
        self.sizes.observe(len(batch))
        try:
            if len(batch) == 1:
                await self._one(batch[0])
            else:
                await self._batch(batch)
        finally:
            self._in_flight -= 1
            for waiting in held:  # after the batch that holds their key: each alone
                self._spawn(self._one(waiting))
            self._dispatch()

    async def _batch(self, batch: list[_Waiting[Request, Result]]) -> None:
        try:
            results = await self._run_batch([w.request for w in batch])
            if len(results) != len(batch):  # pragma: no cover - run_batch answers every request
                raise RuntimeError(f"{self.name}: {len(results)} results for a batch of {len(batch)}")
        except Exception as exc:  # noqa: BLE001 - any failure: each request is retried alone
            self.stats.failed_batches += 1
            if self._fails_all(exc):
                self._fail_everyone(batch, exc)
                return
            log.info("a batch failed; each of its requests is retried alone",
                     extra={"subject": self.name, "requests": len(batch), "reason": type(exc).__name__})
            for waiting in batch:
                self._spawn(self._one(waiting))
            return
        self.stats.batches += 1
        self.stats.largest = max(self.stats.largest, len(batch))
        for waiting, result in zip(batch, results, strict=True):
            if isinstance(result, _Unchanged):
                self.stats.unchanged += 1
                self._spawn(self._one(waiting))
            else:
                self.stats.batched += 1
                if not waiting.answer.done():
                    waiting.answer.set_result(result)

    async def _one(self, waiting: _Waiting[Request, Result]) -> None:
        """The single-row path for one request."""
        if waiting.answer.done():
            return
        self.stats.alone += 1
        try:
            result = await self._run_one(waiting.request)
        except Exception as exc:  # noqa: BLE001 - the request's own failure is its answer
            if self._fails_all(exc):
                self._fail_everyone([waiting], exc)
            elif not waiting.answer.done():
                waiting.answer.set_exception(exc)
        else:
            if not waiting.answer.done():
                waiting.answer.set_result(result)

    def _fail_everyone(self, failed: list[_Waiting[Request, Result]], exc: Exception) -> None:
        """``exc`` is every request's answer: those of the failed statement and all waiting."""
        everyone, self._waiting = failed + self._waiting, []
        log.info("a statement failed for every request; each waiting is answered with that failure",
                 extra={"subject": self.name, "requests": len(everyone), "reason": type(exc).__name__})
        for waiting in everyone:
            if not waiting.answer.done():
                waiting.answer.set_exception(exc)

    async def stop(self) -> None:
        """Wait for the statements in flight (a stopping ledger lets its requests finish)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
