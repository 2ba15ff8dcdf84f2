"""raypod jobs: a Ray job with retries; each attempt is one Ray submission.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("cluster", sa.String(63), nullable=False),
        sa.Column("owner", sa.String(63), nullable=False),
        sa.Column("spec", sa.Text, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Text, nullable=False),
        sa.Column("stop_requested", sa.Boolean, nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_jobs_cluster", "jobs", ["namespace", "cluster"])


def downgrade() -> None:
    op.drop_table("jobs")
