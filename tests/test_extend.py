"""`rlscale sweep --extend K`: finished runs resume from their checkpoints to K times their planned compute, under
the same identity (recipe hash and seed), so nothing is trained twice; the sweep's end names the runs to extend and
the one command that does it when the fits or the optimal-n law are not identified."""

import json
import math

import numpy as np
import pandas as pd
import pytest
import yaml
from rlscale.db.store import Store
from rlscale.fitting.curves import CURVE_COLUMNS
from rlscale.fitting.rules.allocation import NextAllocation, next_allocation
from rlscale.fitting.rules.decision import Decision
from rlscale.fitting.rules.reasons import Reason
from rlscale.planner.study_file import load_study
from rlscale.runner.engine import ComputeStop, Engine, JobResult
from rlscale.runner.ray_head import connect, disconnect
from rlscale.runner.sweep.driver import SweepDriver

from rlscale.views.wording import db_flag, decision_commands, extend_command

STEP_HOURS = 0.0005  # the metered engine's cost of one step


def write_study(path, name: str, budget: float, rollouts=(2, 4)):
    path.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "method": "isocompute",
                "metric": "val_reward",
                "compute": {
                    "unit": "gpu_hours",
                    "budget": budget,
                    "scope": "per_run",
                    "profile": "tiny-cpu",
                    "min_steps": 5,
                },
                "parameters": {"rollouts": {"values": list(rollouts)}, "prompts_per_batch": {"values": [8]}},
                "recipe": {
                    "max_new_tokens": 8,
                    "eval_every": 10,
                    "eval_prompts": 32,
                    "eval_samples": 2,
                    "checkpoint_every": 10,
                    "async": "pipeline",
                    "max_staleness": 1,
                    "lr_reference_batch": 512,
                },
                "fit": {"points": "all"},
            }
        )
    )
    return path


class MeteredEngine(Engine):
    """Trains to the planned compute at STEP_HOURS a step after `startup_hours`, stopping by the engines' rule and
    resuming from its last checkpoint (kept per run key)."""

    name = "metered"

    def __init__(self, startup_hours: float = 0.0):
        self.startup_hours = startup_hours
        self.checkpoints: dict[str, tuple[int, float]] = {}
        self.resumed_from: list[tuple[str, int]] = []

    def run(
        self, recipe, *, run_key, on_records, until_step=None, should_stop=None, progress=None, gpu_hours=None, **_
    ):
        step, hours = self.checkpoints.get(run_key, (0, 0.0))
        self.resumed_from.append((run_key, step))
        if not step:
            hours = self.startup_hours
        records = [] if step else [{"step": 0, "gpu_hours": hours, "val_reward": 0.5, "metrics": {}}]
        stop = ComputeStop(gpu_hours, origin=(0, self.startup_hours))
        while step < recipe.steps * 10 and not stop.reached:
            step, hours = step + 1, hours + STEP_HOURS
            records.append(
                {"step": step, "gpu_hours": hours, "val_reward": 0.9 - 0.4 / (1 + hours / 0.002), "metrics": {}}
            )
            stop.reached = stop.reaches(step, hours)
        self.checkpoints[run_key] = (step, hours)
        on_records(records)
        return JobResult(steps=step, compute_reached=stop.reached)


def test_extend_resumes_finished_runs_to_the_larger_compute_under_the_same_identity(tmp_path, cli):
    engine = MeteredEngine()
    path = write_study(tmp_path / "grow.yaml", "grow", 0.01)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with Store(url) as store:
        first = SweepDriver(load_study(path), store, engine=engine)
        first.run()
        before = {run.run_id: (run.recipe.steps, run.planned_gpu_hours, run.step) for run in first.runs}
        records_before = store.records_frame("grow")

        extended = SweepDriver(load_study(path).model_copy(update={"extend": 2.0}), store, engine=engine)
        runs = extended.plan()
        assert [run.run_id for run in runs] == list(before)  # the same runs: recipe hash and seed unchanged
        assert set(store.runs_frame("grow")["status"]) == {"paused"}  # queued again, as `status` reads it
        for run in runs:
            steps, planned, _ = before[run.run_id]
            assert run.status == "paused" and run.recipe.steps == math.ceil(2 * steps)
            assert run.planned_gpu_hours == pytest.approx(2 * planned)
        summary = extended.run()
        records = store.records_frame("grow")
        assert len(store.runs_frame("grow")) == 2 and summary.count("done") == 2

        # a third sweep at the same extension finds every run done: nothing runs again
        again = SweepDriver(load_study(path).model_copy(update={"extend": 2.0}), store, engine=engine)
        assert [run.status for run in again.plan()] == ["done", "done"]

    # `rlscale status` shows the extended plan, steps and compute alike, as the driver ran it
    code, out, err = cli("status", "grow", "--db", url, "--json")
    assert code == 0, err
    shown = {row["run_id"]: row for row in json.loads(out)}
    for run in runs:
        assert shown[run.run_id]["steps"] == run.recipe.steps == math.ceil(2 * before[run.run_id][0])
        assert shown[run.run_id]["planned_gpu_hours"] == pytest.approx(run.planned_gpu_hours)
    code, out, err = cli("sweep", str(path), "--extend", "2", "--dry-run", "--json")  # and so does the dry-run
    assert code == 0, err
    assert sorted(point["recipe"]["steps"] for point in json.loads(out)) == sorted(run.recipe.steps for run in runs)

    resumed = dict(engine.resumed_from[2:])
    assert len(engine.resumed_from) == 4  # two first runs, two resumptions, none for the third sweep
    assert not records.duplicated(["run_id", "step"]).any()
    for run_id, rows in records.groupby("run_id"):
        _, planned, last = before[run_id]
        assert resumed[extended.run_key(next(r for r in runs if r.run_id == run_id))] == last  # from its checkpoint
        assert list(rows["step"]) == list(range(int(rows["step"].max()) + 1))  # the steps go on, none skipped
        assert rows["gpu_hours"].max() == pytest.approx(2 * planned, abs=STEP_HOURS)
    kept = records.merge(records_before, on=["run_id", "step"], suffixes=("", "_before"))
    assert len(kept) == len(records_before)  # what was trained before is kept as it was
    assert np.allclose(kept["gpu_hours"], kept["gpu_hours_before"])


def test_a_restarted_driver_and_extend_read_the_stop_as_the_engine_made_it(tmp_path):
    # a job's start-up (40 steps' worth) sits in each run's first record; the engine stopped by ComputeStop
    engine = MeteredEngine(startup_hours=40 * STEP_HOURS)
    path = write_study(tmp_path / "slow.yaml", "slow", 0.03)
    with Store(f"sqlite:///{tmp_path / 'store.db'}") as store:
        first = SweepDriver(load_study(path), store, engine=engine)
        first.run()
        assert [run.status for run in first.runs] == ["done", "done"]
        for run in first.runs:  # a driver killed between a run's last records and its status
            store.set_run_status(run.run_id, "running")
        again = SweepDriver(load_study(path), store, engine=engine)
        assert [run.status for run in again.plan()] == ["done", "done"]  # the records say so; nothing runs again
        again.run()
        assert len(engine.resumed_from) == 2
        # --extend 1.5: each run is short of its larger plan and resumes, then ends where the engine stops it
        grown = SweepDriver(load_study(path).model_copy(update={"extend": 1.5}), store, engine=engine)
        assert [run.status for run in grown.plan()] == ["paused", "paused"]
        grown.run()
        settled = SweepDriver(load_study(path).model_copy(update={"extend": 1.5}), store, engine=engine)
        assert [run.status for run in settled.plan()] == ["done", "done"]
        assert len(engine.resumed_from) == 4


def _curves(rows):
    base = {
        "run_id": None,
        "prompts_per_batch": 16,
        "status": "done",
        "B": 1.5,
        "R0": 0.5,
        "A_lo": 0.85,
        "A_hi": 0.95,
        "r2": 0.99,
        "n_points": 20,
        "reason": "",
        "c_min": 0.001,
        "truncation_rate": 0.0,
    }
    return pd.DataFrame([{**base, **row} for row in rows], columns=CURVE_COLUMNS)


def test_next_allocation_extends_every_run_by_what_the_least_advanced_unidentified_fit_needs():
    identified = {"A": 0.9, "C_mid": 0.005, "c_max": 0.035, "identified": True}
    curves = _curves(
        [
            {"run": "n2", "rollouts": 2, **identified},
            {"run": "n4", "rollouts": 4, **identified},
            {
                "run": "n16",
                "rollouts": 16,
                "A": 1.0,
                "C_mid": 0.06,
                "c_max": 0.035,
                "identified": False,
                "reason": "has not passed the inflection: max C 0.035 < C_mid 0.06",
            },
        ]
    )
    plan = next_allocation(curves, law_identified=False)
    # n16 needs twice its C_mid (0.12 > 3.4x what it reached): 4x, and every run goes to it (equal compute)
    assert plan.factor == 4 and [run["target"] for run in plan.runs] == pytest.approx([0.14] * 3)
    assert [run["why"] != "" for run in plan.runs] == [False, False, True]
    assert plan.goal == Reason("identify_fits_and_law", {"unidentified": 1, "runs": 3})

    settled = _curves([{"run": "n2", "rollouts": 2, **identified}, {"run": "n4", "rollouts": 4, **identified}])
    law_only = next_allocation(settled, law_identified=False)
    assert law_only.factor == 2 and law_only.goal.code == "identify_law"  # the law alone: twice the compute
    assert next_allocation(settled, law_identified=True) is None  # nothing left to identify
    assert next_allocation(settled, law_identified=None) is None  # a study with no law to fit


def _decision(tmp_path, study, plan, **fields) -> tuple:
    """(Decision, its commands) of study `grow` at 0.035 GPU-hours with the next allocation `plan`."""
    decision = Decision(
        study=study.name,
        kind="allocation",
        unit="gpu_hours",
        budget=0.035,
        compute=0.035,
        export_format="verl",
        next_allocation=plan,
        **fields,
    )
    return decision, decision_commands(decision, study_file=tmp_path / "grow.yaml")


def test_the_sweep_ends_with_the_one_command_that_extends_it_in_80_columns(tmp_path):
    from rlscale.cli.commands.sweep import _closing_lines

    study = load_study(write_study(tmp_path / "grow.yaml", "grow", 0.035, rollouts=(2, 4, 8, 16)))
    plan = NextAllocation(
        factor=2.0,
        goal=Reason("identify_fits_and_law", {"unidentified": 1, "runs": 4}),
        runs=[
            {"run": f"n{n}", "compute": 0.035, "target": 0.07, "why": "A sits at its bound 1" if n == 16 else ""}
            for n in (2, 4, 8, 16)
        ],
    )
    payload = {
        "done": 4,
        "stopped": 0,
        "failed": 0,
        "runs": 4,
        "wall_seconds": 470.0,
        "gpu_hours": 0.14,
        "budget": 0.14,
        "planned_gpu_hours": 0.14,
        "db": "sqlite:///store.db",
    }
    refusal = (
        Reason(
            "law_not_identified",
            {
                "law": Reason(
                    "frontier_few_n",
                    {"rollouts": [2, 4, 8], "compute_lo": 0.001, "compute_hi": 0.035, "min_distinct": 3},
                )
            },
        ),
        Reason("runs_not_pinned", {"moved": [2, 4, 8], "runs": [{"run": "n16", "why": "A sits at its bound 1"}]}),
    )
    decision, commands = _decision(tmp_path, study, plan, refusal=refusal)
    assert commands["extend"] == extend_command(tmp_path / "grow.yaml", None, 2.0)
    lines = _closing_lines(study, None, payload, decision, commands)
    assert lines[-1] == f"  rlscale sweep {tmp_path / 'grow.yaml'} --extend 2{db_flag(None)}"
    assert sum(line.startswith("not yet") or line.startswith("decided") for line in lines) == 1
    assert "- n16: A sits at its bound 1" in lines
    from rlscale.cli.console import wrapped

    shown = [text for line in lines[:-1] for text in wrapped(line, rest="  ", width=80).splitlines()]
    assert all(len(text) <= 80 for text in shown if "sqlite:" not in text)


def test_a_decision_without_a_law_also_names_the_extension_that_would_decide_larger_budgets(tmp_path):
    from rlscale.fitting.rules.recommend import Recommendation

    from rlscale.cli.commands.sweep import _closing_lines

    study = load_study(write_study(tmp_path / "grow.yaml", "grow", 0.035, rollouts=(2, 4, 8, 16)))
    rec = Recommendation(
        budget=0.035,
        prompts_per_batch=16,
        rollouts=8,
        steps=440,
        n_star=8.0,
        n_star_interval=(8, 8),
        predicted_reward=0.886,
        predicted_interval=(0.866, 0.905),
        predicted_from="n8",
        extrapolation=1.0,
        law={},
        law_identified=False,
        basis=Reason(
            "within_data",
            {"compute": 0.035, "run": "n8", "rollouts": 8, "reward": 0.886, "within_band": [], "noise_band": 0.02},
        ),
    )
    plan = NextAllocation(
        factor=2.0,
        goal=Reason("identify_law", {"unidentified": 0, "runs": 4}),
        runs=[{"run": f"n{n}", "compute": 0.035, "target": 0.07, "why": ""} for n in (2, 4, 8, 16)],
    )
    payload = {
        "done": 4,
        "stopped": 0,
        "failed": 0,
        "runs": 4,
        "wall_seconds": 415.0,
        "gpu_hours": 0.14,
        "budget": 0.035,
        "planned_gpu_hours": 0.14,
        "db": "sqlite:///store.db",
    }
    decision, commands = _decision(tmp_path, study, plan, recommendation=rec, recipe=study.recipe.to_json())
    lines = _closing_lines(study, None, payload, decision, commands)
    assert sum(line.startswith("decided") or line.startswith("not yet") for line in lines) == 1
    assert lines[-1] == f"  rlscale sweep {tmp_path / 'grow.yaml'} --extend 2{db_flag(None)}"
    extension = next(line for line in lines if line.startswith("to decide past"))
    assert "0.035" in extension and "2x" in extension and extension.endswith(":")  # the sentence is whole
    decision, commands = _decision(tmp_path, study, None, recommendation=rec, recipe=study.recipe.to_json())
    lines = _closing_lines(study, None, payload, decision, commands)
    assert not any(line.startswith("to decide past") for line in lines)
    # the decision ends the output
    assert lines[-1] == f"  rlscale export --format verl --study grow --budget 0.035{db_flag(None)}"


@pytest.mark.slow
def test_sweep_extend_resumes_real_runs_from_their_checkpoints_and_refits(tmp_path, monkeypatch, cli):
    pytest.importorskip("ray")
    pytest.importorskip("vllm")
    import rlscale.runner.builtin.job as job

    monkeypatch.setenv("RLSCALE_CACHE", str(tmp_path / "cache"))  # checkpoints of this test only
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    jobs = []
    real = job.run_job

    def recorded(recipe, **kwargs):
        result = real(recipe, **kwargs)
        jobs.append((kwargs["run_key"], result["resumed_from"], result["steps"]))
        return result

    monkeypatch.setattr(job, "run_job", recorded)
    path = write_study(tmp_path / "grow.yaml", "grow", 0.004)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    sweep = ["sweep", str(path), "--db", url, "--out", str(tmp_path / "reports"), "--json"]
    # this process's own Ray: the sweeps' builtin engine joins it here (not in a process of its own), so the jobs
    # recorded above are seen
    head = connect(None, cpus=2)
    try:
        code, out, err = cli(*sweep)
        assert code == 0, err[-2000:]
        first = json.loads(out)
        with Store(url) as store:
            before = store.records_frame("grow")
        code, out, err = cli(*sweep, "--extend", "2")
        assert code == 0, err[-2000:]
    finally:
        disconnect(head)
    last = before.groupby("run_id")["step"].max()
    # an IsoCompute sweep decides for the compute every run reached at its last evaluation
    evaluated = before[before["val_reward"].notna()]
    assert first["budget"] == pytest.approx(float(evaluated.groupby("run_id")["gpu_hours"].max().min()))
    second = json.loads(out)
    with Store(url) as store:
        records, runs = store.records_frame("grow"), store.runs_frame("grow")
    assert len(runs) == 2 and list(runs["status"]) == ["done", "done"]  # the same two runs, finished again
    assert second["planned_gpu_hours"] == pytest.approx(2 * first["planned_gpu_hours"])
    assert second["gpu_hours"] >= 0.9 * second["planned_gpu_hours"]  # each ran on to about twice its compute
    resumed = jobs[2:]
    assert len(resumed) == 2 and all(start > 0 for _, start, _ in resumed)  # from checkpoints, not from step 0
    assert sorted(start for _, start, _ in resumed) == sorted(last)  # each from the step it had ended at
    assert not records.duplicated(["run_id", "step"]).any()
    for run_id, rows in records.groupby("run_id"):
        assert list(rows["step"]) == list(range(int(rows["step"].max()) + 1)) and rows["step"].max() > last[run_id]
        assert rows["gpu_hours"].is_monotonic_increasing
    kept = records.merge(before, on=["run_id", "step"], suffixes=("", "_before"))
    assert len(kept) == len(before) and np.allclose(kept["gpu_hours"], kept["gpu_hours_before"])
    # the report's fits were made again, on every evaluation of the longer curves
    earlier = {fit["run"]: fit["n_points"] for fit in first["report"]["fits"]}
    fitted = {fit["run"]: fit["n_points"] for fit in second["report"]["fits"]}
    assert set(fitted) == set(earlier) and all(fitted[run] > earlier[run] for run in fitted)
