"""Sessions remember the token they came from; jobs say how they were submitted (raypod or plain Ray).

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("token_id", sa.String(16), nullable=True))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("submitted_via", sa.String(8), nullable=False, server_default="raypod"))
    # Sessions from before this revision are bound to no token: end them.
    op.execute("DELETE FROM sessions")


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("submitted_via")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("token_id")
