"""Alembic environment: async engine, one transaction, advisory lock against racing replicas."""

from __future__ import annotations

import asyncio
import logging

from alembic import context
from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool
from sqlmodel import SQLModel

from services.ledger.database import tables  # noqa: F401  (tables registers the tables on the metadata)
from services.ledger.database.migrate import LOCK_ID
from services.ledger.database.queries.schema import MIGRATION_LOCK

log = logging.getLogger("alembic.env")
target_metadata = SQLModel.metadata


def _migrate(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata,
                      transaction_per_migration=False)
    with context.begin_transaction():
        connection.execute(text(MIGRATION_LOCK.text), {"k": LOCK_ID})
        context.run_migrations()


async def _run_online() -> None:
    url = context.config.get_main_option("sqlalchemy.url")
    if url is None:
        raise RuntimeError("alembic_config() sets sqlalchemy.url")
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            await conn.run_sync(_migrate)
            await conn.commit()
    finally:
        await engine.dispose()


if context.is_offline_mode():
    context.configure(url=context.config.get_main_option("sqlalchemy.url"),
                      target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(_run_online())
