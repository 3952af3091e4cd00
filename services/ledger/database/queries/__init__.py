"""Every SQL statement the ledger runs, each a named constant with a docstring, built once at
import, kept by family: a statement is in the module named for what it is for.

- ``runs.py``: a run created, its status moved;
- ``resources.py``: a resource reserved or recorded, confirmed or failed (one or a batch), its
  key or its target's holder looked up, a replay told from a conflict, a module's rows reconciled;
- ``expiry.py``: a target's rows expired, then their runs settled;
- ``sweep.py``: settle, candidates, claim, outcomes, finish, waiting, a person's retry;
- ``console.py``: the console's reads (a run's page, its log, lists of runs, live rows and
  modules, leases overdue);
- ``outbox.py``: the outbox relay's lock, a batch taken, the published deleted;
- ``schema.py``: the migrations' lock and the schema's revision;
- ``store.py``: the store's own (a paged read's plan, a run by id).

``statement.py`` makes a statement (:class:`~services.ledger.database.queries.statement.Statement`,
:func:`~services.ledger.database.queries.statement.compose`); ``fragments.py`` holds the SQL several
families share — a run or resource row rendered as its wire JSON, the outbox ``events`` CTE, a
run's cleanup settled. ``python -m services.ledger.database.queries`` prints every statement in full
(``--names``: their names); ``tests/ledger/test_queries.py`` prepares every one against a
migrated database, so a typo fails a test, not a request.

Statements take **values only as bound parameters** (``:name``, turned into ``$n`` once).
Which status a change may start from and where it leads is never written here: it is bound from
``statuses.py`` (``status = ANY(:allowed)``, ``SET status = :to``, the log kind as
``:log_kind``). Fragments are put together with ``compose``, which substitutes ``$fragment``
names with SQL text (never a value)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from types import ModuleType

from services.ledger.database.queries import console, expiry, outbox, resources, runs, schema, store, sweep
from services.ledger.database.queries.statement import Statement

FAMILIES: tuple[ModuleType, ...] = (store, runs, resources, expiry, sweep, console, outbox, schema)
"""Every family, in the order :func:`listing` prints them."""


def collect(families: tuple[ModuleType, ...]) -> dict[str, Statement]:
    """The statements of ``families`` by name; a statement named unlike its constant, or two of
    one name, is refused (a RuntimeError at import)."""
    found: dict[str, Statement] = {}
    for family in families:
        for name, value in vars(family).items():
            if not isinstance(value, Statement):
                continue
            if value.name != name:
                raise RuntimeError(f"the statement {value.name} is the constant {family.__name__}.{name}")
            if name in found and found[name] is not value:
                raise RuntimeError(f"two statements are named {name}")
            found[name] = value
    return found


STATEMENTS: dict[str, Statement] = collect(FAMILIES)
"""Every statement by name, family by family, each in the order its module writes them."""


def listing(names: list[str] | None = None) -> Iterator[str]:
    """Every statement (or those named) as reviewable text: its name, what it does, its SQL."""
    for statement in STATEMENTS.values():
        if names and statement.name not in names:
            continue
        yield "-- " + statement.name + ": " + statement.doc + "\n" + statement.text + ";\n"


def main(argv: list[str]) -> int:
    """``python -m services.ledger.database.queries [--names | NAME …]``: print the statements."""
    if argv[:1] == ["--names"]:
        print("\n".join(STATEMENTS))
        return 0
    unknown = [name for name in argv if name not in STATEMENTS]
    if unknown:
        print("no such statement: " + ", ".join(unknown), file=sys.stderr)
        return 2
    print("\n".join(listing(argv)))
    return 0
