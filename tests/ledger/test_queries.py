"""Every statement the ledger runs is a named constant of ``services/ledger/queries.py``: each
is prepared against a migrated database here, so a typo fails this test rather than a request;
each can be printed for review; values only ever arrive as bound parameters."""

from __future__ import annotations

import subprocess
import sys

import pytest

from services.ledger import queries
from services.ledger.queries import STATEMENTS, Statement, compose

NAMES = list(STATEMENTS)


@pytest.mark.parametrize("name", NAMES)
async def test_every_statement_prepares_against_the_migrated_schema(db, name):
    statement = STATEMENTS[name]
    async with db.transaction():  # SET LOCAL and the advisory locks need one; nothing is run
        prepared = await db.prepare(statement.sql)
    assert len(prepared.get_parameters()) == len(statement.params)


def test_every_statement_is_named_as_its_constant_and_says_what_it_does():
    assert len(NAMES) > 30
    for name, statement in STATEMENTS.items():
        assert getattr(queries, name) is statement
        assert statement.doc and statement.text
        assert "$" not in statement.text  # every fragment was composed; parameters are :name
        assert [f"${n}" in statement.sql for n in range(1, len(statement.params) + 1)] == [True] * len(statement.params)


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
    out = subprocess.run([sys.executable, "-m", "services.ledger.queries"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    for statement in STATEMENTS.values():
        assert f"-- {statement.name}: " in out and statement.text in out
    names = subprocess.run([sys.executable, "-m", "services.ledger.queries", "--names"], capture_output=True,
                           text=True, timeout=60, check=True).stdout.split()
    assert names == NAMES
    one = subprocess.run([sys.executable, "-m", "services.ledger.queries", "OUTCOMES"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert one.startswith("-- OUTCOMES: ") and "-- CLAIM" not in one
