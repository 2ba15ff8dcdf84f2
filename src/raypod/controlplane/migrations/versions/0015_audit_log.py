"""The audit log: who changed what, append-only and hash-chained.

Revision ID: 0015
Revises: 0014
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit_log",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False, index=True),
        sa.Column("actor", sa.String(63), nullable=False, index=True),
        sa.Column("token_id", sa.String(64), nullable=False),
        sa.Column("via", sa.String(16), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("action", sa.String(512), nullable=False),
        sa.Column("target", sa.String(200), nullable=False, index=True),
        sa.Column("client", sa.String(64), nullable=False),
        sa.Column("result", sa.Integer, nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("audit_log")
