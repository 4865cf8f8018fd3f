"""A TRL user's setup as it arrives, swept end to end as they run it (tests/data/trl_user_case/): their `trl grpo`
YAML written for GPUs (bf16), logging to trackio, TRL's accuracy_reward beside their own reward, local parquet data,
the `tiny` policy and a cosine schedule with a floor; a two-point study over n with no cost profile named and no Ray
started by hand. `rlscale sweep` trains both runs to their planned compute, prints a decision and exits 0, trackio
holds both runs under the study, and every recommend/export command it prints runs."""

import os
import shlex
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from rlscale.db.store import Store

CASE = Path(__file__).resolve().parent / "data" / "trl_user_case"
RLSCALE = str(Path(sys.executable).with_name("rlscale"))


def printed_commands(out: str) -> list[str]:
    """The rlscale commands a sweep prints as next steps (each on a line of its own, indented)."""
    return [line.strip() for line in out.splitlines() if line.strip().startswith("rlscale ")]


@pytest.mark.slow
def test_a_users_trl_yaml_sweeps_to_a_decision_and_the_printed_commands_run(tmp_path):
    from importlib.util import find_spec

    from rlscale.planner.planning import planned_runs
    from rlscale.planner.study_file import load_study

    missing = [name for name in ("trl", "trackio", "math_verify") if find_spec(name) is None]
    if missing:  # rlscale[runner] brings math_verify (TRL's extra), rlscale[trackers] trackio: make setup has both
        (pytest.fail if os.environ.get("CI") else pytest.skip)(f"the job's environment lacks {', '.join(missing)}")

    case = tmp_path / "case"
    shutil.copytree(CASE, case)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # no cluster named: rlscale starts one
    env.update(TRACKIO_DIR=str(tmp_path / "trackio"), COLUMNS="100")
    sweep = [RLSCALE, "sweep", "study.yaml", "--db", url, "--shared-dir", str(tmp_path / "shared")]
    done = subprocess.run(sweep, capture_output=True, text=True, cwd=case, env=env, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "decided:" in done.stdout or "no recommendation" in done.stdout, done.stdout[-3000:]

    planned = {run.name: run.gpu_hours for run in planned_runs(load_study(case / "study.yaml"))}
    with Store(url) as store:
        runs, records = store.runs_frame("trl_user_case"), store.records_frame("trl_user_case")
    assert sorted(runs["run"]) == ["n2", "n4"] and set(runs["status"]) == {"done"}
    for run_id, mine in records.groupby("run_id"):
        name = dict(zip(runs["run_id"], runs["run"]))[run_id]
        # ended at the step nearest its planned compute (runner.engine.ComputeStop), judged by the mean step cost
        # since the first record: within a step of it (the last or the mean), whatever this host's load
        mine = mine.sort_values("step")
        spent, steps = mine["gpu_hours"].to_numpy(), mine["step"].to_numpy()
        step_cost = max(spent[-1] - spent[-2], (spent[-1] - spent[0]) / (steps[-1] - steps[0]))
        assert abs(spent[-1] - planned[name]) <= max(0.05 * planned[name], step_cost)
        assert mine["val_reward"].notna().sum() >= 3

    tracked = sqlite3.connect(tmp_path / "trackio" / "trl_user_case.db")  # trackio: a project per study
    names = {row[0] for row in tracked.execute("SELECT DISTINCT run_name FROM metrics")}
    assert len(names) == 2

    commands = printed_commands(done.stdout)
    assert any(" recommend " in command for command in commands) and any(" export " in command for command in commands)
    for command in commands:
        words = shlex.split(command)
        if words[1] not in ("recommend", "export"):
            continue
        ran = subprocess.run([RLSCALE, *words[1:]], capture_output=True, text=True, cwd=case, env=env, timeout=300)
        assert ran.returncode == 0, (command, ran.stdout[-2000:], ran.stderr[-2000:])
