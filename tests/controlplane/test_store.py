from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.script import ScriptDirectory

from raypod import errors, state
from raypod import spec as spec_mod
from raypod.controlplane import store


def test_store_migrates_a_new_sqlite_file_in_wal_mode(tmp_path: Path) -> None:
    db = store.Store(f"sqlite:///{tmp_path / 'nested' / 'raypod.db'}")
    with db.engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        head = ScriptDirectory(str(store.MIGRATIONS)).get_current_head()
        assert connection.exec_driver_sql("SELECT version_num FROM alembic_version").scalar() == head
        tables = set(sa.inspect(connection).get_table_names())
        assert {"clusters", "events", "users", "tokens", "sessions", "namespaces"} <= tables
    db.close()
    store.Store(f"sqlite:///{tmp_path / 'nested' / 'raypod.db'}").close()  # reopening is a no-op migration


def test_clusters_round_trip_and_duplicates_are_refused(tmp_path: Path) -> None:
    db = store.Store(f"sqlite:///{tmp_path / 'raypod.db'}")
    spec = spec_mod.parse_spec({"name": "demo", "worker_groups": [{"name": "cpu", "replicas": 2}]})
    view = db.insert(spec)
    assert db.get("default", "demo").spec == spec
    with pytest.raises(errors.AlreadyExists):
        db.insert(spec)
    db.update_spec(view.uid, spec.with_replicas("cpu", 3))
    assert db.get("default", "demo").generation == 2
    with pytest.raises(errors.NotFound, match="clusters there: demo"):
        db.get("default", "other")
    db.add_event(view.uid, state.Event(time=store.now(), namespace="default", cluster="demo", reason="X", message="m"))
    db.remove(view.uid)
    assert db.list() == []
    assert [e.reason for e in db.events("default", "demo")] == ["X"]
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM clusters")).scalar() == 0


def test_the_migrations_build_exactly_the_schema_module(tmp_path: Path) -> None:
    """Tables are defined once (controlplane/store/schema.py); the migrations must not drift from them."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from raypod.controlplane.store import schema

    db = store.Store(f"sqlite:///{tmp_path / 'raypod.db'}")
    with db.engine.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), schema.metadata)
    db.close()
    assert differences == []
