"""The model catalog and the models deployed on clusters' Ray Serve.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("id", sa.String(129), primary_key=True),
        sa.Column("entry", sa.Text, nullable=False),
        sa.Column("added_by", sa.String(63), nullable=False),
        sa.Column("added_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "deployments",
        sa.Column("cluster_uid", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("cluster", sa.String(63), nullable=False),
        sa.Column("model", sa.String(129), nullable=False),
        sa.Column("owner", sa.String(63), nullable=False),
        sa.Column("spec", sa.Text, nullable=False),
        sa.Column("engine", sa.String(8), nullable=False),
        sa.Column("deploy_job", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("deployments")
    op.drop_table("models")
