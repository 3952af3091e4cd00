"""The ledger's tables (SQLModel). The schema itself is made by the Alembic migrations."""

from __future__ import annotations
