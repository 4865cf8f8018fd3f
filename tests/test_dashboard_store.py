"""The store opened read-only, as the dashboard opens it beside a running sweep: it sees the sweep's writes, it
cannot write, and it never creates or migrates a database (SQLite and PostgreSQL alike)."""

import sqlite3

import pytest
from rlscale.db.store import Store

from rlscale.base.errors import UserError


def _seed(url: str) -> int:
    with Store(url) as store:
        store.upsert_study("live", {})
        run_id = store.ensure_run("live", "n4", {"rollouts": 4})
        store.add_records(run_id, [{"step": 0, "gpu_hours": 0.0, "val_reward": 0.2}])
    return run_id


def test_a_read_only_store_sees_a_writers_new_records_and_status(db_url):
    run_id = _seed(db_url)
    with Store(db_url, read_only=True) as viewer, Store(db_url) as sweep:
        before = viewer.study_stamp("live")
        assert len(viewer.records_frame("live")) == 1
        sweep.add_records(run_id, [{"step": 1, "gpu_hours": 0.1, "val_reward": 0.3}])
        assert viewer.study_stamp("live") != before
        assert viewer.records_frame("live")["val_reward"].tolist() == [0.2, 0.3]
        moved = viewer.study_stamp("live")
        sweep.set_run_status(run_id, "running", error="on 2 GPU")
        assert viewer.study_stamp("live") != moved
        assert viewer.runs_frame("live")[["status", "error"]].values.tolist() == [["running", "on 2 GPU"]]


def test_the_database_refuses_a_write_through_a_read_only_store(db_url):
    run_id = _seed(db_url)
    with Store(db_url, read_only=True) as viewer:
        with pytest.raises(Exception, match="read-only|readonly"):
            viewer.set_run_status(run_id, "failed", error="a viewer must not write")
        with pytest.raises(Exception, match="read-only|readonly"):
            viewer.upsert_study("new", {})
    with Store(db_url) as store:
        assert store.study_names() == ["live"]
        assert store.runs_frame("live")["status"].tolist() == ["pending"]


def test_a_missing_sqlite_file_is_an_error_and_is_not_created(tmp_path):
    path = tmp_path / "none.db"
    with pytest.raises(UserError, match="no store at .*none.db"):
        Store(f"sqlite:///{path}", read_only=True)
    assert not path.exists()


def test_an_empty_database_is_not_given_tables(tmp_path):
    path = tmp_path / "empty.db"
    sqlite3.connect(path).close()
    with pytest.raises(UserError, match="no rlscale tables yet"):
        Store(f"sqlite:///{path}", read_only=True)
    assert sqlite3.connect(path).execute("select name from sqlite_master").fetchall() == []


def test_an_older_schema_is_not_migrated(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    _seed(url)
    with sqlite3.connect(tmp_path / "old.db") as conn:
        conn.execute("update rlscale_alembic_version set version_num = 'older'")
    with pytest.raises(UserError, match="schema revision older"):
        Store(url, read_only=True)
    with sqlite3.connect(tmp_path / "old.db") as conn:
        assert conn.execute("select version_num from rlscale_alembic_version").fetchall() == [("older",)]


def test_a_viewer_reads_the_records_added_since_the_last_id_its_stamp_gave(db_url):
    run_id = _seed(db_url)
    with Store(db_url, read_only=True) as viewer, Store(db_url) as sweep:
        last_id = viewer.study_stamp("live")[3]
        sweep.add_records(run_id, [{"step": s, "gpu_hours": 0.1 * s, "val_reward": 0.2 + 0.01 * s} for s in (1, 2)])
        stamp = viewer.study_stamp("live")
        sweep.add_records(run_id, [{"step": 3, "gpu_hours": 0.3, "val_reward": 0.5}])  # after the stamp was read
        added = viewer.records_frame("live", after_id=last_id, until_id=stamp[3])
        assert added["step"].tolist() == [1, 2] and stamp[2] == 3
        assert viewer.records_frame("live", after_id=stamp[3])["step"].tolist() == [3]
