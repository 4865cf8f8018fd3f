"""`rlscale sweep`: planning is idempotent, a killed sweep resumes without gaps or duplicates, crashing jobs
are retried or marked failed while the rest complete, `rlscale status` reads while a sweep writes."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import spawn, tail
from rlscale.db.store import Store
from rlscale.planner.study_file import load_study
from rlscale.runner.engine import Engine, JobResult
from rlscale.runner.sweep.driver import SweepDriver

from rlscale.base.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
RLSCALE = [sys.executable, "-m", "rlscale"]

# 2 runs x 16 steps of the tiny policy; a checkpoint (and a batch of records) every 4 steps
RECIPE = {
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


def write_study(path: Path, name: str, parameters: dict, **recipe) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "method": "grid",
                "recipe": {**RECIPE, **recipe},
                "parameters": {k: {"values": v} for k, v in parameters.items()},
            }
        )
    )
    return path


def test_replanning_is_idempotent_and_new_axis_values_add_only_new_runs(tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with Store(url) as store:
        first = SweepDriver(load_study(write_study(tmp_path / "s.yaml", "grid", {"rollouts": [4, 8]})), store).plan()
        again = SweepDriver(load_study(tmp_path / "s.yaml"), store).plan()
        assert [r.run_id for r in again] == [r.run_id for r in first]
        store.set_run_status(first[0].run_id, "done")
        grown = SweepDriver(
            load_study(write_study(tmp_path / "s.yaml", "grid", {"rollouts": [4, 8, 16]})), store
        ).plan()
        assert [r.run_id for r in grown[:2]] == [r.run_id for r in first]
        assert [r.status for r in grown] == [
            "done",
            "pending",
            "pending",
        ]  # only the new point and the unfinished one run
        assert len(store.runs_frame("grid")) == 3


def test_the_driver_reads_each_runs_fit_of_record_and_refits_only_a_run_whose_points_changed(tmp_path, monkeypatch):
    import numpy as np
    import rlscale.fitting.curves as curves
    from rlscale.fitting.rules.early_stop import UPPER_LEVEL

    calls = []
    real = curves.fit_sigmoid
    monkeypatch.setattr(curves, "fit_sigmoid", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    with Store(f"sqlite:///{tmp_path / 'store.db'}") as store:
        driver = SweepDriver(load_study(write_study(tmp_path / "s.yaml", "fits", {"rollouts": [4, 8]})), store)
        runs = driver.plan()
        compute = np.linspace(0.1, 2.0, 12)
        for run, A in zip(runs, (0.6, 0.8)):
            reward = 0.1 + (A - 0.1) / (1 + (0.5 / compute) ** 2)
            records = [{"step": i, "gpu_hours": c, "val_reward": r} for i, (c, r) in enumerate(zip(compute, reward))]
            store.add_records(run.run_id, records)
        first = driver.progress()
        assert len(calls) == 2
        for run, seen in zip(runs, first):
            rows = store.records_frame("fits").query(f"run_id == {run.run_id}")
            expected = curves.fit_of_record(
                rows["gpu_hours"], rows["val_reward"], record_breaking=True, upper_level=UPPER_LEVEL
            )
            assert (seen.fit.A, seen.fit.A_upper) == pytest.approx((expected.A, expected.A_upper), nan_ok=True)
            assert seen.compute == pytest.approx(2.0)
        calls.clear()
        driver.progress()
        assert len(calls) == 0  # no new points: no refit
        store.add_records(runs[0].run_id, [{"step": 12, "gpu_hours": 2.2, "val_reward": 0.59}])
        driver.progress()
        assert len(calls) == 1  # only the run with a new record-breaking point
        assert driver.progress_of(runs[1]).fit.A == pytest.approx(first[1].fit.A)
        assert len(calls) == 1


def _records(url: str, study: str):
    with Store(url) as store:
        return store.records_frame(study), store.runs_frame(study)


@pytest.mark.slow
def test_killed_sweep_resumes_with_every_record_once_and_status_reads_meanwhile(tmp_path):
    # 32 steps a run: slack for `rlscale status` to start on a loaded host before the sweep ends
    study = write_study(tmp_path / "kill.yaml", "kill", {"rollouts": [4, 8]}, steps=32)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    env = dict(os.environ)
    sweep = [*RLSCALE, "sweep", str(study), "--db", url, "--out", str(tmp_path / "reports")]
    process = spawn(sweep, log := tmp_path / "sweep.log", cwd=tmp_path, env=env)
    try:
        deadline = time.time() + 420
        while time.time() < deadline and process.poll() is None:
            try:
                records, _ = _records(url, "kill") if (tmp_path / "store.db").exists() else ([], None)
            except UserError:  # the store file is there before the sweep has written its study into it
                records = []
            if len(records) >= 9:  # the first run is past its second checkpoint: kill the sweep mid-run
                # frozen where it is (a loaded host may take longer to start `status` than the sweep takes to end)
                os.killpg(process.pid, signal.SIGSTOP)
                status = subprocess.run(
                    [*RLSCALE, "status", "kill", "--db", url, "--json"],
                    cwd=tmp_path,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                assert status.returncode == 0, status.stderr
                assert {row["status"] for row in json.loads(status.stdout)} <= {"running", "pending", "done"}
                break
            time.sleep(1)
        assert process.poll() is None, f"the sweep ended before it could be killed: {tail(log)}"
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # the driver, its Ray cluster and the vLLM engine
        process.wait()
    records, runs = _records(url, "kill")
    assert 9 <= len(records) < 2 * 33

    resumed = subprocess.run(sweep + ["--json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    records, runs = _records(url, "kill")
    assert list(runs["status"]) == ["done", "done"]
    # an uninterrupted sweep stores steps 0..32 of both runs: exactly that, each once
    assert len(records) == 2 * 33
    assert not records.duplicated(["run_id", "step"]).any()
    assert sorted(records.groupby("run_id")["step"].apply(list).iloc[0]) == list(range(33))
    assert records["gpu_hours"].is_monotonic_increasing or all(
        g["gpu_hours"].is_monotonic_increasing for _, g in records.groupby("run_id")
    )
    summary = json.loads(resumed.stdout)
    assert summary["done"] == 2 and summary["failed"] == 0
    # the compute the study spent, over both invocations, against its plan
    assert summary["gpu_hours"] == pytest.approx(records.groupby("run_id")["gpu_hours"].max().sum(), rel=1e-9)
    assert summary["planned_gpu_hours"] > 0


@pytest.mark.slow
def test_a_crashing_job_or_driver_is_retried_and_an_always_failing_one_is_marked_failed(tmp_path, monkeypatch):
    monkeypatch.setenv("RLSCALE_FAULT_DIR", str(tmp_path))
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # a head the sweep owns: its Ray driver in a process of its own
    verifiers = ["fault_verifiers:crash_once", "fault_verifiers:always_crash", "fault_verifiers:exit_once"]
    study = load_study(write_study(tmp_path / "faults.yaml", "faults", {"verifier": verifiers}, steps=8))
    with Store(f"sqlite:///{tmp_path / 'store.db'}") as store:
        driver = SweepDriver(study, store, max_retries=1, max_concurrent=1)
        summary = driver.run()
        runs = store.runs_frame("faults").set_index("run")
        records = store.records_frame("faults")
    flaky, broken, exited = (runs.loc[f"verifier={verifier}"] for verifier in verifiers)
    for run in (flaky, exited):  # the driver's process ended under `exited`: a new one took its retry
        assert run["status"] == "done"
        assert sorted(records[records["run_id"] == run["run_id"]]["step"]) == list(range(9))
    assert broken["status"] == "failed" and "injected crash (every call)" in broken["error"]
    assert summary.count("done") == 2 and summary.count("failed") == 1
    assert [run.attempts for run in driver.runs] == [2, 2, 2]  # one retry each (max_retries=1)


class ReplayEngine(Engine):
    """An engine (rlscale.runner.engine) that replays known sigmoid curves instead of training (this test isolates
    the driver's rung scheduling from Ray and training on purpose): 0.01 device-hours a step, an evaluation and a
    checkpoint every 2 steps, resumable at its last checkpoint, honouring until_step and should_stop."""

    name = "replay"

    ASYMPTOTE = {1e-4: 0.50, 2e-4: 0.62, 3e-4: 0.80, 4e-4: 0.66}  # by the run's lr

    def __init__(self):
        self.reached: dict[str, int] = {}
        self.calls: list[tuple[float, int, int]] = []  # (lr, from step, to step)

    def asymptote(self, lr: float) -> float:
        return self.ASYMPTOTE[lr]

    def reward(self, lr: float, step: int) -> float:
        import numpy as np
        from rlscale.fitting.sigmoid import sigmoid

        truth = float(sigmoid(0.01 * step, self.asymptote(lr), 2.0, 0.15, 0.1)) if step else 0.1
        rng = np.random.default_rng(int(lr * 1e5) * 1000 + step)
        return rng.binomial(4096, truth) / 4096

    def run(self, recipe, *, run_key, on_records, until_step=None, should_stop=None, progress=None, **_):
        start = self.reached.get(run_key, 0)
        last = until_step or recipe.steps
        steps = range(start + 1, last + 1) if start else range(0, last + 1)
        batch, stopped = [], None
        for step in steps:
            batch.append(
                {
                    "step": step,
                    "gpu_hours": 0.01 * step,
                    "rollouts": step * recipe.total_batch,
                    "tokens": 0,
                    "val_reward": self.reward(recipe.lr, step) if step % 2 == 0 else None,
                    "metrics": {},
                }
            )
            if step % 2 == 0 or step == last:
                on_records(batch)
                batch = []
                self.reached[run_key] = step
                stopped = should_stop() if should_stop else None
                if stopped:
                    break
        self.calls.append((recipe.lr, start, self.reached[run_key]))
        return JobResult(steps=self.reached[run_key], stopped=stopped is not None, stop_reason=stopped or "")


class SmoothReplay(ReplayEngine):
    """ReplayEngine for any lr (a bayes study samples it): the asymptote peaks at 3e-4, falling with log-distance."""

    def asymptote(self, lr: float) -> float:
        import math

        return 0.8 - 0.3 * abs(math.log10(lr / 3e-4))


def test_a_bayes_sweep_runs_n_trials_chosen_by_optuna_and_a_rerun_adds_none(tmp_path, cli):
    import optuna
    from helpers import write_bayes_study

    study = write_bayes_study(tmp_path / "bayes.yaml", "bayes", 2, {**RECIPE, "steps": 8}, (1e-4, 6e-4))
    url, jobs = f"sqlite:///{tmp_path / 'store.db'}", SmoothReplay()
    with Store(url) as store:
        SweepDriver(load_study(study), store, engine=jobs).run()
        assert store.study_spec("bayes")["method"] == "bayes"  # stored, as a planned study's is
    _, runs = _records(url, "bayes")
    assert list(runs["run"]) == ["trial-0", "trial-1"] and set(runs["status"]) == {"done"}
    assert all(1e-4 <= config["lr"] <= 6e-4 for config in runs["config"])
    trials = optuna.load_study(study_name="rlscale:bayes", storage=url).trials
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 2
    assert [t.params["lr"] for t in trials] == [config["lr"] for config in runs["config"]]
    assert [call[0] for call in jobs.calls] == [config["lr"] for config in runs["config"]]

    with Store(url) as store:
        SweepDriver(load_study(study), store, engine=jobs).run()
    assert len(_records(url, "bayes")[1]) == 2 and len(jobs.calls) == 2  # n_trials reached: nothing new is run
    # its report proposes no `sweep --extend`: a sweep extends planned runs, not Optuna's trials
    code, out, err = cli("report", "bayes", "--db", url, "--out", str(tmp_path / "r"), "--json", "--bootstrap", "0")
    assert code == 0, err
    decision = json.loads(out)["decision"]
    assert decision["planned"] is False and decision["trials"] is True and decision["commands"]["extend"] is None
    for command in filter(None, decision["commands"].values()):  # what it does propose runs on the same store
        code, _, err = cli(*shlex.split(command)[1:])
        assert code == 0, (command, err)


def test_a_run_whose_driver_died_after_its_last_records_ends_done_on_the_rerun(tmp_path):
    # the killed driver stored every step of the first run but not its status: the rerun must not leave it running
    path = write_study(tmp_path / "late.yaml", "late", {"lr": [1e-4, 2e-4]}, steps=8, eval_every=2)
    jobs = ReplayEngine()
    with Store(f"sqlite:///{tmp_path / 'store.db'}") as store:
        first = SweepDriver(load_study(path), store, engine=jobs).plan()
        store.set_run_status(first[0].run_id, "running")
        store.add_records(first[0].run_id, [{"step": s, "gpu_hours": 0.01 * s, "val_reward": 0.1} for s in range(9)])
        summary = SweepDriver(load_study(path), store, engine=jobs).run()
        runs = store.runs_frame("late")
    assert list(runs["status"]) == ["done", "done"]
    assert summary.count("done") == 2
    assert [call[0] for call in jobs.calls] == [2e-4]  # the finished run is not trained again


def test_asymptote_rungs_explore_every_run_then_stop_the_ones_that_cannot_win(tmp_path):
    jobs = ReplayEngine()
    path = write_study(
        tmp_path / "rungs.yaml",
        "rungs",
        {"lr": sorted(ReplayEngine.ASYMPTOTE)},
        steps=80,
        eval_every=2,
        checkpoint_every=2,
    )
    spec = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**spec, "early_terminate": {"type": "asymptote", "min_fraction": 0.25}}))
    with Store(f"sqlite:///{tmp_path / 'store.db'}") as store:
        driver = SweepDriver(load_study(path), store, engine=jobs)
        driver.run()
        runs = store.runs_frame("rungs").set_index("run")
        records = store.records_frame("rungs")
    # every run is explored to the first rung (20 of 80 steps) before any run goes further
    assert sorted(call[1:] for call in jobs.calls[:4]) == [(0, 20)] * 4
    status = {config["lr"]: s for config, s in zip(runs["config"], runs["status"])}
    assert status[3e-4] == "done"  # the best configuration, as the full grid would pick it
    assert status[1e-4] == status[2e-4] == "stopped"  # far below the best: never run to the end
    assert all("best run's lower bound" in runs.loc[name, "error"] for name in runs.index[runs["status"] == "stopped"])
    assert not records.duplicated(["run_id", "step"]).any()
    for _, rows in records.groupby("run_id"):  # paused and resumed runs have every step once, in order
        assert list(rows["step"]) == list(range(int(rows["step"].max()) + 1))
    spent = records.groupby("run_id")["gpu_hours"].max().sum()
    assert spent <= 0.6 * 4 * 0.8  # the full grid would spend 4 runs x 0.8 device-hours


@pytest.mark.slow
def test_rung_scheduled_sweep_pauses_and_resumes_real_jobs_without_gaps(tmp_path):
    path = write_study(tmp_path / "paused.yaml", "paused", {"rollouts": [4, 8]})
    spec = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**spec, "early_terminate": {"type": "asymptote", "min_fraction": 0.25}}))
    seen = []
    with Store(f"sqlite:///{tmp_path / 'store.db'}") as store:
        driver = SweepDriver(
            load_study(path), store, on_update=lambda runs: seen.extend((r.name, r.status, r.step) for r in runs)
        )
        summary = driver.run()
        records = store.records_frame("paused")
    assert summary.count("done") + summary.count("stopped") == 2 and summary.count("failed") == 0
    paused = {(name, step) for name, status, step in seen if status == "paused"}
    # both runs explored to the first rung (4 of 16 steps); a run that goes on pauses only at rungs (8 is the next)
    assert {("n4", 4), ("n8", 4)} <= paused and {step for _, step in paused} <= {4, 8}
    assert not records.duplicated(["run_id", "step"]).any()
    names = {run.run_id: run.name for run in driver.runs}
    for run_id, rows in records.groupby(
        "run_id"
    ):  # resumed from the rung's checkpoint: every step once, compute rising
        assert list(rows["step"]) == list(range(int(rows["step"].max()) + 1))
        assert rows["gpu_hours"].is_monotonic_increasing
        rungs = [0] + [step for name, step in paused if name == names[run_id]]
        assert rows.set_index("step")["val_reward"].notna()[rungs].all()  # evaluated at every rung it paused at


def test_engines_are_chosen_by_name_and_an_unknown_name_is_a_user_error():
    from rlscale.runner.builtin.engine import BuiltinEngine
    from rlscale.runner.engine import DEFAULT_ENGINE, get_engine

    from rlscale.base.errors import UserError

    engine = get_engine(DEFAULT_ENGINE, ray_address="auto")
    assert isinstance(engine, BuiltinEngine) and engine.ray_address == "auto"
    engine.close()  # nothing started yet: nothing to stop
    with pytest.raises(UserError, match="unknown engine 'nope'; expected one of: builtin, trl, verl"):
        get_engine("nope")


class FlakyEngine(Engine):
    """Runs every recipe to its end in one go, except that lr 1e-4 crashes on its first call and lr 2e-4 always."""

    name = "flaky"

    def __init__(self):
        self.calls = {}

    def run(self, recipe, *, run_key, on_records, until_step=None, should_stop=None, progress=None, **_):
        self.calls[recipe.lr] = self.calls.get(recipe.lr, 0) + 1
        if recipe.lr == 2e-4 or (recipe.lr == 1e-4 and self.calls[recipe.lr] == 1):
            raise RuntimeError(f"injected crash (lr {recipe.lr})")
        on_records(
            [
                {"step": step, "gpu_hours": 0.01 * step, "rollouts": 0, "tokens": 0, "val_reward": 0.5, "metrics": {}}
                for step in range(recipe.steps + 1)
            ]
        )
        return JobResult(steps=recipe.steps)


def test_a_crashing_run_is_retried_then_marked_failed_while_the_others_finish(tmp_path):
    engine = FlakyEngine()
    path = write_study(tmp_path / "flaky.yaml", "flaky", {"lr": [1e-4, 2e-4, 3e-4]}, steps=4)
    with Store(f"sqlite:///{tmp_path / 'store.db'}") as store:
        summary = SweepDriver(load_study(path), store, engine=engine, max_retries=1).run()
        runs = store.runs_frame("flaky")
        records = store.records_frame("flaky")
    status = {config["lr"]: s for config, s in zip(runs["config"], runs["status"])}
    assert status == {1e-4: "done", 2e-4: "failed", 3e-4: "done"}
    assert engine.calls == {1e-4: 2, 2e-4: 2, 3e-4: 1}  # one retry each (max_retries=1)
    assert "injected crash (lr 0.0002)" in runs.set_index("status").loc["failed", "error"]
    assert summary.count("done") == 2 and summary.count("failed") == 1
    assert len(records) == 2 * 5  # steps 0..4 of the two finished runs, once each


def test_a_run_that_failed_is_retried_by_the_next_sweep_from_where_it_was(tmp_path):
    # a crash that outlived its retries (a full disk, a lost node) is not the run's end: the sweep run again retries it
    engine = FlakyEngine()
    path = write_study(tmp_path / "again.yaml", "again", {"lr": [2e-4, 3e-4]}, steps=4)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with Store(url) as store:
        first = SweepDriver(load_study(path), store, engine=engine, max_retries=0).run()
        assert first.count("failed") == 1
        fixed = ReplayEngine()  # what crashed is gone (the disk has room again)
        second = SweepDriver(load_study(path), store, engine=fixed).run()
        runs = store.runs_frame("again")
    assert second.count("done") == 2 and list(runs["status"]) == ["done", "done"]
    assert [call[0] for call in fixed.calls] == [2e-4]  # only the failed run is trained again


def test_ctrl_c_ends_the_sweep_command_with_130_and_one_line_saying_how_to_resume(tmp_path, monkeypatch, cli):
    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(SweepDriver, "run", interrupted)
    path = write_study(tmp_path / "ctrl.yaml", "ctrl", {"lr": [1e-4, 2e-4]}, steps=4)
    code, out, err = cli("sweep", str(path), "--db", f"sqlite:///{tmp_path / 'store.db'}", "--json")
    assert code == 130 and out == ""
    assert err.strip() == "interrupted: runs are paused at their last checkpoint; run it again to resume"


def test_sigterm_pauses_a_sweep_as_ctrl_c_does_exits_143_and_the_next_sweep_finishes_it(tmp_path, monkeypatch, cli):
    # a scheduler's preemption (SLURM, Kubernetes, `docker stop`) sends SIGTERM: runs paused, none left `running`
    class Preempted(ReplayEngine):
        def run(self, recipe, *, run_key, on_records, until_step=None, should_stop=None, progress=None, **_):
            def records(batch):
                on_records(batch)
                os.kill(os.getpid(), signal.SIGTERM)

            return super().run(
                recipe, run_key=run_key, on_records=records, until_step=until_step, should_stop=should_stop
            )

    init, engines = SweepDriver.__init__, [Preempted(), ReplayEngine()]
    monkeypatch.setattr(SweepDriver, "__init__", lambda self, *a, **k: init(self, *a, **k, engine=engines[0]))
    path = write_study(tmp_path / "term.yaml", "term", {"lr": [1e-4, 2e-4]}, steps=40, eval_every=2)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    kept = signal.getsignal(signal.SIGTERM)
    code, out, err = cli("sweep", str(path), "--db", url, "--json")
    assert code == 143 and out == "", err
    assert err.strip() == "terminated: runs are paused at their last checkpoint; run it again to resume"
    assert signal.getsignal(signal.SIGTERM) == kept  # the process's own handler is back
    with Store(url) as store:
        stopped = store.runs_frame("term")
    assert set(stopped["status"]) <= {"paused", "pending"} and "paused" in set(stopped["status"])

    engines.pop(0)
    code, out, err = cli("sweep", str(path), "--db", url, "--json")
    assert code == 0, err
    with Store(url) as store:
        runs, records = store.runs_frame("term"), store.records_frame("term")
    assert list(runs["status"]) == ["done", "done"] and not records.duplicated(["run_id", "step"]).any()


def test_runs_stopped_by_ctrl_c_are_paused_not_stopped_and_the_next_sweep_finishes_them(tmp_path):
    import _thread

    class CtrlC(ReplayEngine):
        """Ctrl-C in the driver's terminal once the first run has stored its first checkpoint."""

        def run(self, recipe, *, run_key, on_records, until_step=None, should_stop=None, progress=None, **_):
            def records(batch):
                on_records(batch)
                if not self.reached:
                    _thread.interrupt_main()

            return super().run(
                recipe, run_key=run_key, on_records=records, until_step=until_step, should_stop=should_stop
            )

    path = write_study(tmp_path / "ctrl.yaml", "ctrl", {"lr": [1e-4, 2e-4]}, steps=400, eval_every=2)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    # a suite started in the background ignores SIGINT, and interrupt_main() then does nothing: Ctrl-C as a terminal
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with Store(url) as store:
            with pytest.raises(KeyboardInterrupt):
                SweepDriver(load_study(path), store, engine=CtrlC(), max_concurrent=2).run()
    finally:
        signal.signal(signal.SIGINT, previous)
    with Store(url) as store:
        interrupted = store.runs_frame("ctrl")
        summary = SweepDriver(load_study(path), store, engine=ReplayEngine()).run()
        runs, records = store.runs_frame("ctrl"), store.records_frame("ctrl")
    assert set(interrupted["status"]) <= {"paused", "pending"} and "paused" in set(interrupted["status"])
    assert set(interrupted["error"].dropna()) == {"interrupted"}
    assert summary.count("done") == 2 and list(runs["status"]) == ["done", "done"]
    assert not records.duplicated(["run_id", "step"]).any()


def test_status_tells_runs_a_live_driver_holds_from_runs_a_killed_one_left_running(db_url, tmp_path, cli):
    hold = (
        "import sys, time; from rlscale.db.store import Store; "
        "Store(sys.argv[1]).lock_study('held'); print('held', flush=True); time.sleep(600)"
    )
    with Store(db_url) as store:
        store.set_run_status(store.ensure_run("held", "a", {}, 0), "running")
        assert store.study_is_swept("held") is False
    holder = subprocess.Popen([sys.executable, "-c", hold, db_url], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        code, out, err = cli("status", "held", "--db", db_url, "--json")
        assert code == 0 and [row["sweep_running"] for row in json.loads(out)] == [True], err
        assert "1 in flight" in cli("status", "held", "--db", db_url)[1]
    finally:
        holder.kill()  # kill -9: its SQLite lock file stays behind, its PostgreSQL session ends
        holder.wait()
    deadline = time.time() + 30
    while json.loads(cli("status", "held", "--db", db_url, "--json")[1])[0]["sweep_running"] and time.time() < deadline:
        time.sleep(0.2)  # the server ends a dead client's session, and its lock, as soon as it notices
    assert json.loads(cli("status", "held", "--db", db_url, "--json")[1])[0]["sweep_running"] is False
    code, out, err = cli("status", "held", "--db", db_url)
    assert code == 0 and "no sweep is running: 1 run(s) marked running were left by one that ended" in " ".join(
        out.split()
    )


def test_a_second_driver_on_a_study_exits_2_naming_the_first_and_stores_nothing(db_url, tmp_path, cli):
    path = write_study(tmp_path / "busy.yaml", "busy", {"rollouts": [4]})
    hold = (
        "import sys, time; from rlscale.db.store import Store; "
        "Store(sys.argv[1]).lock_study('busy'); print('held', flush=True); time.sleep(600)"
    )
    holder = subprocess.Popen([sys.executable, "-c", hold, db_url], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        code, out, err = cli("sweep", path, "--db", db_url)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "study 'busy' is being swept by another driver" in err and f"pid {holder.pid} on" in err
        with Store(db_url) as store:
            assert "busy" not in store.study_names()  # nothing planned, nothing trained
    finally:
        holder.kill()  # kill -9: the lock goes with its process
        holder.wait()
    with Store(db_url) as store:
        deadline = time.time() + 60
        while True:  # the server sees the connection close a moment after the process dies
            try:
                store.lock_study("busy").release()
                break
            except UserError:
                assert time.time() < deadline, "the lock outlived its holder"
                time.sleep(0.2)


def test_the_sweeps_last_table_shows_each_runs_stored_compute_as_status_does(tmp_path):
    from rlscale.runner.sweep.state import planned_gpu_hours, run_states

    class LiveClock(ReplayEngine):
        """Reports live compute past its last record, as the builtin job's clock does while an evaluation ends."""

        def run(self, recipe, *, progress=None, **options):
            result = super().run(recipe, **options)
            progress({"step": result.steps, "gpu_hours": 0.01 * result.steps + 0.004})
            return result

    path = write_study(tmp_path / "live.yaml", "live", {"lr": [1e-4, 2e-4]}, steps=6, eval_every=2)
    with Store(f"sqlite:///{tmp_path / 'store.db'}") as store:
        driver = SweepDriver(load_study(path), store, engine=LiveClock())
        driver.run()
        stored = run_states(store.runs_frame("live"), store.records_frame("live"), planned_gpu_hours(driver.study))
    assert [(run.step, run.gpu_hours) for run in driver.runs] == [(run.step, run.gpu_hours) for run in stored]
    assert [run.gpu_hours for run in driver.runs] == pytest.approx([0.06, 0.06])
