"""The database itself enforces the ledger's invariants, so a race or a bug in the code
still cannot break them; and the tables the code describes are the ones the migrations make."""

from __future__ import annotations

import asyncpg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlmodel import SQLModel

from services.ledger.database import migrate, tables  # noqa: F401  (tables registers the metadata)
from services.ledger.database.engine import make_engine


@pytest.fixture
async def one_run(db):
    await db.execute("INSERT INTO runs (run_id, shard, event) VALUES ('r1', 'uo1', 'invasion')")
    return db


async def _insert(db, **overrides):
    row = {"run_id": "r1", "module": "world", "kind": "creature", "ref": "c1", "status": "confirmed",
           "idempotency_key": "k1", **overrides}
    cols = ", ".join(row)
    marks = ", ".join(f"${i}" for i in range(1, len(row) + 1))
    await db.execute(f"INSERT INTO resources ({cols}) VALUES ({marks})", *row.values())


async def test_the_migrations_make_exactly_the_tables_the_code_describes(ledger_db):
    engine = make_engine(ledger_db, pool_size=1)
    try:
        async with engine.connect() as conn:
            diff = await conn.run_sync(lambda sync: compare_metadata(MigrationContext.configure(sync),
                                                                     SQLModel.metadata))
    finally:
        await engine.dispose()
    assert diff == []


async def test_an_unknown_resource_status_is_refused_by_the_database(one_run):
    with pytest.raises(asyncpg.CheckViolationError):
        await _insert(one_run, status="exploded")


async def test_an_unknown_run_status_is_refused_by_the_database(one_run):
    with pytest.raises(asyncpg.CheckViolationError):
        await one_run.execute("UPDATE runs SET status = 'paused'")


@pytest.mark.parametrize(("column", "value"), [("kind", "k" * 65), ("ref", "r" * 191)])
async def test_an_over_long_kind_or_ref_is_refused_by_the_database(one_run, column, value):
    with pytest.raises(asyncpg.StringDataRightTruncationError):
        await _insert(one_run, **{column: value})


async def test_a_second_live_row_for_one_target_is_refused_by_the_database(one_run):
    await _insert(one_run)
    with pytest.raises(asyncpg.UniqueViolationError, match="uq_resources_live_target"):
        await _insert(one_run, status="pending", idempotency_key="k2")


async def test_a_resolved_row_does_not_hold_its_target(one_run):
    await _insert(one_run, status="expired")
    await _insert(one_run, idempotency_key="k2")


async def test_an_idempotency_key_is_unique(one_run):
    await _insert(one_run, status="expired")
    with pytest.raises(asyncpg.UniqueViolationError, match="idempotency_key"):
        await _insert(one_run, ref="c2")


async def test_the_schema_goes_down_to_the_baseline_and_up_again(ledger_db):
    await migrate.downgrade(ledger_db, "0001")
    assert await migrate.current_revision(ledger_db) == "0001"
    assert await migrate.upgrade(ledger_db) == migrate.head_revision()
