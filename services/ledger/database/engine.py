"""The ledger's database URL and the SQLAlchemy engine Alembic's migrations run on (the ledger
itself speaks to PostgreSQL on asyncpg directly: store.py)."""

from __future__ import annotations

from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine


def normalise_url(url: str) -> str:
    """Accept ``postgresql://`` and ``postgres://`` URLs and give them the asyncpg driver."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+asyncpg://" + url[len(prefix):]
    return url


def make_engine(url: str, *, pool_size: int = 10, echo: bool = False) -> AsyncEngine:
    """An engine whose pool checks connections before use, so a restarted PostgreSQL is
    reconnected to rather than answered with a dead connection."""
    return create_async_engine(
        normalise_url(url), pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True, echo=echo
    )


def safe_url(url: str) -> str:
    """``url`` with its password hidden, for logs and messages."""
    return make_url(normalise_url(url)).render_as_string(hide_password=True)
