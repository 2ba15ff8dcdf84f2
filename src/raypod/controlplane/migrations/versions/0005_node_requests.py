"""Operators' requests on nodes (replace, cordon), kept until the loop has carried them out.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "node_requests",
        sa.Column("cluster_uid", sa.String(32), primary_key=True),
        sa.Column("node", sa.String(63), primary_key=True),
        sa.Column("kind", sa.String(16), primary_key=True),
        sa.Column("incarnation", sa.String(64), nullable=True),
        sa.Column("requested_by", sa.String(63), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("node_requests")
