"""The run console's rendered pages, kept per ledger process and served again only while the
database says they are still the page (``ledger.console``; issue 27).

Rendering a first page of 1,000 rows is 7.6 ms of SQL at 1,000,000 rows, 4.1 of them building
its JSON; checking that nothing it was rendered from changed is 0.28 ms
(``queries/console.py``: :data:`~services.ledger.database.queries.console.CONSOLE_MARK`). So a page is
rendered once per change, and every read after it asks the database for the run's change mark
first: the same mark, and a time at which each lease flag the page carries still stands, is
the same page, byte for byte; anything else renders it again.

The mark is exact where a writer's own values are not. Several ledger processes share one
database and any of them commits changes, so the check is the database's, never this
process's memory of what it changed. A run's page is rendered from the run's row and its
resources (the counts are of all of them); the mark is the run row's version and the count
and summed 64-bit hashes of its resources' row versions (``xmin``, ``ctid``): an update, an
insert or a delete by any transaction that committed after the render leaves a version no
render saw, whenever it began. ``max(resources.updated_at)`` or the newest run-log id would
miss a transaction that began before the render (its ``now()`` and its ids are older) and
committed after it; ``runs.updated_at`` does not move when a resource does. A page's
``leaseDeadlinePassed`` and ``leasesOverdue`` move with the clock alone: the page also keeps
the interval of the database's time in which they stand.

Memory is bounded: pages are kept least recently used first out, at most
:data:`CACHE_BYTES` of them (a page is at most ``PAGE_BYTES``, 768 KiB, plus its head), so a
caller asking for many runs evicts pages, never grows the process."""

from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

__all__ = ["CACHE_BYTES", "ENTRY_OVERHEAD", "ConsoleCache", "Key", "Mark", "Page", "cache_of"]

CACHE_BYTES = 32 * 1024 * 1024
"""The most bytes of pages one ledger process keeps (about 65 first pages of 1,000 rows)."""

ENTRY_OVERHEAD = 512
"""Bytes counted for a page beside its own: its key, its mark, the bookkeeping."""

Key = tuple[str, int, int, int]
"""A page: run id, ``after``, rows asked for (after the cap), byte budget."""


@dataclass(frozen=True)
class Mark:
    """What a page was rendered from (``CONSOLE_PAGE``'s columns of the same names)."""

    run_mark: int
    rows_count: int
    rows_mark: Decimal | None
    lease_after: int | None
    """The latest lease deadline the page shows passed: it stands while the time is after it."""
    lease_until: int | None
    """The earliest lease deadline the page shows not yet passed: it stands until the time is past it."""

    @classmethod
    def of(cls, row: dict[str, Any]) -> Mark:
        return cls(row["run_mark"], row["rows_count"], row["rows_mark"], row["lease_after"], row["lease_until"])

    def current(self, now: dict[str, Any]) -> bool:
        """Whether ``now`` (``CONSOLE_MARK``'s row) finds what this page was rendered from."""
        now_ms: int = now["now_ms"]
        return (now["run_mark"] is not None and now["run_mark"] == self.run_mark
                and now["rows_count"] == self.rows_count and now["rows_mark"] == self.rows_mark
                and (self.lease_after is None or now_ms > self.lease_after)
                and (self.lease_until is None or now_ms <= self.lease_until))


@dataclass(frozen=True)
class Page:
    """A rendered page (the reply's bytes) and what it was rendered from."""

    reply: bytes
    mark: Mark

    @property
    def cost(self) -> int:
        return len(self.reply) + ENTRY_OVERHEAD


class ConsoleCache:
    """Pages by :data:`Key`, least recently used evicted first beyond ``capacity`` bytes."""

    def __init__(self, capacity: int = CACHE_BYTES) -> None:
        self.capacity = capacity
        self.bytes = 0
        self.hits = self.stale = self.misses = self.evicted = 0
        self._pages: OrderedDict[Key, Page] = OrderedDict()

    def __len__(self) -> int:
        return len(self._pages)

    def get(self, key: Key) -> Page | None:
        """The page kept for ``key`` (now the most recently used), or None."""
        page = self._pages.get(key)
        if page is None:
            self.misses += 1
        else:
            self._pages.move_to_end(key)
        return page

    def served(self, current: bool) -> None:
        """Count what the check of a kept page found."""
        if current:
            self.hits += 1
        else:
            self.stale += 1

    def put(self, key: Key, page: Page) -> None:
        """Keep ``page`` for ``key`` (a page larger than the whole capacity is not kept)."""
        self.drop(key)
        if page.cost > self.capacity:
            return
        self._pages[key] = page
        self.bytes += page.cost
        while self.bytes > self.capacity:
            _, oldest = self._pages.popitem(last=False)
            self.bytes -= oldest.cost
            self.evicted += 1

    def drop(self, key: Key) -> None:
        """Forget the page of ``key`` (its run is gone, or a newer one replaces it)."""
        page = self._pages.pop(key, None)
        if page is not None:
            self.bytes -= page.cost


_CACHES: weakref.WeakKeyDictionary[object, ConsoleCache] = weakref.WeakKeyDictionary()


def cache_of(db: object) -> ConsoleCache:
    """The cache of the ledger whose database pool is ``db`` (one per pool: a second ledger in
    the same process, as the tests start, keeps its own, as a second process would)."""
    cache = _CACHES.get(db)
    if cache is None:
        cache = _CACHES[db] = ConsoleCache()
    return cache
