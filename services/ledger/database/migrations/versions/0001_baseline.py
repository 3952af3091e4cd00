"""baseline: an empty schema that later revisions build on

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Nothing yet: the ledger's tables arrive in the next revision."""


def downgrade() -> None:
    """Nothing to undo."""
