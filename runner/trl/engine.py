"""The `trl` engine: a run is a chain of TRL GRPOTrainer jobs on a Ray cluster, submitted and followed through Ray's
Jobs API, as the verl engine's are.

A job's submission id is `<run key>-<k>` (the run's k-th job), so a restarted driver adopts a run's still-running
job and replays the records of its finished ones (the store keeps each (run, step) once). A job pauses a run at a
rung by ending at that step with a checkpoint; the next job resumes from it (resume_from_checkpoint). A crashed
job raises; the driver's retry submits the next job, which resumes from the last checkpoint. Several runs may be
followed at once from different threads: all per-run state is local to `run`; only the Jobs API client is shared.
"""

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rlscale.base.settings import cache_dir
from rlscale.runner.engine import DevicesUnavailable, Engine, JobResult
from rlscale.runner.jobs_api import RUNNING, JobsApiEngine, LogTail, report_progress, run_jobs, stop_job
from rlscale.runner.jobs_api import base_seconds as _base
from rlscale.runner.jobs_api import wall_seconds as _wall_seconds

from .job import DEVICES_TAKEN, Job, RunDir, make_job, require_trl, write_spec
from .logs import RecordMaker

# Ray's reason when a job waited longer than RAY_JOB_START_TIMEOUT_SECONDS for the resources it asked for
START_TIMEOUT = "failed to start within"


class TrlJobFailed(RuntimeError):
    """A TRL job ended FAILED or STOPPED by someone else; the message carries the Jobs API's reason and log tail."""


def default_shared_dir() -> Path:
    """Where runs' checkpoints and records go without --shared-dir: RLSCALE_SHARED_DIR or <cache>/trl."""
    return Path(os.environ.get("RLSCALE_SHARED_DIR") or cache_dir() / "trl")


class TrlEngine(JobsApiEngine, Engine):
    """Runs each segment of a run as a TRL job submitted to the Ray cluster at `ray_address` (the dashboard's
    address, http://HEAD:8265; RAY_ADDRESS when None).

    shared_dir: a directory the driver and the job's node see. python: the job's interpreter (with rlscale and
    trl installed; default this one). gpus: train on the node's GPUs (vLLM colocate, bf16; written, untested here)
    instead of CPU cores (transformers' generate, float32). micro_batch: completions per forward/backward.
    env_vars: more environment for the job. poll_seconds: how often a running job's status and records are read.
    """

    name = "trl"

    def __init__(self, *, ray_address: str | None = None, shared_dir: str | Path | None = None,
                 python: str = sys.executable, gpus: bool = False, micro_batch: int = 64,
                 max_prompt_tokens: int = 1024, env_vars: dict | None = None, poll_seconds: float = 2.0):
        self._start_jobs_api(ray_address)
        self.shared_dir = Path(shared_dir) if shared_dir else default_shared_dir()
        self.python, self.gpus = python, gpus
        self.micro_batch, self.max_prompt_tokens = micro_batch, max_prompt_tokens
        self.env_vars = dict(env_vars or {})
        self.poll_seconds = poll_seconds

    def devices(self, recipe) -> list[dict[str, float]]:
        """One node: the trainer's devices as GPUs (generation colocated), or as CPU cores."""
        return [{"GPU" if self.gpus else "CPU": float(recipe.trainer_devices)}]

    def job(self, recipe, run_key: str, number: int, *, until_step: int, base_device_seconds: float = 0.0) -> Job:
        """The run's `number`-th job (what dry-run prints and run submits); writes nothing. UserError for a recipe
        TRL cannot train, or no TRL in this interpreter when the job would run on it."""
        if self.python == sys.executable:
            require_trl()
        return make_job(recipe, RunDir(self.shared_dir / run_key), f"{run_key}-{number}", until_step=until_step,
                        python=self.python, gpus=self.gpus, micro_batch=self.micro_batch,
                        max_prompt_tokens=self.max_prompt_tokens,
                        metadata={"rlscale_run": run_key, "base_gpu_seconds": repr(base_device_seconds),
                                  "devices": str(recipe.trainer_devices), "until_step": str(until_step)})

    def dry_run(self, recipe, run_key: str) -> dict:
        """What `rlscale sweep --dry-run` shows of a run's first job: where it goes, its entrypoint, and its GRPOConfig
        as `rlscale export --format trl` renders it (nearest-form and not-expressible notes included)."""
        from rlscale.planner.frameworks.trl import render

        job = self.job(recipe, run_key, 1, until_step=recipe.steps)
        return {"ray_address": self.ray_address or "RAY_ADDRESS", "submission_id": job.submission_id,
                "entrypoint": job.entrypoint, "devices": self.devices(recipe), "log_file": str(job.log_file),
                "config": job.config, "nearest": job.mapping.nearest, "not_expressible": job.mapping.missing,
                "config_text": render(recipe, job.deployment, [f"rlscale sweep --dry-run: job {job.submission_id}"],
                                      run_keys=job.run_keys)}

    def run(self, recipe, *, run_key: str, on_records: Callable[[list[dict]], None],
            until_step: int | None = None, should_stop: Callable[[], str | None] | None = None,
            progress: Callable[[dict], None] | None = None, gpu_hours: float | None = None) -> JobResult:
        """See Engine.run. Raises TrlJobFailed when the job fails (its checkpoints stay for the retry), and
        DevicesUnavailable when it could not get the devices it was admitted on."""
        until = min(until_step or recipe.steps, recipe.steps)
        run_dir = RunDir(self.shared_dir / run_key)
        maker = RecordMaker(recipe)
        jobs = run_jobs(self._jobs_client(), run_key)
        live = None
        for details in jobs:  # earlier jobs, in order: their records again (a killed driver may have missed some)
            if details.status in RUNNING:
                live = details
                break
            records = maker.records(LogTail(run_dir.log(details.submission_id)).read(), devices=_devices(details),
                                    base_device_seconds=_base(details), started=(details.start_time or 0) / 1000)
            records, reached = _within(records, gpu_hours)
            if records:
                on_records(records)
            if reached:  # it trained past its plan while no driver watched: the plan's step ends it
                return JobResult(steps=records[-1]["step"], compute_reached=True)
        if live is None and jobs and run_dir.checkpointed_step(recipe) >= until:  # got there while no driver watched
            return JobResult(steps=run_dir.checkpointed_step(recipe))
        submitted = None
        if live is None:
            base = sum(_devices(d) * _wall_seconds(d) for d in jobs)
            job = self.job(recipe, run_key, len(jobs) + 1, until_step=until, base_device_seconds=base)
            write_spec(job, recipe)
            submitted = time.time()
            self._submit(job)
            submission_id, devices = job.submission_id, job.devices
        else:
            submission_id, base, devices = live.submission_id, _base(live), _devices(live)
        return self._follow(recipe, run_dir, submission_id, devices=devices, base=base, submitted=submitted,
                            maker=maker, on_records=on_records, should_stop=should_stop, progress=progress,
                            gpu_hours=gpu_hours)

    def _follow(self, recipe, run_dir: RunDir, submission_id: str, *, devices: int, base: float,
                submitted: float | None, maker: RecordMaker, on_records, should_stop, progress, gpu_hours) -> JobResult:
        """Read the job's records while it runs; stop it where should_stop or the planned compute says."""
        client = self._jobs_client()
        tail, started, last_step, timings = LogTail(run_dir.log(submission_id)), None, None, {}
        following = time.perf_counter()
        while True:
            status = str(client.get_job_status(submission_id).value)
            lines = tail.read()
            if lines and started is None:
                started = (client.get_job_info(submission_id).start_time or 0) / 1000
                if submitted is not None:  # submit -> the job's first record (Ray, Python, TRL, model, step-0 eval)
                    timings["launch"] = max(0.0, float(lines[0]["time"]) - submitted)
            records, reached = _within(maker.records(lines, devices=devices, base_device_seconds=base,
                                                     started=started or 0.0), gpu_hours)
            if records:
                on_records(records)
                last = records[-1]
                last_step = last["step"]
                report_progress(records, progress)
                checkpoint = any(r["step"] % recipe.checkpoint_every == 0 for r in records if r["step"] > 0)
                reason = should_stop() if (status in RUNNING and checkpoint and should_stop and not reached) else None
                if reached or reason:
                    if status in RUNNING:
                        stop_job(self._jobs_client(), submission_id, self.poll_seconds)
                    timings["train"] = time.perf_counter() - following
                    return JobResult(steps=last_step, compute_reached=reached, stopped=not reached,
                                     stop_reason=reason or "", busy_seconds=timings["train"], timings=timings)
            if status not in RUNNING:
                timings["train"] = time.perf_counter() - following
                if status == "SUCCEEDED":
                    steps = max(run_dir.checkpointed_step(recipe), last_step or 0)
                    return JobResult(steps=steps, busy_seconds=timings["train"], timings=timings)
                info = client.get_job_info(submission_id)
                logs = client.get_job_logs(submission_id)[-2000:]
                if DEVICES_TAKEN in logs or START_TIMEOUT in (info.message or ""):
                    raise DevicesUnavailable(f"trl job {submission_id}: {info.message or DEVICES_TAKEN}")
                raise TrlJobFailed(f"trl job {submission_id} {status}: {info.message or ''}\n{logs}")
            time.sleep(self.poll_seconds)

    # ------------------------------------------------------------------------------------------

    def _submit(self, job: Job, wait_seconds: float = 60.0) -> None:
        """Submit `job`, holding its devices as Ray resources; while the head's job agent is not up yet, try again."""
        self._check_open()
        env = {**self.env_vars}
        if not job.gpus:
            env.setdefault("OMP_NUM_THREADS", str(job.devices))
        resources = {"entrypoint_num_gpus": job.devices} if job.gpus else {"entrypoint_num_cpus": job.devices}
        deadline = time.monotonic() + wait_seconds
        while True:
            try:
                self._jobs_client().submit_job(entrypoint=job.entrypoint, submission_id=job.submission_id,
                                               runtime_env={"env_vars": env}, metadata=job.metadata, **resources)
                with self._lock:
                    self._started.add(job.submission_id)
                return
            except RuntimeError as err:
                if "No available agent" not in str(err) or time.monotonic() > deadline:
                    raise
                time.sleep(1.0)


def _within(records: list[dict], gpu_hours: float | None) -> tuple[list[dict], bool]:
    """(records up to the first that reaches the planned compute, whether one did): the run ends at that step."""
    if gpu_hours is None:
        return records, False
    for index, record in enumerate(records):
        if record["gpu_hours"] >= gpu_hours:
            return records[:index + 1], True
    return records, False


def _devices(details) -> int:
    return int((details.metadata or {}).get("devices", 1))
