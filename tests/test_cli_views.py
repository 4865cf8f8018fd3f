"""The live sweep table and `rlscale status`: each run's compute against its plan (the unit that stops a run) and its
steps as a count, not against a planned step count that the compute stop overrides (#40 part 3)."""

import json

from helpers import run_cli
from rich.console import Console
from rlscale.planner.recipe import Recipe
from rlscale.runner.sweep.state import RunState

from rlscale.cli.views import compute_progress, sweep_table


def _table_text(runs, width=80) -> str:
    console = Console(record=True, width=width, force_terminal=False)
    console.print(sweep_table("quickstart", runs, "1 in flight (holding 2 CPU), 0 queued"))
    return console.export_text()


def test_compute_against_the_plan_and_steps_as_a_count():
    assert compute_progress(0.0349, 0.035) == ("0.0349 / 0.035", "100%")
    assert compute_progress(0.0175, 0.035) == ("0.0175 / 0.035", "50%")
    assert compute_progress(0.02, float("nan")) == ("0.02", "-")  # an imported run has no plan
    # a run past its planned steps (the compute stop decides) and one half way
    runs = [
        RunState(1, "bp16,n4", Recipe(steps=1084), 0, 0.035, status="done", step=2065, gpu_hours=0.0349),
        RunState(
            2, "bp16,n8", Recipe(steps=542), 0, 0.035, status="running", step=400, gpu_hours=0.0175, devices="2 CPU"
        ),
    ]
    text = _table_text(runs)
    assert "2065/1084" not in text and "/1084" not in text
    assert "2,065" in text and "0.0349 / 0.035" in text and "100%" in text and "50%" in text
    assert "0.0524 / 0.07" in text  # the total row: spent of planned over every run
    assert all(len(line) <= 80 for line in text.splitlines())


def test_status_prints_the_same_columns_and_keeps_its_json(workdir, capsys, monkeypatch):
    from helpers import bench, seed_isocompute

    url = f"sqlite:///{workdir / 'rl.db'}"
    truth, c_obs = bench.CASES["saturates_64"]
    seed_isocompute(url, "iso", truth, c_obs)
    code, out, err = run_cli(monkeypatch, capsys, "status", "iso", "--db", url)
    assert code == 0, err
    assert "hours / plan" in out and "%" in out
    code, out, err = run_cli(monkeypatch, capsys, "status", "iso", "--db", url, "--json")
    rows = json.loads(out)
    assert {"step", "steps", "gpu_hours", "planned_gpu_hours"} <= set(rows[0])  # the contract stays


def test_a_failed_runs_cause_is_shown_whole_under_the_table():
    from rlscale.cli.views import sweep_view

    why = "ImportError: accuracy_reward needs math_verify, which the job's environment (.venv-trl) does not have"
    runs = [
        RunState(1, "n2", Recipe(steps=100), 0, 0.035, status="failed", gpu_hours=0.001, note=why),
        RunState(2, "n4", Recipe(steps=100), 0, 0.035, status="done", step=100, gpu_hours=0.035),
    ]
    console = Console(record=True, width=80, force_terminal=False)
    console.print(sweep_view("trl", runs))
    text = " ".join(console.export_text().split())
    assert f"n2 failed: {why}" in text  # whole, wrapped, where the note column shows only its start
    assert "n4 failed" not in text


def test_the_report_names_each_failed_run_and_why(tmp_path):
    import pandas as pd

    from rlscale.views.report import failure_notes

    runs = pd.DataFrame(
        {
            "run_id": [1, 2],
            "run": ["n2", "n4"],
            "seed": [0, 0],
            "status": ["failed", "done"],
            "error": ["RuntimeError: job exited 1\nTraceback ...", None],
        }
    )
    assert failure_notes(runs) == ["n2 failed: RuntimeError: job exited 1"]
