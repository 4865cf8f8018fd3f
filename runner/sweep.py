"""The sweep driver: study -> planned runs in the store -> RL jobs on Ray -> records -> fits.

The driver is the store's one writer: jobs hand their records back through a callback that runs in
this process. Resumable by construction: a run's identity is its config hash and seed, finished runs
are skipped, interrupted ones resume from their checkpoint, and (run, step) is unique in the store.
"""

import hashlib
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

from planner.recipe import Recipe

FINISHED = ("done", "failed", "stopped")


@dataclass
class RunState:
    """What the live view shows for one run."""

    run_id: int
    name: str
    recipe: Recipe
    seed: int
    planned_gpu_hours: float
    status: str = "pending"
    step: int = 0
    val_reward: float | None = None
    gpu_hours: float = 0.0
    attempts: int = 0
    note: str = ""
    created_at: object = None  # the run row's creation time: part of its checkpoint key


@dataclass
class SweepSummary:
    """Counts and timings of one `sweep` invocation."""

    runs: list[RunState]
    wall_seconds: float = 0.0
    busy_seconds: float = 0.0  # wall time some actor was generating or training
    timings: dict = field(default_factory=dict)

    def count(self, status: str) -> int:
        return sum(run.status == status for run in self.runs)


class SweepDriver:
    """Runs a study's planned points as RL jobs, one writer to the store, resumable and fault tolerant."""

    def __init__(self, study, store, *, ray_address: str | None = None, max_retries: int = 2,
                 on_update: Callable[[list[RunState]], None] | None = None):
        self.study = study
        self.store = store
        self.ray_address = ray_address
        self.max_retries = max_retries
        self.on_update = on_update or (lambda runs: None)
        self.runs: list[RunState] = []
        self._lock = threading.Lock()
        self._generator = None
        self._generator_key = None
        self._hyperband = None  # runner.hyperband.HyperbandStopper, made on first use
        self._started_ray = False

    # planning -------------------------------------------------------------------------------------

    def plan(self) -> list[RunState]:
        """Put every planned point in the store (idempotent) and load each run's status and progress."""
        from planner.study import planned_runs

        self.store.upsert_study(self.study.name, self.study.to_spec())
        points = planned_runs(self.study)
        several_seeds = len(self.study.seeds) > 1
        runs_before = self.store.runs_frame(self.study.name).set_index("run_id")
        records = self.store.records_frame(self.study.name)
        self.runs = []
        for point in points:
            name = run_name(point, several_seeds)
            self.add_run(name, point.recipe, point.seed, point.gpu_hours, runs_before, records)
        return self.runs

    def add_run(self, name: str, recipe: Recipe, seed: int, planned_gpu_hours: float, runs_before=None,
                records=None) -> RunState:
        """Register one run (idempotent) and load its status and progress from the store."""
        if runs_before is None:
            runs_before = self.store.runs_frame(self.study.name).set_index("run_id")
            records = self.store.records_frame(self.study.name)
        run_id = self.store.ensure_run(self.study.name, name, recipe.to_json(), seed)
        state = RunState(run_id, name, recipe, seed, planned_gpu_hours)
        if run_id not in runs_before.index:
            runs_before = self.store.runs_frame(self.study.name).set_index("run_id")
        state.status = runs_before.loc[run_id, "status"]
        state.created_at = runs_before.loc[run_id, "created_at"]
        mine = records[records["run_id"] == run_id]
        if len(mine):
            state.step = int(mine["step"].max())
            state.gpu_hours = float(mine["gpu_hours"].max())
            evals = mine["val_reward"].dropna()
            state.val_reward = float(evals.iloc[-1]) if len(evals) else None
        self.runs.append(state)
        return state

    # running --------------------------------------------------------------------------------------

    def run(self) -> SweepSummary:
        """Run every unfinished planned run; returns the summary (failed runs do not stop the sweep)."""
        if not self.runs:
            self.plan()
        started = time.perf_counter()
        summary = SweepSummary(self.runs)
        todo = [run for run in self.runs if run.status not in FINISHED]
        if todo:
            try:
                for run in todo:
                    self.run_one(run, summary)
            finally:
                self.close()
        summary.wall_seconds = time.perf_counter() - started
        self.on_update(self.runs)
        return summary

    def run_one(self, run: RunState, summary: SweepSummary) -> None:
        """Run one job to the end (retrying crashes), then refit the study's curves."""
        self._started_ray = _init_ray(self.ray_address) or self._started_ray
        self._run_with_retries(run, summary)
        self._refit()
        if self._hyperband is not None:
            self._hyperband.finish(run.run_id, run.val_reward if run.status == "done" else None)

    def _run_with_retries(self, run: RunState, summary: SweepSummary) -> None:
        from runner.job import run_job

        while True:
            run.attempts += 1
            run.status, run.note = "running", ("" if run.attempts == 1 else f"retry {run.attempts - 1}")
            self.store.set_run_status(run.run_id, "running")
            self.on_update(self.runs)
            try:
                result = run_job(
                    run.recipe,
                    run_key=self.run_key(run),
                    on_records=lambda records, run=run: self._on_records(run, records),
                    resume=True,
                    ray_address=self.ray_address,
                    generator=self._shared_generator(run.recipe),
                    progress=lambda info, run=run: self._on_progress(run, info),
                    should_stop=lambda run=run: self._should_stop(run),
                )
            except Exception as err:  # a crashing job must not end the sweep
                import ray

                if isinstance(err, ray.exceptions.RayActorError):
                    self._release_generator()  # an actor died (maybe the engine): the retry starts a fresh one
                message = f"{type(err).__name__}: {err}".splitlines()[0][:500]
                if run.attempts <= self.max_retries:
                    run.note = f"attempt {run.attempts} failed: {message}"
                    continue
                run.status, run.note = "failed", message
                self.store.set_run_status(run.run_id, "failed", error=_error_text(err))
                self.on_update(self.runs)
                return
            for key, seconds in (result.get("timings") or {}).items():
                summary.timings[key] = summary.timings.get(key, 0.0) + seconds
            summary.busy_seconds += float(result.get("busy_seconds", 0.0))
            run.status = "stopped" if result.get("stopped") else "done"
            run.note = result.get("stop_reason", "") if result.get("stopped") else ""
            self.store.set_run_status(run.run_id, run.status, error=run.note or None)
            self.on_update(self.runs)
            return

    def _on_records(self, run: RunState, records: list[dict]) -> None:
        with self._lock:  # the one writer, even if jobs ever run on several threads
            self.store.add_records(run.run_id, records)
        for record in records:
            run.step = max(run.step, int(record["step"]))
            run.gpu_hours = max(run.gpu_hours, float(record["gpu_hours"]))
            if record.get("val_reward") is not None:
                run.val_reward = float(record["val_reward"])
        self.on_update(self.runs)

    def _on_progress(self, run: RunState, info: dict) -> None:
        run.step = int(info.get("step", run.step))
        run.gpu_hours = float(info.get("gpu_hours", run.gpu_hours))
        if info.get("val_reward") is not None:
            run.val_reward = float(info["val_reward"])
        self.on_update(self.runs)

    # early termination ----------------------------------------------------------------------------

    def _should_stop(self, run: RunState) -> str | None:
        """A reason to stop `run` now (the study's early_terminate rule), or None."""
        rule = self.study.early_terminate
        if rule.type == "none":
            return None
        records = self.store.records_frame(self.study.name).dropna(subset=["val_reward"])
        if rule.type == "hyperband":
            if self._hyperband is None:
                from runner.hyperband import HyperbandStopper

                self._hyperband = HyperbandStopper(run.recipe.steps, rule.min_fraction, rule.eta, seed=self.study.seeds[0])
            mine = records[records["run_id"] == run.run_id]
            return self._hyperband.check(run.run_id, list(zip(mine["step"], mine["val_reward"])))
        if run.step < rule.min_fraction * run.recipe.steps:
            return None
        from fitting.early_stop import best_fit_of, should_stop
        from fitting.sigmoid import FitError, fit_sigmoid

        fits = {}
        for run_id, rows in records.groupby("run_id"):
            try:
                fits[run_id] = fit_sigmoid(rows["gpu_hours"].to_numpy(), rows["val_reward"].to_numpy(), bootstrap=100)
            except FitError:
                fits[run_id] = None
        mine = fits.pop(run.run_id, None)
        decision = should_stop(mine, best_fit_of(fits), run.gpu_hours, noise_band=rule.margin)
        return decision.reason if decision.stop else None

    # fits -----------------------------------------------------------------------------------------

    def _refit(self) -> None:
        """Fit every run's curve on its records so far and store the fits."""
        from fitting.stored import fit_study

        if self.store.records_frame(self.study.name)["val_reward"].notna().any():
            fit_study(self.store, self.study.name)

    # the shared generator ---------------------------------------------------------------------------

    def run_key(self, run: RunState) -> str:
        """Checkpoint directory name: unique per store, study and run row (a re-created store starts afresh)."""
        ident = f"{self.store.url_for_display}|{self.study.name}|{run.run_id}|{run.created_at}"
        return f"{self.study.name}-{run.run_id}-{hashlib.sha256(ident.encode()).hexdigest()[:10]}"

    def _shared_generator(self, recipe: Recipe):
        # one vLLM engine for consecutive jobs on the same model: reloading base weights costs far less
        # than a 25-45 s engine start; a run on another model or head precision gets its own engine
        key = (recipe.model, recipe.fp32_head, recipe.generator_devices)
        if self._generator is not None and self._generator_key != key:
            self._release_generator()
        if self._generator is None:
            from runner.generator import create_generator

            self._generator, self._generator_key = create_generator(recipe), key
        return self._generator

    def close(self) -> None:
        """Stop the shared generator, and the local Ray cluster if this driver started it."""
        self._release_generator()
        if self._started_ray:
            import ray

            ray.shutdown()
            self._started_ray = False

    def _release_generator(self) -> None:
        if self._generator is not None:
            import ray

            try:
                ray.kill(self._generator)
            except Exception:
                pass
            self._generator = None


def run_name(point, several_seeds: bool) -> str:
    """A planned point's run name in the store: the point's name, plus `/s<seed>` when a study has several seeds."""
    return f"{point.name}/s{point.seed}" if several_seeds else point.name


def _init_ray(address: str | None) -> bool:
    """Start (or join) Ray unless it is up; True if this call started it."""
    import ray

    if ray.is_initialized():
        return False
    ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    return True


def _error_text(err: Exception) -> str:
    text = "".join(traceback.format_exception_only(type(err), err)).strip()
    return text[-2000:]
