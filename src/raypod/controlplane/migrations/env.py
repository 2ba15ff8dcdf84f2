"""Alembic environment: runs on the connection the Store hands over (no alembic.ini needed)."""

from alembic import context

connection = context.config.attributes["connection"]
context.configure(connection=connection, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
