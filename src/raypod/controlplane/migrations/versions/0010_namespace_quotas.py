"""Governance: a namespace's own quota, inside its team's; a scale-up waiting for quota.

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
    with op.batch_alter_table("clusters") as batch:
        batch.add_column(sa.Column("pending_spec", sa.Text, nullable=True))
        batch.add_column(sa.Column("pending_reason", sa.Text, nullable=False, server_default=""))
        batch.add_column(sa.Column("pending_since", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("clusters") as batch:
        batch.drop_column("pending_since")
        batch.drop_column("pending_reason")
        batch.drop_column("pending_spec")
    op.drop_table("namespace_quotas")
