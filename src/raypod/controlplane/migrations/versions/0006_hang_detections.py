"""Hung-job detections of Ray Train runs, with their diagnostics.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "hang_detections",
        sa.Column("id", sa.String(128), primary_key=True),
        sa.Column("cluster_uid", sa.String(32), nullable=False),
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("cluster", sa.String(63), nullable=False),
        sa.Column("job", sa.String(32), nullable=True),
        sa.Column("detected_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("detection", sa.Text, nullable=False),
    )
    op.create_index("ix_hang_detections_cluster_uid", "hang_detections", ["cluster_uid"])
    op.create_index("ix_hang_detections_job", "hang_detections", ["job"])


def downgrade() -> None:
    op.drop_table("hang_detections")
