"""The store, run against every backend (SQLite always; PostgreSQL when RLSCALE_TEST_PG_URL is set)."""

import json
import math
import sqlite3

import pandas as pd
import pytest
from helpers import run_cli
from rlscale.db.engine import display_url
from rlscale.db.store import Store
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

from rlscale.base.errors import UserError

RUN_CONFIG = {"loss": "cispo", "prompts_per_batch": 48, "rollouts": 16, "lr": 1e-4}


def _record(step: int, reward: float | None = None, **metrics) -> dict:
    return {
        "step": step,
        "gpu_hours": 0.01 * step,
        "rollouts": 768 * step,
        "tokens": 9000 * step,
        "val_reward": reward,
        "metrics": metrics,
    }


def test_migrations_create_every_table_and_a_second_store_reuses_them(db_url):
    with Store(db_url) as first:
        first.upsert_study("s", {"budget": 16})
        tables = set(inspect(first.engine).get_table_names())
    assert {
        "rlscale_studies",
        "rlscale_runs",
        "rlscale_records",
        "rlscale_fits",
        "rlscale_plans",
        "rlscale_alembic_version",
    } <= tables
    with Store(db_url) as second:
        assert second.study_names() == ["s"]
        with second.engine.connect() as conn:
            assert conn.execute(text("select version_num from rlscale_alembic_version")).scalar() == "0001"


def test_ensure_run_is_idempotent_on_config_and_seed(store):
    first = store.ensure_run("abl", "cispo", RUN_CONFIG, seed=0)
    reordered = dict(reversed(list(RUN_CONFIG.items())))  # key order must not matter
    assert store.ensure_run("abl", "cispo again", reordered, seed=0) == first
    other_seed = store.ensure_run("abl", "cispo", RUN_CONFIG, seed=1)
    other_config = store.ensure_run("abl", "grpo", {**RUN_CONFIG, "loss": "grpo"}, seed=0)
    assert len({first, other_seed, other_config}) == 3
    assert store.study_names() == ["abl"]  # created on first use
    runs = store.runs_frame("abl")
    assert list(runs.columns) == ["run_id", "run", "seed", "status", "error", "config", "created_at", "updated_at"]
    assert runs["run"].tolist() == ["cispo", "cispo", "grpo"]
    assert runs["status"].tolist() == ["pending"] * 3
    assert runs.loc[runs["run_id"] == first, "config"].item() == RUN_CONFIG


def test_the_same_config_in_another_study_is_another_run(store):
    assert store.ensure_run("a", "x", RUN_CONFIG) != store.ensure_run("b", "x", RUN_CONFIG)


def test_add_records_skips_stored_steps_and_reports_what_it_inserted(store):
    run = store.ensure_run("s", "r", RUN_CONFIG)
    assert store.add_records(run, [_record(0, 0.1, entropy=1.2), _record(10), _record(20, 0.3, kl=0.01)]) == 3
    # a resumed sweep re-sends the last steps: only the new one lands
    assert store.add_records(run, [_record(20, 0.99), _record(30, 0.4)]) == 1
    assert store.add_records(run, []) == 0
    frame = store.records_frame("s")
    assert frame["step"].tolist() == [0, 10, 20, 30]
    assert frame.loc[frame["step"] == 20, "val_reward"].item() == pytest.approx(0.3)  # first write wins
    assert math.isnan(frame.loc[frame["step"] == 10, "val_reward"].item())  # no eval at that step
    assert list(frame.columns[:7]) == ["run_id", "run", "step", "gpu_hours", "rollouts", "tokens", "val_reward"]
    assert frame.loc[frame["step"] == 0, "entropy"].item() == pytest.approx(1.2)
    assert frame.loc[frame["step"] == 20, "kl"].item() == pytest.approx(0.01)
    assert frame["rollouts"].tolist() == [0, 7680, 15360, 23040]


def test_the_database_itself_refuses_a_second_record_for_a_step(store):
    run = store.ensure_run("s", "r", RUN_CONFIG)
    store.add_records(run, [_record(5, 0.2)])
    with pytest.raises(IntegrityError), store.engine.begin() as conn:
        conn.execute(
            text("insert into rlscale_records (run_id, step, gpu_hours, metrics) values (:run, 5, 1.0, '{}')"),
            {"run": run},
        )


def test_run_status_and_error_are_stored(store):
    run = store.ensure_run("s", "r", RUN_CONFIG)
    store.set_run_status(run, "running")
    store.set_run_status(run, "failed", error="OOM in trainer")
    row = store.runs_frame("s").iloc[0]
    assert (row["status"], row["error"]) == ("failed", "OOM in trainer")
    assert row["updated_at"] >= row["created_at"]
    with pytest.raises(ValueError, match="pending, running, paused, done, failed, stopped"):
        store.set_run_status(run, "finished")


def test_fits_round_trip_and_replace_only_their_model(store):
    a = store.ensure_run("s", "a", RUN_CONFIG)
    b = store.ensure_run("s", "b", {**RUN_CONFIG, "rollouts": 8})
    fits = pd.DataFrame(
        [
            {
                "run": "a",
                "A": 0.61,
                "B": 1.4,
                "C_mid": 120.0,
                "R0": 0.1,
                "rss": 0.002,
                "r2": 0.99,
                "A_lo": 0.58,
                "A_hi": 0.64,
                "n_points": 30,
                "identified": True,
                "reason": "",
            },
            {
                "run": "b",
                "A": 0.9,
                "B": 0.7,
                "C_mid": float("nan"),
                "R0": 0.1,
                "rss": 0.01,
                "r2": 0.5,
                "A_lo": float("nan"),
                "A_hi": float("inf"),
                "n_points": 5,
                "identified": False,
                "reason": "data has not passed the inflection",
            },
        ]
    )
    store.save_fits("s", fits)
    store.save_fits("s", pd.DataFrame([{"run_id": a, "k": 0.3, "identified": True}]), model="power")
    loaded = store.fits_frame("s").set_index("run")
    assert loaded.loc["a", "A"] == pytest.approx(0.61)
    assert loaded.loc["a", "A_lo"] == pytest.approx(0.58)
    assert loaded.loc["a", "n_points"] == 30
    assert bool(loaded.loc["a", "identified"]) and not bool(loaded.loc["b", "identified"])
    assert loaded.loc["b", "reason"] == "data has not passed the inflection"
    assert math.isnan(loaded.loc["b", "C_mid"]) and math.isnan(loaded.loc["b", "A_hi"])
    assert loaded.loc["b", "run_id"] == b

    store.save_fits("s", fits.iloc[:1].assign(A=0.65))  # a refit replaces the old sigmoid fits
    refit = store.fits_frame("s")
    assert refit["run"].tolist() == ["a"] and refit["A"].item() == pytest.approx(0.65)
    assert store.fits_frame("s", model="power")["k"].item() == pytest.approx(0.3)


def test_fits_for_an_ambiguous_or_foreign_run_are_refused(store):
    store.ensure_run("s", "same", RUN_CONFIG, seed=0)
    store.ensure_run("s", "same", RUN_CONFIG, seed=1)
    with pytest.raises(ValueError, match="2 runs"):
        store.save_fits("s", pd.DataFrame([{"run": "same", "A": 0.5, "identified": True}]))
    with pytest.raises(ValueError, match="no run"):
        store.save_fits("s", pd.DataFrame([{"run": "missing", "A": 0.5, "identified": True}]))
    assert store.fits_frame("s").empty


def test_unknown_study_names_the_known_ones(store):
    store.upsert_study("loss_ablation", {"method": "grid"})
    store.upsert_study("quickstart", {"method": "grid", "budget": 1})
    assert store.study_spec("quickstart") == {"method": "grid", "budget": 1}
    with pytest.raises(UserError) as err:
        store.study_spec("nope")
    assert str(err.value) == f"no study named 'nope' in {store.url_for_display}; known: loss_ablation, quickstart"
    with pytest.raises(UserError, match="no study named 'nope'"):
        store.records_frame("nope")


def test_upsert_study_replaces_the_spec_and_keeps_the_id(store):
    first = store.upsert_study("s", {"budget": 1})
    assert store.upsert_study("s", {"budget": 2}) == first
    assert store.study_spec("s") == {"budget": 2}


def test_plans_are_saved_by_name(store):
    plan = {"budget": 16000.0, "points": [{"prompts_per_batch": 48, "rollouts": 16, "steps": 100}]}
    first = store.save_plan("p16k", plan)
    assert store.plan("p16k") == plan
    assert store.save_plan("p16k", {**plan, "budget": 8000.0}) == first
    assert store.plan("p16k")["budget"] == 8000.0


def test_json_columns_take_numpy_values_and_nan(store):
    import numpy as np

    run = store.ensure_run("s", "r", {"lr": np.float64(1e-4), "n": np.int64(16)})
    store.add_records(
        run,
        [
            {
                "step": np.int64(1),
                "gpu_hours": np.float64(0.5),
                "val_reward": np.float32(0.25),
                "metrics": {"kl": float("nan"), "entropy": np.float32(0.5)},
            }
        ],
    )
    frame = store.records_frame("s")
    assert frame["val_reward"].item() == pytest.approx(0.25)
    assert math.isnan(frame["kl"].item()) and frame["entropy"].item() == pytest.approx(0.5)
    assert store.runs_frame("s")["config"].item() == {"lr": 1e-4, "n": 16}


def test_study_counts_summarise_runs_records_and_fits(store):
    run = store.ensure_run("s", "r", RUN_CONFIG)
    store.ensure_run("s", "r2", {**RUN_CONFIG, "lr": 2e-4})
    store.set_run_status(run, "done")
    store.add_records(run, [_record(0, 0.1), _record(1, 0.2)])
    store.save_fits("s", pd.DataFrame([{"run_id": run, "A": 0.5, "identified": False}]))
    store.upsert_study("empty", {})
    counts = {row["study"]: row for row in store.study_counts()}
    assert counts["s"] == {
        "study": "s",
        "runs": 2,
        "pending": 1,
        "running": 0,
        "paused": 0,
        "done": 1,
        "failed": 0,
        "stopped": 0,
        "records": 2,
        "fits": 1,
    }
    assert counts["empty"]["runs"] == 0 and counts["empty"]["records"] == 0


# --- URLs and SQLite concurrency (backend-specific) ----------------------------------------------------


def test_a_password_in_the_url_is_never_printed(monkeypatch, capsys, workdir):
    url = "postgresql+psycopg://rl:hunter2secret@127.0.0.1:1/rlscale"  # port 1: nothing listens, fails fast
    assert display_url(url) == "postgresql+psycopg://rl:***@127.0.0.1:1/rlscale"
    with pytest.raises(UserError) as err:
        Store(url)
    assert "hunter2secret" not in str(err.value) and "rl:***@127.0.0.1:1" in str(err.value)
    code, out, err_text = run_cli(monkeypatch, capsys, "studies", "--db", url)
    assert code == 2
    assert "hunter2secret" not in out + err_text
    assert (
        err_text.startswith("error: --db: cannot open the store postgresql+psycopg://rl:***@")
        and err_text.count("\n") == 1
    )


def test_rlscale_db_env_chooses_the_store(monkeypatch, workdir):
    monkeypatch.setenv("RLSCALE_DB", f"sqlite:///{workdir / 'elsewhere.db'}")
    with Store() as store:
        store.upsert_study("s", {})
        assert store.url_for_display.endswith("/elsewhere.db")
    assert (workdir / "elsewhere.db").exists() and not (workdir / "rlscale.db").exists()


def test_default_store_is_rlscale_db_in_the_working_directory(workdir):
    with Store() as store:
        store.upsert_study("s", {})
    assert (workdir / "rlscale.db").exists()


def test_sqlite_reader_is_not_blocked_by_a_writer_in_another_connection(tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with Store(url) as store:
        run = store.ensure_run("s", "r", RUN_CONFIG)
        store.add_records(run, [_record(0, 0.1)])
    # a sweep in another process holds the write lock mid-transaction ...
    writer = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
    assert writer.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    writer.execute("BEGIN EXCLUSIVE")
    writer.execute("insert into rlscale_records (run_id, step, gpu_hours, metrics) values (?, 1, 0.02, '{}')", (run,))
    try:
        # ... and a report reads without waiting or "database is locked" (it sees the last commit)
        with Store(url) as reader:
            assert reader.records_frame("s")["step"].tolist() == [0]
    finally:
        writer.execute("COMMIT")
        writer.close()
    with Store(url) as reader:
        assert reader.records_frame("s")["step"].tolist() == [0, 1]


def test_a_bad_url_is_a_user_error(workdir):
    with pytest.raises(UserError, match="--db: expected a SQLAlchemy URL"):
        Store("not a url")
    with pytest.raises(UserError, match="cannot open the store sqlite:///.*/missing-dir/x.db"):
        Store(f"sqlite:///{workdir}/missing-dir/x.db")


def test_studies_command_lists_what_is_stored(monkeypatch, capsys, db_url):
    with Store(db_url) as store:
        store.ensure_run("ablation", "r", RUN_CONFIG)
    code, out, _ = run_cli(monkeypatch, capsys, "studies", "--db", db_url, "--json")
    assert code == 0
    assert json.loads(out)[0] == {
        "study": "ablation",
        "runs": 1,
        "pending": 1,
        "running": 0,
        "paused": 0,
        "done": 0,
        "failed": 0,
        "stopped": 0,
        "records": 0,
        "fits": 0,
    }


def test_read_only_commands_do_not_create_a_store(monkeypatch, capsys, workdir):
    for args in (
        ["status", "s"],
        ["report", "s"],
        ["studies"],
        ["fit", "--study", "s"],
        ["recommend", "--budget", "5"],
    ):
        code, out, err = run_cli(monkeypatch, capsys, *args)
        assert code in (0, 2) and len(err.strip().splitlines()) <= 1
    assert not (workdir / "rlscale.db").exists()
