"""The coalescer's rules, with plain functions standing in for the two statements: which requests
share a statement, which run alone, and that every request gets exactly its own answer whatever
the batch did (tests/ledger/test_batches.py runs the real statements)."""

from __future__ import annotations

import asyncio

import pytest

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
