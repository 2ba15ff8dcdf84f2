"""Catalog additions as stored desired state: the serving applier reads and checksums a source, not the request.

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "model_additions",
        sa.Column("id", sa.String(129), primary_key=True),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("replace", sa.Boolean, nullable=False),
        sa.Column("requested_by", sa.String(63), nullable=False),
        sa.Column("requested_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("failure", sa.Text, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("model_additions")
