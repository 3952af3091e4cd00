"""The migrations' statements (``services/ledger/database/migrate.py``, ``migrations/env.py``): one
replica at a time, the revision the database is at."""

from __future__ import annotations

from services.ledger.database.queries.statement import Statement

MIGRATION_LOCK = Statement("MIGRATION_LOCK", "Migrate one replica at a time: the advisory lock :k until commit.", """
    SELECT pg_advisory_xact_lock(:k)""")

SCHEMA_VERSIONED = Statement("SCHEMA_VERSIONED", "Whether Alembic's version table exists.", """
    SELECT to_regclass('alembic_version') IS NOT NULL""")

SCHEMA_VERSION = Statement("SCHEMA_VERSION", "The revision the database is at.", """
    SELECT version_num FROM alembic_version LIMIT 1""")
