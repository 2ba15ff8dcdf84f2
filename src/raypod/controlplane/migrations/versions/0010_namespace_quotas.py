"""Governance: a namespace's own quota, inside its team's.

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "namespace_quotas",
        sa.Column("namespace", sa.String(63), primary_key=True),
        sa.Column("spec", sa.Text, nullable=False),
        sa.Column("updated_by", sa.String(63), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("namespace_quotas")
