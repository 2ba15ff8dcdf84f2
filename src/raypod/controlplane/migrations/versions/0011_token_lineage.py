"""Token lineage: the token a token was made with; it never outlives that one and is revoked with it.

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tokens") as batch:
        batch.add_column(sa.Column("parent_id", sa.String(16), nullable=True))
        batch.create_index("ix_tokens_parent_id", ["parent_id"])


def downgrade() -> None:
    with op.batch_alter_table("tokens") as batch:
        batch.drop_index("ix_tokens_parent_id")
        batch.drop_column("parent_id")
