"""Governance: teams' quotas, and clusters that wait in the queue (with why).

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "quotas",
        sa.Column("team", sa.String(63), primary_key=True),
        sa.Column("spec", sa.Text, nullable=False),
        sa.Column("updated_by", sa.String(63), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    with op.batch_alter_table("clusters") as batch:
        batch.add_column(sa.Column("queued", sa.Boolean, nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("queue_reason", sa.Text, nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("clusters") as batch:
        batch.drop_column("queue_reason")
        batch.drop_column("queued")
    op.drop_table("quotas")
