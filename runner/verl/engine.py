"""The `verl` engine: a run is a chain of verl jobs on a Ray cluster, submitted and followed through Ray's Jobs API.

A job's submission id is `<run key>-<k>` (k = 1, 2, ...: the run's k-th job), so a restarted driver finds a run's
jobs on the cluster, adopts the one still running and replays the logs of the finished ones (the store keeps each
(run, step) once). A job pauses a run at a rung by ending at that step (verl checkpoints at its last step); the next
job resumes from the run's checkpoint directory (trainer.resume_mode=auto). A crashed job raises; the driver's
retry submits the next job, which resumes from the last checkpoint. The driver reads each job's file-logger JSONL
from the shared directory while it runs (job.py says what lives there).
"""

import os
import shutil
import time
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path

from rlscale.base.settings import cache_dir
from rlscale.runner.engine import DevicesUnavailable, Engine, JobResult
from rlscale.runner.jobs_api import RUNNING, JobsApiEngine, report_progress, run_jobs, stop_job
from rlscale.runner.jobs_api import base_seconds as _base
from rlscale.runner.jobs_api import wall_seconds as _wall_seconds

from .job import ENTRYPOINT, REWARD_IMPORTS, Job, RunDir, job_devices, make_job, val_reward_metric
from .logs import LogTail, RecordMaker

# what verl 0.9.1 raises at start when the cluster lacks the GPUs its pools need
# (ResourcePoolManager._check_resource_available in verl/trainer/ppo/ray_trainer.py)
GPUS_TAKEN = "Total available GPUs"


class VerlJobFailed(RuntimeError):
    """A verl job ended FAILED or STOPPED by someone else; the message carries the Jobs API's reason and log tail."""


def default_shared_dir() -> Path:
    """Where runs' data, checkpoints and logs go without --shared-dir: RLSCALE_SHARED_DIR or <cache>/verl (only
    right for a cluster whose nodes share this machine's disk, e.g. one node)."""
    return Path(os.environ.get("RLSCALE_SHARED_DIR") or cache_dir() / "verl")


class VerlEngine(JobsApiEngine, Engine):
    """Runs each segment of a run as a verl job submitted to the Ray cluster at `ray_address` (the dashboard's
    address, http://HEAD:8265; RAY_ADDRESS when None).

    shared_dir: a directory the driver and every node see (data, checkpoints, logs). python, module: the job's
    interpreter on the cluster and the module it runs (verl.trainer.main_ppo). env_vars: more environment for the
    job. poll_seconds: how often a running job's status and log are read.
    """

    name = "verl"

    def __init__(self, *, ray_address: str | None = None, shared_dir: str | Path | None = None,
                 python: str = "python3", module: str = ENTRYPOINT, gpus_per_node: int = 8,
                 max_prompt_tokens: int = 1024, env_vars: dict | None = None, poll_seconds: float = 5.0):
        self._start_jobs_api(ray_address)
        self.shared_dir = Path(shared_dir) if shared_dir else default_shared_dir()
        self.python, self.module = python, module
        self.gpus_per_node, self.max_prompt_tokens = gpus_per_node, max_prompt_tokens
        self.env_vars = dict(env_vars or {})
        self.poll_seconds = poll_seconds

    def job(self, recipe, run_key: str, number: int, *, until_step: int, base_gpu_seconds: float = 0.0) -> Job:
        """The run's `number`-th job (what dry-run prints and run submits); writes nothing."""
        return make_job(recipe, RunDir(self.shared_dir / run_key), f"{run_key}-{number}", until_step=until_step,
                        python=self.python, module=self.module, gpus_per_node=self.gpus_per_node,
                        max_prompt_tokens=self.max_prompt_tokens, env_vars=self.env_vars,
                        metadata={"rlscale_run": run_key, "base_gpu_seconds": repr(base_gpu_seconds)})

    def run(self, recipe, *, run_key: str, on_records: Callable[[list[dict]], None],
            until_step: int | None = None, should_stop: Callable[[], str | None] | None = None,
            progress: Callable[[dict], None] | None = None, gpu_hours: float | None = None) -> JobResult:
        """See Engine.run. Raises VerlJobFailed when the job fails (its checkpoints stay for the retry)."""
        until = min(until_step or recipe.steps, recipe.steps)
        run_dir = RunDir(self.shared_dir / run_key)
        client = self._jobs_client()
        maker = RecordMaker(recipe, val_reward_metric(recipe))
        jobs = self._run_jobs(run_key)
        live = None
        for details in jobs:  # earlier jobs, in order: their records again (a killed driver may have missed some)
            if details.status in RUNNING:
                live = details
                break
            records, _ = maker.records(LogTail(run_dir.log(details.submission_id)).read(), gpus=_gpus(details),
                                       base_gpu_seconds=_base(details), job_seconds=0.0)
            if records:
                on_records(records)
        if live is None and jobs and run_dir.checkpointed_step() >= until:  # it got there while no driver watched
            return JobResult(steps=run_dir.checkpointed_step())
        if live is None:
            self._prepare(recipe, run_dir)
            base = sum(_gpus(d) * _wall_seconds(d) for d in jobs)
            job = self.job(recipe, run_key, len(jobs) + 1, until_step=until, base_gpu_seconds=base)
            self._submit(job, runtime_env={"env_vars": job.env_vars, "py_modules": [str(run_dir.modules)]},
                         metadata={**job.metadata, "gpus": str(job.gpus), "until_step": str(until)})
            submission_id, gpus = job.submission_id, job.gpus
        else:
            submission_id, base, gpus = live.submission_id, _base(live), _gpus(live)
            until = int(live.metadata.get("until_step", until))
        return self._follow(recipe, run_dir, submission_id, gpus=gpus, base=base, until=until, maker=maker,
                            on_records=on_records, should_stop=should_stop, progress=progress,
                            gpu_hours=gpu_hours)

    def _follow(self, recipe, run_dir: RunDir, submission_id: str, *, gpus: int, base: float, until: int,
                maker: RecordMaker, on_records, should_stop, progress, gpu_hours) -> JobResult:
        """Read the job's log while it runs; stop it where should_stop or the planned compute says."""
        client = self._jobs_client()
        tail, job_seconds, last_step = LogTail(run_dir.log(submission_id)), 0.0, None
        started = time.perf_counter()
        while True:
            status = str(client.get_job_status(submission_id).value)
            records, job_seconds = maker.records(tail.read(), gpus=gpus, base_gpu_seconds=base, job_seconds=job_seconds)
            if records:
                on_records(records)
                last = records[-1]
                last_step = last["step"]
                report_progress(records, progress)
                if status in RUNNING:
                    reached = gpu_hours is not None and last["gpu_hours"] >= gpu_hours
                    checkpoint = any(r["step"] % recipe.checkpoint_every == 0 for r in records if r["step"] > 0)
                    reason = should_stop() if (checkpoint and should_stop and not reached) else None
                    if reached or reason:
                        self._stop(submission_id)
                        busy = time.perf_counter() - started
                        if reached:
                            return JobResult(steps=last_step, compute_reached=True, busy_seconds=busy)
                        return JobResult(steps=last_step, stopped=True, stop_reason=reason, busy_seconds=busy)
            if status not in RUNNING:
                if status == "SUCCEEDED":
                    steps = max(run_dir.checkpointed_step(), last_step or 0)
                    return JobResult(steps=steps, busy_seconds=time.perf_counter() - started)
                info = client.get_job_info(submission_id)
                logs = client.get_job_logs(submission_id)[-2000:]
                if GPUS_TAKEN in logs and last_step is None:
                    raise DevicesUnavailable(f"verl job {submission_id}: {_line_with(logs, GPUS_TAKEN)}")
                raise VerlJobFailed(f"verl job {submission_id} {status}: {info.message or ''}\n{logs}")
            time.sleep(self.poll_seconds)

    def devices(self, recipe) -> list[dict[str, float]]:
        """verl's pools, one bundle per node: the trainer's (hybrid engine: rollouts on the same GPUs), plus the
        rollout pool's own nodes in `async: pipeline`."""
        return [{"GPU": float(gpus)} for gpus in job_devices(recipe, self.gpus_per_node)]

    # ------------------------------------------------------------------------------------------

    def _run_jobs(self, run_key: str) -> list:
        return run_jobs(self._jobs_client(), run_key)

    def _submit(self, job: Job, *, runtime_env: dict, metadata: dict, wait_seconds: float = 60.0) -> None:
        """Submit `job`; while the head's job agent is not up yet (a cluster just started), try again."""
        self._check_open()
        deadline = time.monotonic() + wait_seconds
        while True:
            try:
                self._jobs_client().submit_job(entrypoint=job.entrypoint, submission_id=job.submission_id,
                                               runtime_env=runtime_env, metadata=metadata, entrypoint_num_cpus=0)
                with self._lock:
                    self._started.add(job.submission_id)
                return
            except RuntimeError as err:
                if "No available agent" not in str(err) or time.monotonic() > deadline:
                    raise
                time.sleep(1.0)

    def _stop(self, submission_id: str) -> None:
        stop_job(self._jobs_client(), submission_id, self.poll_seconds)

    def _prepare(self, recipe, run_dir: RunDir) -> None:
        """The run's parquet files (once) and the reward module's package for the job's py_modules."""
        from .data import write_task_parquet

        if not (run_dir.data / "val.parquet").exists():
            write_task_parquet(recipe, run_dir.data)
        (run_dir.root / "logs").mkdir(parents=True, exist_ok=True)
        stage_reward_modules(run_dir.modules)


def stage_reward_modules(target: Path) -> Path:
    """Copy the modules rlscale's reward function imports into `target` (a package directory named rlscale), so the
    job's runtime env (py_modules) makes `rlscale.runner.verl.reward` importable on nodes without rlscale."""
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    for name in REWARD_IMPORTS:
        origin = Path(find_spec(name).origin)
        relative = Path(*name.split(".")[1:])
        destination = staging / (relative / "__init__.py" if origin.name == "__init__.py" else relative.with_suffix(".py"))
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(origin, destination)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def _line_with(text: str, needle: str) -> str:
    """The last line of `text` holding `needle` (a traceback's exception line, not its source line)."""
    return next((line.strip() for line in reversed(text.splitlines()) if needle in line), needle)[:200]


def _gpus(details) -> int:
    return int((details.metadata or {}).get("gpus", 1))
