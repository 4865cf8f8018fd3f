"""A sweep with several runs in flight: jobs whose devices were taken go back to the queue, the store going away
mid-sweep (a PostgreSQL restart) loses nothing, and two real builtin runs trained at once store what they store
one by one. The scheduling and admission themselves: tests/test_scheduler.py; verl jobs on logical GPUs:
tests/test_verl_jobs.py."""

import os
import subprocess
import threading
import time

import pytest
import yaml
from rlscale.db.store import Store
from rlscale.planner.study_file import load_study
from rlscale.runner.sweep.driver import SweepDriver


def write_study(path, name: str, parameters: dict, **recipe):
    base = {
        "steps": 16,
        "prompts_per_batch": 8,
        "rollouts": 4,
        "eval_every": 4,
        "eval_prompts": 16,
        "eval_samples": 2,
        "checkpoint_every": 4,
        "async": "sync",
        "lr": 3e-4,
        "lr_reference_batch": 256,
    }
    path.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "method": "grid",
                "recipe": {**base, **recipe},
                "parameters": {k: {"values": v} for k, v in parameters.items()},
            }
        )
    )
    return load_study(path)


def test_a_job_whose_devices_were_taken_goes_back_to_the_queue_without_using_an_attempt(
    tmp_path, monkeypatch, paced_engine
):
    import rlscale.runner.sweep.pool as pool_module

    monkeypatch.setattr(pool_module, "REQUEUE_SECONDS", 0.2)
    engine = paced_engine(seconds=0.05)  # 3 s a run: the requeued run starts again while the other one runs
    study = write_study(tmp_path / "queue.yaml", "queue", {"lr": [1e-4, 2e-4]}, steps=60)
    with Store(f"sqlite:///{tmp_path / 'store.db'}") as store:
        summary = SweepDriver(study, store, engine=engine, max_retries=0, max_concurrent=2).run()
        records = store.records_frame("queue")
    assert summary.count("done") == 2 and summary.count("failed") == 0  # no retries allowed, yet not failed
    assert engine.calls.count(1e-4) == 2 and engine.calls.count(2e-4) == 1
    assert engine.most_in_flight == 2
    assert len(records) == 2 * 61 and not records.duplicated(["run_id", "step"]).any()


@pytest.mark.slow
@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_postgresql_restart_under_a_running_sweep_loses_no_record_and_stores_none_twice(
    db_url, tmp_path, paced_engine
):
    ctl = os.environ.get("RLSCALE_TEST_PG_CTL")
    if not ctl:
        pytest.skip("RLSCALE_TEST_PG_CTL is not set (.ci/run sets it with the server it starts)")
    engine = paced_engine(seconds=0.05)
    study = write_study(tmp_path / "restart.yaml", "restart", {"lr": [2e-4, 3e-4, 4e-4]}, steps=160)
    with Store(db_url) as store:
        driver = SweepDriver(study, store, engine=engine, max_concurrent=3)
        outage = {}

        def restart():
            while not engine.reached or min(engine.reached.values(), default=0) < 20:
                time.sleep(0.1)
            outage["at"] = dict(engine.reached)
            subprocess.run([ctl, "stop"], check=True, capture_output=True)
            time.sleep(5)
            subprocess.run([ctl, "start"], check=True, capture_output=True)

        restarter = threading.Thread(target=restart, daemon=True)  # a sweep that fails early leaves no waiter
        restarter.start()
        summary = driver.run()
        restarter.join()
        records, runs = store.records_frame("restart"), store.runs_frame("restart")
    assert outage and max(outage["at"].values()) < 160  # the server went away mid-sweep
    assert summary.count("done") == 3 and list(runs["status"]) == ["done"] * 3
    assert not records.duplicated(["run_id", "step"]).any()
    assert all(sorted(steps) == list(range(161)) for _, steps in records.groupby("run_id")["step"])


def test_a_sqlite_store_held_by_another_writer_past_its_busy_timeout_is_waited_for(tmp_path, monkeypatch, paced_engine):
    import sqlite3

    import rlscale.db.engine as store_engine

    monkeypatch.setattr(store_engine, "SQLITE_BUSY_TIMEOUT_S", 0.2)  # "database is locked" after 0.2 s, not 30
    engine = paced_engine(seconds=0.02)
    study = write_study(tmp_path / "held.yaml", "held", {"lr": [2e-4, 3e-4]}, steps=400)
    db = tmp_path / "store.db"
    notes = []
    with Store(f"sqlite:///{db}") as store:
        driver = SweepDriver(
            study, store, engine=engine, max_concurrent=2, on_update=lambda runs: notes.append(driver.store_note)
        )

        def hold():  # another writer takes the file's write lock for 3 s once both runs are under way
            while len(engine.reached) < 2 or min(engine.reached.values()) < 10:
                time.sleep(0.05)
            holder = sqlite3.connect(db, isolation_level=None)
            holder.execute("BEGIN IMMEDIATE")
            time.sleep(3)
            holder.execute("ROLLBACK")
            holder.close()

        holder = threading.Thread(target=hold, daemon=True)  # a sweep that fails early leaves no waiter
        holder.start()
        summary = driver.run()
        holder.join()
        records, runs = store.records_frame("held"), store.runs_frame("held")
    assert any(note.startswith("store unreachable, retrying") for note in notes)  # it waited, and said so
    assert summary.count("done") == 2 and list(runs["status"]) == ["done", "done"]
    assert all(sorted(steps) == list(range(401)) for _, steps in records.groupby("run_id")["step"])


@pytest.mark.slow
def test_two_builtin_runs_train_at_once_and_store_what_they_store_one_by_one(tmp_path):
    from rlscale.runner.ray_head import connect, disconnect

    study = write_study(tmp_path / "pair.yaml", "pair", {"rollouts": [4, 8]}, steps=8)
    results = {}
    head = connect(None, cpus=4)  # rlscale's local head with 4 CPUs: 2 a run, both at once
    try:
        for label, concurrent in (("together", None), ("alone", 1)):
            seen = []
            with Store(f"sqlite:///{tmp_path / label}.db") as store:
                summary = SweepDriver(
                    study,
                    store,
                    max_concurrent=concurrent,
                    on_update=lambda runs, seen=seen: seen.append(
                        sorted(run.name for run in runs if run.status == "running")
                    ),
                ).run()
                results[label] = store.records_frame("pair").sort_values(["run", "step"])
            assert summary.count("done") == 2
            assert max(map(len, seen)) == (2 if concurrent is None else 1)
    finally:
        disconnect(head)
    together, alone = results["together"], results["alone"]
    assert list(zip(together["run"], together["step"])) == list(zip(alone["run"], alone["step"]))
    assert list(together["rollouts"]) == list(alone["rollouts"])
    # the same seeds give the same samples and updates, whichever run shares the host
    assert together["val_reward"].fillna(-1).tolist() == alone["val_reward"].fillna(-1).tolist()


def test_admission_places_whole_jobs_and_the_first_wave_fills_the_free_devices():
    from rlscale.runner.sweep.admission import Ledger, first_wave, place

    assert place([{"GPU": 8}, {"GPU": 8}], [{"GPU": 8}, {"GPU": 4}]) is None  # never half a job
    assert place([{"GPU": 4}], [{"GPU": 8}, {"GPU": 4}]) == [1]  # best fit: the 8-GPU node stays whole
    ledger = Ledger([{"GPU": 8}], observed=[{"GPU": 6}])  # someone else holds 2
    assert ledger.admit("a", [{"GPU": 4}]) and not ledger.admit("b", [{"GPU": 4}])
    assert ledger.free() == [{"GPU": 2}] and ledger.busy("GPU") == 4
    jobs = [("a", [{"GPU": 4}]), ("b", [{"GPU": 8}]), ("c", [{"GPU": 2}]), ("d", [{"GPU": 2}])]
    assert first_wave(jobs, [{"GPU": 8}]) == ["a", "c", "d"]
    assert first_wave(jobs, [{"GPU": 8}], limit=2) == ["a", "c"]


def test_runs_whose_jobs_still_run_are_admitted_on_the_devices_those_jobs_hold():
    from rlscale.runner.sweep.admission import Ledger

    ledger = Ledger([{"CPU": 2}], observed=[{"CPU": 0}])  # a killed driver's two jobs hold both CPUs
    assert not ledger.admit("a", [{"CPU": 1}])  # a new job would wait for them forever
    ledger.adopt("a", [{"CPU": 1}])  # following them takes nothing more
    ledger.adopt("b", [{"CPU": 1}])
    assert ledger.busy("CPU") == 2 and not ledger.admit("c", [{"CPU": 1}])
    ledger.release("a")
    ledger.observe([{"CPU": 1}])
    assert ledger.admit("c", [{"CPU": 1}]) and ledger.free() == [{"CPU": 0}]


def test_dry_run_prints_the_admission_plan_and_status_the_runs_in_flight(tmp_path, monkeypatch, capsys):
    from helpers import run_cli

    study = write_study(tmp_path / "plan.yaml", "plan", {"rollouts": [2, 4, 8]})
    code, out, _ = run_cli(
        monkeypatch, capsys, "sweep", str(tmp_path / "plan.yaml"), "--dry-run", "--max-concurrent", "2"
    )
    cores = len(os.sched_getaffinity(0))
    first = min(2, cores // 2)  # a builtin run holds 2 CPU cores of a local sweep
    assert code == 0 and f"admission: free now {cores} CPU; at most 2 at once" in out
    assert f"starts first ({first} of 3): n2" in out
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with Store(url) as store:
        driver = SweepDriver(study, store)
        runs = driver.plan()
        store.set_run_status(runs[0].run_id, "running", error="on 2 GPU")
        store.set_run_status(runs[1].run_id, "running", error="on 4 GPU")
        held = store.lock_study("plan")  # as the sweep driving them holds it
        try:
            code, out, _ = run_cli(monkeypatch, capsys, "status", "plan", "--db", url)
        finally:
            held.release()
    assert code == 0 and "2 in flight (holding 2 GPU, 4 GPU), 1 queued" in out
    assert all(len(line) <= 80 for line in out.splitlines())


def test_bayes_opens_max_concurrent_trials_at_once_and_tells_optuna_each(tmp_path, paced_engine):
    import optuna
    from helpers import write_bayes_study

    recipe = {"steps": 20, "eval_every": 2, "checkpoint_every": 2, "async": "sync"}
    path = write_bayes_study(tmp_path / "tpe.yaml", "tpe", 4, recipe, (2e-4, 6e-4), max_concurrent=2)
    engine = paced_engine(seconds=0.02)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with Store(url) as store:
        driver = SweepDriver(load_study(path), store, engine=engine)
        driver.plan()
        summary = driver.run()
        runs = store.runs_frame("tpe")
    assert summary.count("done") == 4 and list(runs["run"]) == [f"trial-{i}" for i in range(4)]
    assert engine.most_in_flight == 2  # two trials open at once, never more
    trials = optuna.load_study(study_name="rlscale:tpe", storage=url).trials
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 4
