"""A workspace's files deleted by the loop: a node request of kind "delete-files" names the directory (its
KubeRay claim) to delete once the node that used it is gone.

Revision ID: 0019
Revises: 0018
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("node_requests") as batch:
        batch.add_column(sa.Column("path", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("node_requests") as batch:
        batch.drop_column("path")
