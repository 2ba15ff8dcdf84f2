"""Model deployments as stored desired state: the deployment applier submits them and removes them.

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deployments") as batch:
        batch.add_column(sa.Column("failure", sa.Text, nullable=True))
        batch.add_column(sa.Column("delete_requested", sa.Boolean, nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("deployments") as batch:
        batch.drop_column("delete_requested")
        batch.drop_column("failure")
