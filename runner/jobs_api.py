"""Engines whose runs are chains of Ray jobs (verl, trl): the algorithm once; an engine supplies only its hooks.
A run's k-th job is `<run key>-<k>`; a step is stored once a checkpoint holds it (or the job ends well)."""

import atexit
import bisect
import json
import math
import os
import re
import subprocess
import tempfile
import threading
import time
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from rlscale.runner.engine import ComputeStop, DevicesUnavailable, Engine, JobResult, step_cap
from rlscale.runner.tracking import end_mlflow_run

from rlscale.base.compute import device_hours, held

RUNNING = ("PENDING", "RUNNING")
# Ray's reason when a job waited past RAY_JOB_START_TIMEOUT_SECONDS for its resources
START_TIMEOUT = "failed to start within"


class JobFailed(RuntimeError):
    """A job ended FAILED or STOPPED by someone else; the message carries the Jobs API's reason and log tail."""


@dataclass(frozen=True)
class RunDir:
    """A run's files under <shared_dir>/<run key>/: data/, checkpoints/, jobs/<submission id>.json (spec),
    logs/<submission id>.jsonl (one per job), py_modules/ (code shipped in the job's runtime env)."""

    root: Path

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def modules(self) -> Path:
        return self.root / "py_modules" / "rlscale"

    def spec(self, submission_id: str) -> Path:
        return self.root / "jobs" / f"{submission_id}.json"

    def log(self, submission_id: str) -> Path:
        return self.root / "logs" / f"{submission_id}.jsonl"

    def jobs_written(self, run_key: str) -> int:
        """Highest k of a `<run key>-<k>` spec or log here (0: none): a dead head lost its job list, not these files."""
        numbers = [
            int(number)
            for path in [*(self.root / "jobs").glob(f"{run_key}-*"), *(self.root / "logs").glob(f"{run_key}-*")]
            for number in [path.name.split(".")[0].rpartition("-")[2]]
            if number.isdigit()
        ]
        return max(numbers, default=0)


@dataclass
class Following:
    """One run followed through its jobs (JobsApiEngine.run): the state they share, local to one `run` call."""

    recipe: object
    run_dir: "RunDir"
    maker: "RecordMaker"
    budget: ComputeStop
    on_records: Callable[[list[dict]], None]
    should_stop: Callable[[], str | None] | None = None
    progress: Callable[[dict], None] | None = None
    timings: dict = field(default_factory=dict)
    pending: list = field(default_factory=list)  # the job's records past its last checkpoint, not stored yet

    def store(self, through: int | None) -> None:
        """Hand the pending records up to step `through` (None: all; 0: none, no checkpoint holds step 0) to
        on_records; the rest stay pending (a redo without a checkpoint measures its step 0 again)."""
        ready = [r for r in self.pending if through is None or 0 < through and r["step"] <= through]
        self.pending = self.pending[len(ready) :] if through is not None else []
        if ready:
            self.on_records(ready)


@dataclass(frozen=True)
class FollowedJob:
    """One job of a followed run. base: the run's device-seconds before it; submitted: None if adopted."""

    submission_id: str
    devices: int
    base: float
    until: int
    submitted: float | None = None


@dataclass(frozen=True)
class Submission:
    """One job as the Jobs API takes it (what `--dry-run` shows, what `run` submits). devices: GPUs or CPU cores
    held; resources: entrypoint_num_* keywords; metadata: stored with the job, the run's history read back."""

    submission_id: str
    entrypoint: str
    devices: int
    until_step: int
    runtime_env: dict = field(default_factory=dict)
    resources: dict = field(default_factory=dict)
    metadata: dict = field(default_factory=dict)


class JobsApiEngine(Engine):
    """Trains each run as a chain of jobs on the Ray dashboard at `ray_address` (RAY_ADDRESS, else a local head);
    shared_dir: seen by the driver and every node. setup: the study's SetupPlan when it starts from a user config."""

    failure: type[JobFailed] = JobFailed

    def __init__(
        self,
        *,
        ray_address: str | None = None,
        shared_dir: str | Path | None = None,
        poll_seconds: float = 2.0,
        python: str = "python3",
        max_prompt_tokens: int = 1024,
        env_vars: dict | None = None,
        setup=None,
    ):
        self.ray_address = ray_address
        self.shared_dir = Path(shared_dir) if shared_dir else default_shared_dir(self.name)
        self.poll_seconds = poll_seconds
        self.python, self.max_prompt_tokens = python, max_prompt_tokens
        self.env_vars = dict(env_vars or {})
        self.setup = setup
        self._client = None
        self._lock = threading.Lock()
        self._started: set[str] = set()  # submission ids submitted here (close stops those still running)
        self._closed = False  # after close nothing more is submitted (a sweep's threads may still be retrying)
        self._head = None  # the local Ray head started (or adopted) when no cluster is named
        self._tracker_lock = threading.Lock()  # one thread makes or ends tracker runs at a time

    # what an engine says ------------------------------------------------------------------------

    @abstractmethod
    def submission(self, recipe, run_dir: RunDir, submission_id: str, *, until_step: int) -> Submission:
        """The job that trains `recipe` from its last checkpoint to `until_step`; writes nothing."""

    def prepare(self, recipe, run_dir: RunDir, job: Submission) -> None:
        """Write what the job reads before it is submitted (its spec, data); default nothing."""

    @abstractmethod
    def line_reader(self, recipe) -> Callable[[dict], "Reading"]:
        """What one line of a job's log says (a Reading), for `recipe`'s run."""

    def rollouts_per_step(self, recipe) -> int:
        """Rollouts a step of `recipe`'s run samples; default B_p x n."""
        return recipe.total_batch

    def record_maker(self, recipe) -> "RecordMaker":
        return RecordMaker(self.line_reader(recipe), self.rollouts_per_step(recipe))

    @abstractmethod
    def checkpointed_step(self, recipe, run_dir: RunDir) -> int:
        """The step of the run's last whole checkpoint (0 without one)."""

    def devices_taken(self, logs: str, last_step: int | None) -> str | None:
        """The line of a failed job's log saying its devices were taken by someone else, or None."""
        return None

    def dry_run(self, recipe, run_key: str, *, gpu_hours: float | None = None) -> dict:
        """What `rlscale sweep --dry-run` shows of a run's first job (gpu_hours: its planned compute, so the step cap
        applies). UserError on bad input: the sweep stores nothing then."""
        run_dir, submission_id = RunDir(self.shared_dir / run_key), f"{run_key}-1"
        shown = self.dry_run_job(recipe, run_dir, submission_id, until_step=step_cap(recipe, gpu_hours))
        where = {"ray_address": self.ray_address or "RAY_ADDRESS", "submission_id": submission_id}
        return {**where, "log_file": str(run_dir.log(submission_id)), **shown}

    @abstractmethod
    def dry_run_job(self, recipe, run_dir: RunDir, submission_id: str, *, until_step: int) -> dict:
        """What the dry-run shows of a job beyond where it goes: its entrypoint and the engine's own view of it."""

    def rehearse(self, points: list[dict], *, study_file: str | None = None) -> None:
        """Have the framework's own code read each point's first job (`points`: dry_run dicts, run name under "run"),
        adding `composed` {"framework", "version", "config"}; UserError naming every problem at once."""

    # the algorithm ------------------------------------------------------------------------------

    def job(
        self, recipe, run_key: str, number: int, *, until_step: int, base_device_seconds: float = 0.0
    ) -> Submission:
        """The run's `number`-th job; its metadata keeps the run and its prior device-seconds for a restarted driver."""
        submission = self.submission(
            recipe, RunDir(self.shared_dir / run_key), f"{run_key}-{number}", until_step=until_step
        )
        metadata = {**submission.metadata, "rlscale_run": run_key, "base_gpu_seconds": repr(base_device_seconds)}
        return replace(submission, metadata=metadata)

    def run(
        self,
        recipe,
        *,
        run_key: str,
        on_records: Callable[[list[dict]], None],
        until_step: int | None = None,
        should_stop: Callable[[], str | None] | None = None,
        progress: Callable[[dict], None] | None = None,
        gpu_hours: float | None = None,
        resume_gpu_hours: Callable[[int], float | None] | None = None,
    ) -> JobResult:
        """See Engine.run. Raises the engine's JobFailed when a job fails (its checkpoints stay for the retry), and
        DevicesUnavailable when it could not get the devices it was admitted on."""
        cap = step_cap(recipe, gpu_hours)
        until = min(until_step or cap, cap)
        run_dir = RunDir(self.shared_dir / run_key)
        run = Following(
            recipe, run_dir, self.record_maker(recipe), ComputeStop(gpu_hours), on_records, should_stop, progress
        )
        jobs = run_jobs(self._jobs_client(), run_key)
        live = next((details for details in jobs if details.status in RUNNING), None)
        earlier = jobs[: jobs.index(live)] if live is not None else jobs
        last_step = None
        for index, details in enumerate(earlier):  # their records again, in order (a killed driver missed some)
            records = run.maker.records(
                LogTail(run_dir.log(details.submission_id)).read(),
                job=details.submission_id,
                devices=job_devices(details),
                base_device_seconds=base_seconds(details),
                started=(details.start_time or 0) / 1000,
            )
            if details.status != "SUCCEEDED":  # its steps past the checkpoint the next job resumed from are redone
                later = earlier[index + 1 :] + ([live] if live is not None else [])
                cut = self._resumed_from(later, run_dir, recipe)
                records = [record for record in records if record["step"] <= cut]
            records = run.budget.trim(records)
            if records:
                on_records(records)
                last_step = records[-1]["step"]
            if run.budget.reached:  # it trained past its plan while no driver watched: the plan's step ends it
                return JobResult(steps=last_step, compute_reached=True)
        base = resume_seconds(
            self.checkpointed_step(recipe, run_dir),
            resume_gpu_hours,
            sum(job_devices(details) * wall_seconds(details) for details in jobs if details is not live),
        )
        number = max(len(jobs), run_dir.jobs_written(run_key))  # jobs of an earlier head count too
        if live is None and number and self.checkpointed_step(recipe, run_dir) >= until:
            return JobResult(steps=self.checkpointed_step(recipe, run_dir))  # got there while no driver watched
        while True:
            if live is None:
                number += 1
                submission = self.job(recipe, run_key, number, until_step=until, base_device_seconds=base)
                self.prepare(recipe, run_dir, submission)
                job = FollowedJob(submission.submission_id, submission.devices, base, until, submitted=time.time())
                self._submit(submission)
            else:
                until_live = int((live.metadata or {}).get("until_step", until))
                job = FollowedJob(live.submission_id, job_devices(live), base_seconds(live), until_live)
            ended = self._follow(run, job)
            if ended.stopped or ended.compute_reached or ended.steps >= job.until or run.budget.target is None:
                return ended
            if last_step is not None and ended.steps <= last_step:
                raise self.failure(f"{self.name} job {job.submission_id} ended at step {ended.steps} without progress")
            # the segment ended short of its step and of the planned compute: the next one resumes from it
            last_step, live = ended.steps, None
            base = resume_seconds(
                self.checkpointed_step(recipe, run_dir),
                resume_gpu_hours,
                job.base + job.devices * wall_seconds(self._jobs_client().get_job_info(job.submission_id)),
            )

    def _resumed_from(self, jobs: list, run_dir: "RunDir", recipe) -> int:
        for details in jobs:
            lines = LogTail(run_dir.log(details.submission_id)).read()
            readings = [self.line_reader(recipe)(line) for line in lines[:1]]
            if readings:
                return readings[0].step - 1
        return self.checkpointed_step(recipe, run_dir)

    def _follow(self, run: "Following", job: "FollowedJob") -> JobResult:
        client = self._jobs_client()
        tail, started, last_step = LogTail(run.run_dir.log(job.submission_id)), None, None
        following, run.pending = time.perf_counter(), []

        def result(**kwargs) -> JobResult:
            run.timings["train"] = run.timings.get("train", 0.0) + time.perf_counter() - following
            return JobResult(busy_seconds=run.timings["train"], timings=run.timings, **kwargs)

        def records_of(lines: list[dict]) -> list[dict]:
            return run.budget.trim(
                run.maker.records(
                    lines,
                    job=job.submission_id,
                    devices=job.devices,
                    base_device_seconds=job.base,
                    started=started or 0.0,
                )
            )

        try:
            while True:
                status = str(client.get_job_status(job.submission_id).value)
                lines = tail.read()
                if lines and started is None:
                    started = (client.get_job_info(job.submission_id).start_time or 0) / 1000
                    if job.submitted is not None and "time" in lines[0]:  # submit -> the job's first record
                        launch = max(0.0, float(lines[0]["time"]) - job.submitted)
                        run.timings["launch"] = run.timings.get("launch", 0.0) + launch
                records = records_of(lines)
                run.pending += records
                run.store(self.checkpointed_step(run.recipe, run.run_dir))
                if records:
                    last_step = records[-1]["step"]
                    report_progress(records, run.progress)
                    checkpoint = any(r["step"] % run.recipe.checkpoint_every == 0 for r in records if r["step"] > 0)
                    ask = status in RUNNING and checkpoint and run.should_stop is not None and not run.budget.reached
                    reason = run.should_stop() if ask else None
                    if run.budget.reached or reason:
                        if status in RUNNING:
                            stop_job(client, job.submission_id, self.poll_seconds)
                        run.store(None if run.budget.reached else self.checkpointed_step(run.recipe, run.run_dir))
                        return result(
                            steps=last_step,
                            compute_reached=run.budget.reached,
                            stopped=not run.budget.reached,
                            stop_reason=reason or "",
                        )
                if status not in RUNNING:
                    if status == "SUCCEEDED":
                        run.store(None)
                        return result(steps=max(self.checkpointed_step(run.recipe, run.run_dir), last_step or 0))
                    info = client.get_job_info(job.submission_id)
                    logs = client.get_job_logs(job.submission_id)
                    taken = self.devices_taken(logs[-2000:], last_step)
                    if taken or START_TIMEOUT in (info.message or ""):
                        raise DevicesUnavailable(f"{self.name} job {job.submission_id}: {taken or info.message}")
                    raise self.failure(failure_message(self.name, job.submission_id, status, info.message, logs))
                time.sleep(self.poll_seconds)
        except BaseException:  # failed, its head gone, the driver interrupted: keep what a checkpoint holds
            if started is not None:
                run.pending += records_of(tail.read())
            run.store(self.checkpointed_step(run.recipe, run.run_dir))
            raise

    # the cluster --------------------------------------------------------------------------------

    def has_live_job(self, run_key: str) -> bool:
        """Whether a job of the run still runs on the cluster (left by an earlier driver: `run` adopts it)."""
        return any(details.status in RUNNING for details in run_jobs(self._jobs_client(), run_key))

    def nodes(self) -> list | None:
        """The cluster's nodes and their free devices, from the dashboard."""
        from rlscale.runner.cluster import dashboard_nodes

        return dashboard_nodes(self._jobs_client())

    def ended(self, run_key: str, status: str) -> None:
        """The run's MLflow run (made at its first submission, when its setup logs to MLflow) ends as the run did."""
        with self._tracker_lock:
            end_mlflow_run(self.shared_dir / run_key, status)

    def close(self, wait_seconds: float = 60.0) -> None:
        """Stop the running jobs this engine submitted (an interrupted sweep) and await them; adopted ones are left."""
        with self._lock:
            started, self._started, self._closed = set(self._started), set(), True
            client = self._client
        try:
            live = [job for job in started if client and str(client.get_job_status(job).value) in RUNNING]
            for job in live:
                client.stop_job(job)
            deadline = time.monotonic() + wait_seconds
            while live and time.monotonic() < deadline:
                time.sleep(0.5)
                live = [job for job in live if str(client.get_job_status(job).value) in RUNNING]
        except (OSError, RuntimeError):  # the cluster is gone: unreachable (OSError) or refusing (Ray's RuntimeError)
            pass
        self._client = None
        if self._head is not None:  # the local head this sweep started: its jobs have ended or were stopped
            from rlscale.runner.ray_head import HEAD_FILE

            self._head.stop(self.shared_dir / HEAD_FILE)
            self._head, self.ray_address = None, None

    def _submit(self, job: Submission, wait_seconds: float = 60.0) -> None:
        if self._closed:
            raise RuntimeError("the engine is closed: the sweep is ending")
        deadline = time.monotonic() + wait_seconds
        metadata = {**job.metadata, "devices": str(job.devices), "until_step": str(job.until_step)}
        while True:
            try:
                self._jobs_client().submit_job(
                    entrypoint=job.entrypoint,
                    submission_id=job.submission_id,
                    runtime_env=job.runtime_env,
                    metadata=metadata,
                    **job.resources,
                )
                with self._lock:
                    self._started.add(job.submission_id)
                return
            except RuntimeError as err:
                if "No available agent" not in str(err) or time.monotonic() > deadline:
                    raise
                time.sleep(1.0)

    def _jobs_client(self):
        from rlscale.runner.ray_head import jobs_client, local_head

        with self._lock:
            if self._client is None:
                if self.ray_address is None and not os.environ.get("RAY_ADDRESS"):
                    self._head = local_head(self.shared_dir)
                    self.ray_address = self._head.address
                self._client = jobs_client(self.ray_address)
            return self._client


def default_shared_dir(engine: str) -> Path:
    """Where an engine's runs keep their data, checkpoints and logs without --shared-dir: RLSCALE_SHARED_DIR or
    <cache>/<engine> (right for a cluster whose nodes share this machine's disk, e.g. one node)."""
    from rlscale.base.settings import cache_dir

    return Path(os.environ.get("RLSCALE_SHARED_DIR") or cache_dir() / engine)


def resume_seconds(step: int, resume_gpu_hours: Callable[[int], float | None] | None, otherwise: float) -> float:
    """Device-seconds a job resuming from the checkpoint at `step` (0: none, a redo from the start) starts at: the
    stored gpu_hours at `step` x 3600, since its records up to `step` are not stored again (time lost after it is
    never charged); without a record there, 0 from the start, else `otherwise`."""
    stored = resume_gpu_hours(step) if resume_gpu_hours is not None else None
    if stored is not None:
        return stored * 3600.0
    return 0.0 if step <= 0 else otherwise


def run_jobs(client, run_key: str) -> list:
    """The run's jobs on the cluster (JobDetails from a JobSubmissionClient), in submission order."""
    numbered = []
    for details in client.list_jobs():
        prefix, _, number = (details.submission_id or "").rpartition("-")
        if prefix == run_key and number.isdigit():
            numbered.append((int(number), details))
    return [details for _, details in sorted(numbered, key=lambda pair: pair[0])]


def stop_job(client, submission_id: str, poll_seconds: float = 1.0) -> None:
    """Stop the job and wait until the Jobs API no longer reports it running."""
    client.stop_job(submission_id)
    while str(client.get_job_status(submission_id).value) in RUNNING:
        time.sleep(min(poll_seconds, 1.0))


# a failed job's own reason: the last exception its log shows (a Ray actor's lines carry a "(Name pid=...)" prefix)
_ACTOR_PREFIX = re.compile(r"^\([^)]*pid=\d+[^)]*\)\s?")
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Failure)(\(.*\))?(: .*)?$")
LOG_TAIL_CHARS = 1200  # of a failed job's log, kept in its JobFailed below the reason


def last_exception_line(log: str) -> str | None:
    """The line ending the last Python traceback in a job's log, else the last line that looks like one, or None."""
    lines = [_ACTOR_PREFIX.sub("", line.rstrip()) for line in log.splitlines()]
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    if starts:
        after = [line for line in lines[starts[-1] + 1 :] if line.strip() and not line[0].isspace()]
        if after:
            return after[0].strip()[:300]
    found = next((line.strip() for line in reversed(lines) if _EXCEPTION_LINE.match(line.strip())), None)
    return found[:300] if found else None


def failure_message(engine: str, submission_id: str, status: str, message: str | None, log: str) -> str:
    """A failed job's JobFailed text: its last exception line (else the Jobs API's message), job, status, log tail."""
    status_line = f"{engine} job {submission_id} {status}: {(message or '').strip()[:300]}"
    reason = last_exception_line(log) or status_line
    return "\n".join([reason, status_line, log[-LOG_TAIL_CHARS:]])


def report_progress(records: list[dict], progress) -> None:
    """Hand the live view a batch's last step, compute and latest validation reward (progress may be None)."""
    if progress and records:
        progress(
            {
                "step": records[-1]["step"],
                "gpu_hours": records[-1]["gpu_hours"],
                "val_reward": next((r["val_reward"] for r in reversed(records) if r["val_reward"] is not None), None),
            }
        )


def wall_seconds(details) -> float:
    """Seconds the job ran, by the Jobs API's clock (start to end; 0 if it never started)."""
    if not details.start_time:
        return 0.0
    end = details.end_time or time.time() * 1000
    return max(0.0, (end - details.start_time) / 1000.0)


def base_seconds(details) -> float:
    """Device-seconds of the run's jobs before this one, as its submission recorded them in its metadata."""
    return float((details.metadata or {}).get("base_gpu_seconds", 0.0))


def job_devices(details) -> int:
    metadata = details.metadata or {}
    return int(metadata.get("devices", metadata.get("gpus", 1)))


@dataclass
class LogTail:
    """Reads the complete lines appended to one file since the last read."""

    path: Path
    offset: int = 0  # bytes read and parsed so far

    def read(self) -> list[dict]:
        """The lines completed since the last call, parsed ([] if the file does not exist yet)."""
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n") + 1
        self.offset += end
        return [json.loads(line) for line in chunk[:end].splitlines() if line.strip()]


# a run's records from its jobs' logs ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Reading:
    """What one line of a job's log says (an engine's line_reader makes it); a job's seconds come from the framework's
    `step_seconds` (verl) or `time`, the epoch seconds the line was written (TRL)."""

    step: int
    step_seconds: float | None = None
    time: float | None = None
    tokens_per_rollout: float | None = None  # the step's mean generated tokens per rollout
    val_reward: float | None = None
    metrics: dict = field(default_factory=dict)  # health metrics under the store's names


@dataclass
class StepTotals:
    """Per-step values (the first given wins) and their running totals: adding in order O(1), a query O(log n)."""

    steps: list = field(default_factory=list)
    totals: list = field(default_factory=list)  # totals[i]: the sum over steps[: i + 1]

    def add(self, step: int, value: float) -> None:
        index = bisect.bisect_left(self.steps, step)
        if index < len(self.steps) and self.steps[index] == step:
            return
        self.steps.insert(index, step)
        self.totals.insert(index, (self.totals[index - 1] if index else 0.0) + value)
        for later in range(index + 1, len(self.totals)):  # only a step that comes after later ones
            self.totals[later] += value

    def through(self, step: int) -> float:
        index = bisect.bisect_right(self.steps, step)
        return self.totals[index - 1] if index else 0.0


@dataclass
class RecordMaker:
    """A run's records from its jobs' log lines, fed in the order they ran. gpu_hours: device-hours of earlier jobs'
    device-seconds plus devices x this job's seconds; tokens: each step counted once (a resumed job logs some again)."""

    read: Callable[[dict], Reading]
    rollouts_per_step: int
    tokens: StepTotals = field(default_factory=StepTotals)
    job_seconds: dict = field(default_factory=dict)  # job -> its seconds through the lines read so far

    def records(
        self, lines: list[dict], *, job: str, devices: int, base_device_seconds: float, started: float = 0.0
    ) -> list[dict]:
        """Records of the next `lines` of job `job`, started at epoch second `started`, holding `devices`."""
        seconds, out = self.job_seconds.get(job, 0.0), []
        for line in lines:
            reading = self.read(line)
            if reading.time is not None:
                seconds = max(0.0, reading.time - started)
            else:
                seconds += reading.step_seconds or 0.0
            if reading.tokens_per_rollout is not None:
                self.tokens.add(reading.step, reading.tokens_per_rollout * self.rollouts_per_step)
            out.append(
                {
                    "step": reading.step,
                    "gpu_hours": device_hours(base_device_seconds + held(devices, seconds)),
                    "rollouts": reading.step * self.rollouts_per_step,
                    "tokens": round(self.tokens.through(reading.step)),
                    "val_reward": reading.val_reward,
                    "metrics": reading.metrics,
                }
            )
        self.job_seconds[job] = seconds
        return out


def finite_number(value) -> float | None:
    """A finite number, or None (NaN written as null, a missing metric, a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


# the dry-run's rehearsal: the framework's own code, run in the framework's own environment ---------------------


def framework_python(framework: str) -> Path | None:
    """The Python of a framework's own environment: RLSCALE_<FRAMEWORK>_PYTHON if set, else .venv-<framework>/bin/python
    in the working directory or rlscale's checkout (scripts/checker_envs.sh); None without either."""
    named = os.environ.get(f"RLSCALE_{framework.upper()}_PYTHON")
    if named:
        return Path(named)
    import rlscale

    for root in (Path.cwd(), Path(rlscale.__file__).resolve().parents[1]):
        python = root / f".venv-{framework}" / "bin" / "python"
        if python.exists():
            return python
    return None


class EnvironmentFailed(RuntimeError):
    """A script in a framework's environment (EnvWorker) died: the framework is broken there, not the input."""


class EnvWorker:
    """A script kept running in a framework's environment, one JSON line out per JSON line in, so its imports are
    paid once (it points fd 1 at stderr: frameworks print as they import). Thread-safe."""

    def __init__(self, python: Path, script: Path):
        self.python, self.script = python, script
        self._log = tempfile.TemporaryFile(mode="w+")  # its stderr, for the reason when it dies
        self._process = subprocess.Popen(
            [str(python), str(script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            bufsize=1,
        )
        self._lock = threading.Lock()

    def ask(self, payload):
        """The script's answer to `payload`; EnvironmentFailed (with the tail of its stderr) when it has died."""
        with self._lock:
            try:
                self._process.stdin.write(json.dumps(payload) + "\n")
                self._process.stdin.flush()
                line = self._process.stdout.readline()
            except OSError:
                line = ""
            if not line:
                self._log.seek(0)
                tail = " | ".join(self._log.read().strip().splitlines()[-3:])[-600:]
                raise EnvironmentFailed(f"{self.python} {self.script.name} stopped: {tail}")
            return json.loads(line)

    @property
    def alive(self) -> bool:
        return self._process.poll() is None

    def close(self) -> None:
        if self.alive:
            self._process.stdin.close()
            try:
                self._process.wait(timeout=10)
            except Exception:  # a script stuck on exit: it holds nothing of ours
                self._process.kill()
        self._log.close()


_workers: dict[tuple[str, str], EnvWorker] = {}
_workers_lock = threading.Lock()


def env_worker(python: Path, script: Path) -> EnvWorker:
    """The running EnvWorker of `script` in `python`'s environment, started on first use, stopped at exit."""
    key = (str(python), str(script))
    with _workers_lock:
        worker = _workers.get(key)
        if worker is None or not worker.alive:
            if not _workers:
                atexit.register(_close_workers)
            worker = _workers[key] = EnvWorker(python, script)
        return worker


def _close_workers() -> None:
    with _workers_lock:
        for worker in _workers.values():
            worker.close()
        _workers.clear()
