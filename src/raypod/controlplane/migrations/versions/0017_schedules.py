"""Scheduled jobs: a job spec run on a cluster at the times a cron expression names.

Revision ID: 0017
Revises: 0016
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("namespace", sa.String(63), primary_key=True),
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("owner", sa.String(63), nullable=False),
        sa.Column("spec", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_scheduled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_message", sa.Text, nullable=False, server_default=""),
    )


def downgrade() -> None:
    op.drop_table("schedules")
