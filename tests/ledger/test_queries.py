"""Every statement the ledger runs is a named constant of a family of ``services/ledger/database/queries/``:
each is prepared against a migrated database here, so a typo fails this test rather than a
request; each can be printed for review; values only ever arrive as bound parameters."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from types import ModuleType

import pytest

from services.ledger.database import queries
from services.ledger.database.queries import STATEMENTS, collect
from services.ledger.database.queries.statement import Statement, compose

NAMES = list(STATEMENTS)


@pytest.mark.parametrize("name", NAMES)
async def test_every_statement_prepares_against_the_migrated_schema(db, name):
    statement = STATEMENTS[name]
    async with db.transaction():  # SET LOCAL and the advisory locks need one; nothing is run
        prepared = await db.prepare(statement.sql)
    assert len(prepared.get_parameters()) == len(statement.params)


def test_every_statement_of_every_module_of_the_package_is_listed_and_prepared():
    # A family module left out of queries.FAMILIES would be neither printed nor prepared here.
    written = {}
    for module in pkgutil.iter_modules(queries.__path__):
        if module.name == "__main__":
            continue  # running it prints the statements and exits
        family = importlib.import_module(f"{queries.__name__}.{module.name}")
        written |= {name: value for name, value in vars(family).items() if isinstance(value, Statement)}
    assert written.keys() == STATEMENTS.keys()
    assert all(STATEMENTS[name] is statement for name, statement in written.items())


def test_a_statement_named_unlike_its_constant_or_twice_is_refused():
    misnamed = ModuleType("misnamed")
    misnamed.A = Statement("B", "A test statement.", "SELECT 1")
    with pytest.raises(RuntimeError, match=r"the statement B is the constant misnamed\.A"):
        collect((misnamed,))
    one, other = ModuleType("one"), ModuleType("other")
    one.A = Statement("A", "A test statement.", "SELECT 1")
    other.A = Statement("A", "Another.", "SELECT 2")
    with pytest.raises(RuntimeError, match="two statements are named A"):
        collect((one, other))


def test_every_statement_says_what_it_does_and_holds_no_fragment_left_uncomposed():
    for statement in STATEMENTS.values():
        assert statement.doc and statement.text, statement.name
        assert "$" not in statement.text, statement.name  # every fragment was composed; parameters are :name


def test_parameters_are_numbered_once_each_and_casts_are_left_alone():
    statement = Statement("_T", "A test statement.", "SELECT CAST(:a AS int), :b::text, :a, 'x'::text, ':c'")
    assert statement.sql == "SELECT CAST($1 AS int), $2::text, $1, 'x'::text, ':c'"
    assert statement.params == ("a", "b")
    assert statement.args({"b": 2, "a": 1}) == [1, 2]


@pytest.mark.parametrize("values", [{"a": 1}, {"a": 1, "b": 2, "c": 3}, {"a": 1, "bb": 2}],
                         ids=["missing", "not-taken", "misspelt"])
def test_a_missing_or_unknown_parameter_is_refused_by_name(values):
    statement = Statement("_T", "A test statement.", "SELECT :a, :b")
    with pytest.raises(KeyError, match="_T"):
        statement.args(values)


def test_compose_puts_fragments_in_and_refuses_a_value_shaped_one():
    assert compose("SELECT $what FROM $source s", what="s.id", source="resources") == "SELECT s.id FROM resources s"
    with pytest.raises(ValueError, match="holds a"):
        compose("SELECT $what", what="$1")
    with pytest.raises(KeyError):
        compose("SELECT $what")
    with pytest.raises(ValueError, match="names no fragment"):
        compose("SELECT $1")


def test_a_fragment_lands_indented_as_the_line_it_is_put_on():
    assert compose("WITH x AS (\n    SELECT $cols\n)", cols="a,\n  b") == "WITH x AS (\n    SELECT a,\n    b\n)"


def test_python_m_queries_prints_every_statement_in_full():
    out = subprocess.run([sys.executable, "-m", "services.ledger.database.queries"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    for statement in STATEMENTS.values():
        assert f"-- {statement.name}: " in out and statement.text in out
    names = subprocess.run([sys.executable, "-m", "services.ledger.database.queries", "--names"], capture_output=True,
                           text=True, timeout=60, check=True).stdout.split()
    assert names == NAMES
    one = subprocess.run([sys.executable, "-m", "services.ledger.database.queries", "OUTCOMES"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert one.startswith("-- OUTCOMES: ") and "-- CLAIM" not in one
