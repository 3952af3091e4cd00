"""The coalescer's rules, with plain functions standing in for the two statements: which requests
share a statement, which run alone, and that every request gets exactly its own answer whatever
the batch did (tests/ledger/test_batches.py runs the real statements)."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from services.ledger.database.store import DatabaseUnavailable, is_unreachable
from services.ledger.serving.coalescer import UNCHANGED, Coalescer


class Statements:
    """Records every statement it is asked to run; a batch answers ``n * 10`` for each request
    ``n`` (UNCHANGED for those in ``unchanged``), a lone request ``-n``."""

    def __init__(self, unchanged: frozenset[int] = frozenset(), batch_raises: bool = False,
                 one_raises: frozenset[int] = frozenset()) -> None:
        self.batches: list[list[int]] = []
        self.alone: list[int] = []
        self.unchanged = unchanged
        self.batch_raises = batch_raises
        self.one_raises = one_raises
        self.gate: asyncio.Event | None = None

    async def many(self, requests):
        self.batches.append(list(requests))
        if self.gate is not None:
            await self.gate.wait()
        if self.batch_raises:
            raise RuntimeError("the batch's statement failed")
        return [UNCHANGED if n in self.unchanged else n * 10 for n in requests]

    async def one(self, n):
        self.alone.append(n)
        await asyncio.sleep(0)
        if n in self.one_raises:
            raise LookupError(f"no resource {n}")
        return -n


def coalescer(statements: Statements, batch_max: int = 64, in_flight_max: int = 1, key=lambda n: (n,)):
    return Coalescer("test", statements.many, statements.one, key, batch_max, in_flight_max)


async def test_requests_submitted_together_share_one_statement():
    statements = Statements()
    co = coalescer(statements)
    assert await asyncio.gather(*(co.submit(n) for n in range(1, 9))) == [n * 10 for n in range(1, 9)]
    assert statements.batches == [list(range(1, 9))]
    assert statements.alone == []
    assert (co.stats.batches, co.stats.batched, co.stats.largest) == (1, 8, 8)


async def test_a_lone_request_runs_on_the_single_row_path():
    statements = Statements()
    co = coalescer(statements)
    assert await co.submit(7) == -7
    assert statements.batches == [] and statements.alone == [7]


async def test_a_batch_carries_at_most_batch_max_requests():
    statements = Statements()
    co = coalescer(statements, batch_max=3, in_flight_max=4)
    results = await asyncio.gather(*(co.submit(n) for n in range(1, 8)))
    assert statements.batches == [[1, 2, 3], [4, 5, 6]] and statements.alone == [7]
    assert results == [10, 20, 30, 40, 50, 60, -7]


async def test_requests_arriving_while_a_statement_runs_go_together_into_the_next():
    statements = Statements()
    statements.gate = asyncio.Event()
    co = coalescer(statements, in_flight_max=1)
    first = [asyncio.create_task(co.submit(n)) for n in (1, 2)]
    await asyncio.sleep(0.01)
    assert statements.batches == [[1, 2]]
    later = [asyncio.create_task(co.submit(n)) for n in (3, 4, 5)]
    await asyncio.sleep(0.01)
    assert statements.batches == [[1, 2]], "a second statement started while the first was in flight"
    assert co.waiting == 3
    statements.gate.set()
    assert await asyncio.gather(*first, *later) == [10, 20, 30, 40, 50]
    assert statements.batches == [[1, 2], [3, 4, 5]]


async def test_requests_the_batch_did_not_change_are_answered_alone():
    statements = Statements(unchanged=frozenset({2, 4}))
    co = coalescer(statements)
    assert await asyncio.gather(*(co.submit(n) for n in (1, 2, 3, 4))) == [10, -2, 30, -4]
    assert sorted(statements.alone) == [2, 4]
    assert (co.stats.batched, co.stats.unchanged) == (2, 2)


async def test_a_failed_batch_retries_each_request_alone_and_each_gets_its_own_answer():
    statements = Statements(batch_raises=True, one_raises=frozenset({3}))
    co = coalescer(statements)
    results = await asyncio.gather(*(co.submit(n) for n in (1, 2, 3, 4)), return_exceptions=True)
    assert results[:2] == [-1, -2] and results[3] == -4
    assert isinstance(results[2], LookupError) and str(results[2]) == "no resource 3"
    assert statements.batches == [[1, 2, 3, 4]] and sorted(statements.alone) == [1, 2, 3, 4]
    assert co.stats.failed_batches == 1 and co.stats.batched == 0


async def test_a_batch_failed_for_everyone_answers_each_request_with_that_failure_at_once():
    """The database away (``fails_all``): no request is retried alone, where each would wait for
    a statement bound to fail the same way (docs/reliability.md, "PostgreSQL")."""
    statements = Statements(batch_raises=True)
    co = Coalescer("test", statements.many, statements.one, lambda n: (n,), 64,
                   fails_all=lambda exc: isinstance(exc, RuntimeError))
    results = await asyncio.gather(*(co.submit(n) for n in (1, 2, 3)), return_exceptions=True)
    assert [str(r) for r in results] == ["the batch's statement failed"] * 3
    assert statements.batches == [[1, 2, 3]] and statements.alone == []
    assert co.stats.failed_batches == 1


async def test_requests_waiting_behind_a_statement_failed_for_everyone_get_its_failure_too():
    """More waiting than one batch takes: none waits for a second statement bound to fail."""
    statements = Statements(batch_raises=True)
    statements.gate = asyncio.Event()
    co = Coalescer("test", statements.many, statements.one, lambda n: (n,), 2,
                   fails_all=lambda exc: isinstance(exc, RuntimeError))
    first = [asyncio.create_task(co.submit(n)) for n in (1, 2)]
    await asyncio.sleep(0.01)  # the first batch is in flight, held at the gate
    later = [asyncio.create_task(co.submit(n)) for n in range(3, 10)]
    await asyncio.sleep(0.01)
    assert co.waiting == 7
    statements.gate.set()
    results = await asyncio.gather(*first, *later, return_exceptions=True)
    assert [str(r) for r in results] == ["the batch's statement failed"] * 9
    assert statements.batches == [[1, 2]] and statements.alone == [] and co.waiting == 0


async def test_a_lone_request_failed_for_everyone_fails_those_waiting_behind_it():
    statements = Statements(one_raises=frozenset({1}))
    co = Coalescer("test", statements.many, statements.one, lambda n: (n,), 64,
                   fails_all=lambda exc: isinstance(exc, LookupError))
    first = asyncio.create_task(co.submit(1))
    await asyncio.sleep(0)  # dispatched alone; 2 and 3 arrive while it runs
    later = [asyncio.create_task(co.submit(n)) for n in (2, 3)]
    results = await asyncio.gather(first, *later, return_exceptions=True)
    assert [str(r) for r in results] == ["no resource 1"] * 3
    assert statements.alone == [1] and statements.batches == []


async def test_requests_sharing_a_key_never_share_a_statement():
    statements = Statements()
    statements.gate = asyncio.Event()
    # Requests 1 and 11 share their key (the same row, the same target): 11 waits for the batch.
    co = coalescer(statements, key=lambda n: (n % 10,))
    tasks = [asyncio.create_task(co.submit(n)) for n in (1, 2, 11, 3)]
    await asyncio.sleep(0.01)
    assert statements.batches == [[1, 2, 3]] and statements.alone == [], "11 ran beside the batch holding its key"
    statements.gate.set()
    assert await asyncio.gather(*tasks) == [10, 20, -11, 30]
    assert co.stats.split == 1


async def test_a_cancelled_caller_is_left_out_of_the_next_statement():
    statements = Statements()
    statements.gate = asyncio.Event()
    co = coalescer(statements)
    first = [asyncio.create_task(co.submit(n)) for n in (1, 2)]
    await asyncio.sleep(0.01)
    gone = asyncio.create_task(co.submit(3))
    kept = asyncio.create_task(co.submit(4))
    await asyncio.sleep(0.01)
    gone.cancel()
    statements.gate.set()
    assert await asyncio.gather(*first) == [10, 20]
    assert await kept == -4
    assert statements.batches == [[1, 2]] and statements.alone == [4]


def test_limits_below_one_are_refused():
    with pytest.raises(ValueError, match="at least 1"):
        Coalescer("test", Statements().many, Statements().one, lambda n: (n,), 0)


def _raised(cause: BaseException) -> DatabaseUnavailable:
    try:
        raise DatabaseUnavailable(cause) from cause
    except DatabaseUnavailable as exc:
        return exc


def test_only_a_database_that_cannot_be_reached_fails_every_waiting_request():
    """The hot subjects' ``fails_all``: a silent or unreachable server is everyone's failure; a
    statement the server cancelled (a lock waited on too long) is that statement's alone."""
    assert is_unreachable(_raised(TimeoutError()))
    assert is_unreachable(_raised(ConnectionRefusedError()))
    assert not is_unreachable(_raised(asyncpg.QueryCanceledError("canceling statement due to statement timeout")))
    assert not is_unreachable(LookupError("no resource 3"))
