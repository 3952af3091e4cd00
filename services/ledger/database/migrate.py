"""Schema migrations (Alembic): bring a database forward, safely with replicas racing.

A database already at a revision this code does not know (a newer release migrated it) is
left as it is, with a warning: migrations are additive, so older code still runs on it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import text

from services.ledger.database.engine import make_engine, normalise_url
from services.ledger.database.queries.schema import SCHEMA_VERSION, SCHEMA_VERSIONED

log = logging.getLogger("shardbus.ledger.migrate")

MIGRATIONS = Path(__file__).parent / "migrations"
"""The Alembic script directory."""

LOCK_ID = 0x5B_1ED6E5
"""pg_advisory lock key taken while migrating, so racing replicas migrate one at a time."""

# Alembic's ``context`` is process-global: two upgrades in one process must not overlap.
_in_process = threading.Lock()


def _upgrade_locked(cfg: Config, revision: str) -> None:
    with _in_process:
        command.upgrade(cfg, revision)


def _downgrade_locked(cfg: Config, revision: str) -> None:
    with _in_process:
        command.downgrade(cfg, revision)


def alembic_config(url: str) -> Config:
    """An Alembic config for ``url`` without an ini file."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", normalise_url(url).replace("%", "%%"))
    return cfg


def head_revision() -> str | None:
    """The newest revision this code knows."""
    return ScriptDirectory.from_config(alembic_config("postgresql+asyncpg://x/y")).get_current_head()


def known_revisions() -> set[str]:
    """Every revision this code knows."""
    script = ScriptDirectory.from_config(alembic_config("postgresql+asyncpg://x/y"))
    return {rev.revision for rev in script.walk_revisions()}


async def current_revision(url: str) -> str | None:
    """The revision the database is at (None for an empty database)."""
    engine = make_engine(url, pool_size=1)
    try:
        async with engine.connect() as conn:
            exists = await conn.scalar(text(SCHEMA_VERSIONED.text))
            if not exists:
                return None
            revision: str | None = await conn.scalar(text(SCHEMA_VERSION.text))
            return revision
    finally:
        await engine.dispose()


async def upgrade(url: str, revision: str = "head") -> str | None:
    """Bring the database at ``url`` to ``revision``; returns the revision it is at after.

    Runs Alembic in the connection's transaction under an advisory lock, in a worker thread
    (Alembic's async env calls ``asyncio.run`` and cannot run inside this loop)."""
    current = await current_revision(url)
    if current is not None and current not in known_revisions():
        log.warning("database is at a newer revision than this code; not migrating",
                    extra={"database_revision": current, "code_head": head_revision()})
        return current
    await asyncio.to_thread(_upgrade_locked, alembic_config(url), revision)
    return await current_revision(url)


async def downgrade(url: str, revision: str) -> None:
    """Take the database back to ``revision`` (tests start from an older schema this way)."""
    await asyncio.to_thread(_downgrade_locked, alembic_config(url), revision)
