"""What the Jobs-API engines (verl, TRL) share, as pure pieces: a failed job's reason read from its own log, the
where every dry-run shows, the metadata every submission carries, and a close that only forgives a cluster that is
gone. Logs below are as Ray's Jobs API returns them for a TRL job and a verl job."""

import pytest
from rlscale.planner.recipe import Recipe
from rlscale.runner.jobs_api import JobsApiEngine, RunDir, Submission, failure_message, last_exception_line

TRL_IMPORT = """Loading the dataset...
Traceback (most recent call last):
  File "/work/.venv/lib/python3.11/site-packages/rlscale/runner/trl/setup_train.py", line 40, in main
    rewards = load_rewards(config)
  File "/work/.venv/lib/python3.11/site-packages/trl/rewards/accuracy_rewards.py", line 19, in <module>
    from math_verify import LatexExtractionConfig, parse, verify
ModuleNotFoundError: No module named 'math_verify'
"""
# a verl job: the driver's traceback wraps the actor's; the actor's lines carry Ray's prefix
VERL_ACTOR = """(TaskRunner pid=2301) Traceback (most recent call last):
(TaskRunner pid=2301)   File "verl/trainer/ppo/ray_trainer.py", line 88, in create_resource_pool
(TaskRunner pid=2301)     self._check_resource_available()
(TaskRunner pid=2301) ValueError: Total available GPUs 4 is less than total desired GPUs 8
Traceback (most recent call last):
  File "verl/trainer/main_ppo.py", line 99, in run_ppo
    ray.get(runner.run.remote(config))
ray.exceptions.RayTaskError(ValueError): ray::TaskRunner.run() (pid=2301, ip=10.0.0.2)
"""


@pytest.mark.parametrize(
    "log, reason",
    [
        (TRL_IMPORT, "ModuleNotFoundError: No module named 'math_verify'"),
        (VERL_ACTOR, "ray.exceptions.RayTaskError(ValueError): ray::TaskRunner.run() (pid=2301, ip=10.0.0.2)"),
        (VERL_ACTOR.split("Traceback (most recent call last):\n  File")[0], "ValueError: Total available GPUs 4 is "
         "less than total desired GPUs 8"),
        ("step 3\nCUDA out of memory.\nRuntimeError: CUDA error: out of memory\nexiting", "RuntimeError: CUDA error: "
         "out of memory"),
        ("step 3\nkilled\n", None),
    ],
)  # fmt: skip
def test_a_failed_jobs_reason_is_the_last_exception_its_log_shows(log, reason):
    assert last_exception_line(log) == reason


def test_the_failure_says_the_reason_first_then_the_job_and_its_log():
    text = failure_message("trl", "s-1-abc-2", "FAILED", "Job entrypoint command failed with exit code 1", TRL_IMPORT)
    first, second, *log = text.splitlines()
    assert first == "ModuleNotFoundError: No module named 'math_verify'"  # what the store keeps as the run's error
    assert second == "trl job s-1-abc-2 FAILED: Job entrypoint command failed with exit code 1"
    assert "math_verify" in log[-1] and len(text) < 2000  # the driver keeps the last 2,000 characters: all of it
    # no exception in the log: the Jobs API's own reason comes first
    stopped = failure_message("verl", "j", "STOPPED", "stopped by user", "bye")
    assert stopped.splitlines()[0] == "verl job j STOPPED: stopped by user"


class OneJob(JobsApiEngine):
    """A Jobs-API engine whose job is a shell command: what the shared algorithm adds to any engine's job."""

    name = "one"

    def submission(self, recipe, run_dir: RunDir, submission_id: str, *, until_step: int) -> Submission:
        return Submission(submission_id, "true", devices=2, until_step=until_step, metadata={"mine": "1"})

    def line_reader(self, recipe):
        raise AssertionError("not followed here")

    def checkpointed_step(self, recipe, run_dir: RunDir) -> int:
        return 0

    def dry_run_job(self, recipe, run_dir: RunDir, submission_id: str, *, until_step: int) -> dict:
        return {"entrypoint": "true", "until": until_step}


def test_every_job_carries_its_run_and_the_compute_before_it_and_every_dry_run_says_where(tmp_path):
    engine = OneJob(shared_dir=tmp_path, ray_address="http://head:8265")
    job = engine.job(Recipe(steps=20), "s-1-abc", 3, until_step=20, base_device_seconds=36.5)
    assert job.submission_id == "s-1-abc-3"
    assert job.metadata == {"mine": "1", "rlscale_run": "s-1-abc", "base_gpu_seconds": "36.5"}
    shown = engine.dry_run(Recipe(steps=20), "RUN_KEY", gpu_hours=1.0)
    assert shown == {
        "ray_address": "http://head:8265",
        "submission_id": "RUN_KEY-1",
        "log_file": str(tmp_path / "RUN_KEY" / "logs" / "RUN_KEY-1.jsonl"),
        "entrypoint": "true",
        "until": 200,  # a run that ends at its compute may go to COMPUTE_STEP_CAP x its steps
    }


class Client:
    """A Jobs API client that answers get_job_status with `failure`."""

    def __init__(self, failure: Exception):
        self.failure = failure

    def get_job_status(self, job):
        raise self.failure


def test_close_forgives_a_cluster_that_is_gone_and_nothing_else(tmp_path):
    engine = OneJob(shared_dir=tmp_path)
    engine._started, engine._client = {"s-1-abc-1"}, Client(ConnectionError("head gone"))
    engine.close()  # the head died with the sweep: nothing left to stop
    engine = OneJob(shared_dir=tmp_path)
    engine._started, engine._client = {"s-1-abc-1"}, Client(KeyError("status"))
    with pytest.raises(KeyError):  # a bug is not a dead cluster
        engine.close()


def test_a_step_is_stored_once_a_checkpoint_holds_it_and_the_rest_waits_for_the_jobs_end():
    from rlscale.runner.jobs_api import Following

    stored = []
    run = Following(recipe=None, run_dir=None, maker=None, budget=None, on_records=stored.extend)
    run.pending += [{"step": step} for step in range(6)]
    run.store(0)  # step 0 (the job's start) needs no checkpoint
    run.store(3)
    assert [r["step"] for r in stored] == [0, 1, 2, 3] and [r["step"] for r in run.pending] == [4, 5]
    run.store(3)  # nothing new: nothing handed twice
    run.store(None)  # the job ended well (or reached its plan): all of it
    assert [r["step"] for r in stored] == list(range(6)) and run.pending == []


def test_step_0_is_stored_only_once_a_checkpoint_or_the_job_holds_it():
    from rlscale.runner.jobs_api import Following

    stored = []
    run = Following(recipe=None, run_dir=None, maker=None, budget=None, on_records=stored.extend)
    run.pending = [{"step": 0}, {"step": 1}, {"step": 2}, {"step": 3}]
    run.store(0)  # no checkpoint yet: a job killed now leaves nothing stored, and its redo measures step 0 again
    assert stored == [] and len(run.pending) == 4
    run.store(2)
    assert [r["step"] for r in stored] == [0, 1, 2] and run.pending == [{"step": 3}]
    run.store(None)
    assert [r["step"] for r in stored] == [0, 1, 2, 3] and run.pending == []
