"""The verl engine's job lifecycle against a real local Ray cluster through the Jobs API (`ray start --head` on
loopback, dashboard and job agent included): submit, poll, read logs, pause at a rung, resubmit from the
checkpoint, crash and retry, stop on the driver's rule, and a sweep that survives kill -9 of its driver. The job is
tests/verl_standin.py, which reads verl's overrides and writes what verl's FileLogger writes (no GPU here)."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import kill_driver_when, spawn, tail
from rlscale.db.store import Store
from rlscale.planner.recipe import Recipe

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parent
RECIPE = Recipe(
    engine="verl",
    model="/models/stand-in",
    steps=20,
    prompts_per_batch=4,
    rollouts=2,
    eval_every=5,
    eval_prompts=4,
    eval_samples=2,
    checkpoint_every=5,
    async_mode="sync",
)


def engine(cluster, tmp_path, **env):
    from rlscale.runner.verl.engine import VerlEngine

    return VerlEngine(
        ray_address=cluster,
        shared_dir=tmp_path / "shared",
        python=sys.executable,
        module="verl_standin",
        poll_seconds=0.2,
        env_vars={"PYTHONPATH": str(TESTS), "STANDIN_STEP_SECONDS": "0.05", **env},
    )


def test_a_run_pauses_at_a_rung_resumes_from_its_checkpoint_and_a_crash_is_retried(cluster, tmp_path):
    from ray.job_submission import JobSubmissionClient
    from rlscale.runner.verl.engine import VerlJobFailed

    crash = tmp_path / "crash"
    verl = engine(cluster, tmp_path, STANDIN_CRASH_FILE=str(crash))
    got = []
    # rung 1: the job ends at step 5, checkpointed there
    result = verl.run(RECIPE, run_key="life-1-aa", on_records=got.extend, until_step=5)
    assert result.steps == 5 and not result.stopped
    assert [r["step"] for r in got] == [0, 1, 2, 3, 4, 5]
    assert got[0]["val_reward"] == pytest.approx(0.2) and got[5]["val_reward"] is not None
    # rung 2, crashing at step 8 (after the checkpoint at 5): the job fails with the Jobs API's reason
    crash.write_text("8")
    with pytest.raises(VerlJobFailed, match="life-1-aa-2 FAILED"):
        verl.run(RECIPE, run_key="life-1-aa", on_records=got.extend, until_step=10)
    # the retry resumes from step 5's checkpoint: steps 6, 7 come from it alone (the crashed job's were never
    # handed on: no checkpoint held them)
    result = verl.run(RECIPE, run_key="life-1-aa", on_records=got.extend, until_step=10)
    assert result.steps == 10
    steps = [r["step"] for r in got]
    assert sorted(set(steps)) == list(range(11)) and steps.count(6) == 1 and steps.count(9) == 1
    # GPU-hours: one GPU x (the failed jobs' wall time, then this job's step time): never decreasing by step
    firsts = {}
    for record in got:
        firsts.setdefault(record["step"], record)
    hours = [firsts[s]["gpu_hours"] for s in range(11)]
    assert hours == sorted(hours) and hours[-1] > hours[5]
    jobs = sorted(
        j.submission_id for j in JobSubmissionClient(cluster).list_jobs() if j.submission_id.startswith("life-1-aa-")
    )
    assert jobs == ["life-1-aa-1", "life-1-aa-2", "life-1-aa-3"]
    # a stop from the driver's rule at a checkpoint ends the job there; steps of 0.5 s leave the stop 2.5 s to land
    # before the job would reach its end (at 0.05 s a busy host let it finish first)
    verl = engine(cluster, tmp_path, STANDIN_STEP_SECONDS="0.5")
    result = verl.run(
        RECIPE, run_key="life-1-aa", on_records=got.extend, should_stop=lambda: "asymptote below the best run's"
    )
    assert result.stopped and result.stop_reason == "asymptote below the best run's" and 15 <= result.steps < 20
    assert str(JobSubmissionClient(cluster).get_job_status("life-1-aa-4").value) == "STOPPED"


def test_a_run_ends_where_its_measured_gpu_hours_reach_the_plan(cluster, tmp_path):
    verl = engine(cluster, tmp_path)
    got = []
    budget = 8 * 0.05 / 3600  # one GPU x 8 steps of the stand-in's 0.05 s (verl's timing_s/step)
    result = verl.run(RECIPE, run_key="budget-1-bb", on_records=got.extend, gpu_hours=budget)
    assert result.compute_reached and not result.stopped
    # the last record is the step nearest the plan (runner/engine.py's rule): within half a step of it
    per_step = 0.05 / 3600
    assert abs(got[-1]["gpu_hours"] - budget) <= per_step / 2 + 1e-12
    assert result.steps >= got[-1]["step"] >= 7 and result.steps < RECIPE.steps


DRIVER = textwrap.dedent("""
    import faulthandler, signal, sys
    faulthandler.register(signal.SIGUSR1)  # a test that finds it stuck asks for its threads' stacks
    # Ctrl-C as a terminal delivers it, even when this suite was started in the background (SIGINT then ignored)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from rlscale.db.store import Store
    from rlscale.planner.study_file import load_study
    from rlscale.runner.sweep.driver import SweepDriver
    study_file, url, address, shared, tests = sys.argv[1:]
    options = {"verl": {"shared_dir": shared, "python": sys.executable, "module": "verl_standin", "poll_seconds": 0.2,
                        "env_vars": {"PYTHONPATH": tests, "STANDIN_STEP_SECONDS": "0.3"}}}
    with Store(url) as store:
        SweepDriver(load_study(study_file), store, ray_address=address, engine_options=options).run()
""")


def both_past_step_4(records) -> bool:
    counts = records.groupby("run_id").size()
    return len(counts) == 2 and min(counts) >= 4


def test_a_sweep_of_verl_jobs_survives_kill_9_of_its_driver_with_two_runs_in_flight(cluster, tmp_path):
    import yaml
    from ray.job_submission import JobSubmissionClient

    study = tmp_path / "killverl.yaml"
    recipe = {
        k: v
        for k, v in RECIPE.to_json().items()
        if k
        in (
            "engine",
            "model",
            "steps",
            "prompts_per_batch",
            "eval_every",
            "eval_prompts",
            "eval_samples",
            "checkpoint_every",
            "async",
        )
    }
    study.write_text(
        yaml.safe_dump(
            {"name": "killverl", "method": "grid", "recipe": recipe, "parameters": {"rollouts": {"values": [2, 4]}}}
        )
    )
    url = f"sqlite:///{tmp_path / 'store.db'}"
    args = [sys.executable, "-c", DRIVER, str(study), url, cluster, str(tmp_path / "shared"), str(TESTS)]
    # both runs' jobs mid-way: kill the driver, not the jobs
    kill_driver_when(args, url, "killverl", both_past_step_4, seconds=180)
    restarted = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    with Store(url) as store:
        records, runs = store.records_frame("killverl"), store.runs_frame("killverl")
    assert list(runs["status"]) == ["done", "done"]
    assert not records.duplicated(["run_id", "step"]).any()
    for _, steps in records.groupby("run_id")["step"]:
        assert sorted(steps) == list(range(21))  # nothing lost: the lines written while no driver read them too
    # the restarted driver adopted the running job (or read the finished one's log) rather than submitting another
    jobs = [
        j.submission_id for j in JobSubmissionClient(cluster).list_jobs() if j.submission_id.startswith("killverl-")
    ]
    assert len(jobs) == 2 and all(job.endswith("-1") for job in jobs)


def _study(tmp_path, name: str, parameters: dict, **recipe) -> Path:
    import yaml

    keys = (
        "engine",
        "model",
        "steps",
        "prompts_per_batch",
        "eval_every",
        "eval_prompts",
        "eval_samples",
        "checkpoint_every",
        "async",
    )
    base = {k: v for k, v in RECIPE.to_json().items() if k in keys}
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        yaml.safe_dump({"name": name, "method": "grid", "recipe": {**base, **recipe}, "parameters": parameters})
    )
    return path


def _timeline(cluster, prefix: str) -> list[tuple[float, float, int]]:
    """(start s, end s, GPUs) of each job of the sweep, from the Jobs API's clock."""
    from ray.job_submission import JobSubmissionClient

    jobs = [j for j in JobSubmissionClient(cluster).list_jobs() if (j.submission_id or "").startswith(prefix)]
    return [(j.start_time / 1000, j.end_time / 1000, int(j.metadata["devices"])) for j in jobs if j.end_time]


def test_a_sweep_runs_jobs_concurrently_admitted_by_free_gpus_and_finishes_every_run(cluster, tmp_path):
    from rlscale.planner.study_file import load_study
    from rlscale.runner.sweep.driver import SweepDriver

    # six runs of 2 and 4 GPUs on the cluster's 8 logical GPUs
    study = load_study(
        _study(tmp_path, "fill", {"trainer_devices": {"values": [2, 4]}, "rollouts": {"values": [2, 4, 8]}})
    )
    options = {
        "verl": {
            "shared_dir": tmp_path / "shared",
            "python": sys.executable,
            "module": "verl_standin",
            "poll_seconds": 0.2,
            "env_vars": {"PYTHONPATH": str(TESTS), "STANDIN_STEP_SECONDS": "0.3"},
        }
    }
    seen = []
    with Store(f"sqlite:///{tmp_path / 'store.db'}") as store:
        driver = SweepDriver(
            study,
            store,
            ray_address=cluster,
            engine_options=options,
            max_retries=0,
            on_update=lambda runs: seen.append(sum(run.status in ("starting", "running") for run in runs)),
        )
        summary = driver.run()
        records = store.records_frame("fill")
    assert summary.count("done") == 6, [(run.name, run.status, run.note) for run in summary.runs]
    assert not records.duplicated(["run_id", "step"]).any()
    assert all(sorted(steps) == list(range(21)) for _, steps in records.groupby("run_id")["step"])
    jobs = _timeline(cluster, "fill-")
    assert len(jobs) == 6  # one job a run: none failed the GPU check and came again
    moments = sorted({t for start, end, _ in jobs for t in (start, end)})
    in_use = [sum(g for start, end, g in jobs if start <= t < end) for t in moments]
    assert max(in_use) <= 8  # never more GPUs than the cluster has, by the Jobs API's own clock
    assert max(sum(1 for s, e, _ in jobs if s <= t < e) for t in moments) >= 2  # the jobs ran side by side
    # the first wave: three 2-GPU runs admitted together on the 8 GPUs (the 4-GPU ones wait for room), by the
    # driver's own states, whatever the host's speed
    assert max(seen) >= 3


def test_a_job_that_finds_its_gpus_taken_goes_back_to_the_queue_and_is_not_failed(cluster, tmp_path):
    from ray.job_submission import JobSubmissionClient
    from rlscale.runner.engine import DevicesUnavailable

    client = JobSubmissionClient(cluster)
    hold = textwrap.dedent("""
        import ray, time
        from ray.util.placement_group import placement_group
        ray.init()
        ray.get(placement_group([{"GPU": 1}] * 6).ready())
        open(HELD, "w").close()
        time.sleep(120)
    """).replace("HELD", repr(str(tmp_path / "held")))
    client.submit_job(entrypoint=f"{sys.executable} -c {shlex_quote(hold)}", submission_id="someone-else")
    try:
        deadline = time.time() + 60
        while not (tmp_path / "held").exists() and time.time() < deadline:
            time.sleep(0.2)
        verl = engine(cluster, tmp_path)
        with pytest.raises(DevicesUnavailable, match="Total available GPUs 2.0 is less than total desired GPUs 4"):
            verl.run(RECIPE.model_copy(update={"trainer_devices": 4}), run_key="taken-1-cc", on_records=list)
    finally:
        client.stop_job("someone-else")


def shlex_quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def test_ctrl_c_of_a_sweep_stops_the_jobs_it_started(cluster, tmp_path):
    from ray.job_submission import JobSubmissionClient

    # jobs that never end on their own (100,000 steps of 0.3 s): only the Ctrl-C can stop them, however busy the host
    study = _study(tmp_path, "interrupt", {"rollouts": {"values": [2, 4]}}, steps=100_000)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    args = [sys.executable, "-c", DRIVER, str(study), url, cluster, str(tmp_path / "shared"), str(TESTS)]
    driver = spawn(args, log := tmp_path / "driver.log")
    client = JobSubmissionClient(cluster)

    def running() -> list[str]:
        return [
            j.submission_id
            for j in client.list_jobs()
            if (j.submission_id or "").startswith("interrupt-") and str(j.status.value) == "RUNNING"
        ]

    try:
        deadline = time.time() + 180
        while len(running()) < 2 and time.time() < deadline and driver.poll() is None:
            time.sleep(0.5)
        assert len(running()) == 2, tail(log) if driver.poll() is not None else "jobs not up"
        driver.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            driver.wait(300)
        except subprocess.TimeoutExpired:
            driver.send_signal(signal.SIGUSR1)
            time.sleep(2)
            os.killpg(driver.pid, signal.SIGKILL)
            pytest.fail(f"the driver did not end after Ctrl-C; its threads:\n{tail(log, 6000)}")
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    assert running() == []
    jobs = [j for j in client.list_jobs() if (j.submission_id or "").startswith("interrupt-")]
    assert len(jobs) == 2 and {str(j.status.value) for j in jobs} == {"STOPPED"}
