"""The sweep driver: study -> planned runs in the store -> RL jobs on Ray -> records -> fits.

The driver is the store's one writer: jobs hand their records back through a callback that runs in
this process. Resumable by construction: a run's identity is its config hash and seed, finished runs
are skipped, interrupted ones resume from their checkpoint, and (run, step) is unique in the store.
"""

import hashlib
import math
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

from rlscale.planner.recipe import Recipe

FINISHED = ("done", "failed", "stopped")  # "paused": checkpointed at a rung, resumed when the scheduler says so


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
        self._actors: dict[str, tuple[tuple, object]] = {}  # role -> (key, live actor) shared by consecutive jobs
        self._hyperband = None  # rlscale.runner.sweep.hyperband.HyperbandStopper, made on first use
        self._fit_cache: dict[int, tuple[tuple, object]] = {}  # run_id -> ((evaluations, last step), fit)
        self._started_ray = False

    # planning -------------------------------------------------------------------------------------

    def plan(self) -> list[RunState]:
        """Put every planned point in the store (idempotent) and load each run's status and progress."""
        from rlscale.planner.study import planned_runs

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
                if self.study.early_terminate.type == "asymptote":
                    self._run_by_rungs(summary)
                else:
                    for run in todo:
                        self.run_one(run, summary)
            finally:
                self.close()
        summary.wall_seconds = time.perf_counter() - started
        self.on_update(self.runs)
        return summary

    def run_one(self, run: RunState, summary: SweepSummary, until_step: int | None = None) -> None:
        """Run one job to the end, or pause it at `until_step` (retrying crashes), then refit the study's curves."""
        self._started_ray = _init_ray(self.ray_address) or self._started_ray
        self._run_with_retries(run, summary, until_step)
        self._refit()
        if self._hyperband is not None and run.status != "paused":
            self._hyperband.finish(run.run_id, run.val_reward if run.status == "done" else None)

    def _run_with_retries(self, run: RunState, summary: SweepSummary, until_step: int | None = None) -> None:
        from rlscale.runner.builtin.job import run_job

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
                    generator=self._shared_actor("generator", run.recipe),
                    trainer=self._shared_actor("trainer", run.recipe),
                    progress=lambda info, run=run: self._on_progress(run, info),
                    should_stop=lambda run=run: self._should_stop(run),
                    until_step=until_step,
                )
            except Exception as err:  # a crashing job must not end the sweep
                import ray

                if isinstance(err, ray.exceptions.RayActorError):
                    self._release_actors()  # an actor died (maybe the engine): the retry starts fresh ones
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
            if result.get("stopped"):
                run.status, run.note = "stopped", result.get("stop_reason", "")
            elif result["steps"] < run.recipe.steps:
                run.status, run.note = "paused", f"paused at {result['steps'] / run.recipe.steps:.0%} of its compute"
            else:
                run.status, run.note = "done", ""
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

    def _run_by_rungs(self, summary: SweepSummary) -> None:
        """`early_terminate: asymptote`: let fitting.early_stop's scheduler interleave the runs rung by rung (pausing
        and resuming them from checkpoints) and stop those whose asymptote cannot reach the best run's."""
        from rlscale.fitting.early_stop import next_move

        rule = self.study.early_terminate
        by_id = {run.run_id: run for run in self.runs}
        while True:
            move = next_move(self._progress(), rungs=rule.rungs, noise_band=rule.margin)
            if move is None:
                return
            run = by_id[move.key]
            if move.kind == "stop":
                run.status, run.note = "stopped", move.reason
                self.store.set_run_status(run.run_id, "stopped", error=move.reason)
                self.on_update(self.runs)
                continue
            before = (run.step, run.status)
            self.run_one(run, summary, until_step=max(run.step + 1, math.ceil(move.until * run.recipe.steps - 1e-9)))
            if (run.step, run.status) == before:  # never loop on a job that makes no progress
                raise RuntimeError(f"run {run.name} made no progress towards {move.until:.0%} of its compute")

    def _should_stop(self, run: RunState) -> str | None:
        """A reason to stop `run` now (the study's early_terminate rule), or None."""
        rule = self.study.early_terminate
        if rule.type == "none":
            return None
        if rule.type == "hyperband":
            if self._hyperband is None:
                from rlscale.runner.sweep.hyperband import HyperbandStopper

                self._hyperband = HyperbandStopper(run.recipe.steps, rule.min_fraction, rule.eta, seed=self.study.seeds[0],
                                                   study=self.study.name)
            records = self.store.records_frame(self.study.name).dropna(subset=["val_reward"])
            mine = records[records["run_id"] == run.run_id]
            return self._hyperband.check(run.run_id, list(zip(mine["step"], mine["val_reward"])))
        if run.step < rule.min_fraction * run.recipe.steps:
            return None
        from rlscale.fitting.early_stop import reference_fit, should_stop

        progress = self._progress()
        mine = next(p for p in progress if p.key == run.run_id)
        decision = should_stop(mine.fit, reference_fit(progress), run.gpu_hours, noise_band=rule.margin)
        return decision.reason if decision.stop else None

    def _progress(self) -> list:
        """Every run as fitting.early_stop's scheduler sees it: compute spent (fraction of planned steps, and
        GPU-hours, the unit of its fit), its sigmoid fit so far, whether it finished, stopped or failed."""
        from rlscale.fitting.early_stop import RunProgress

        fits = self._current_fits()
        return [RunProgress(key=run.run_id, fraction=run.step / run.recipe.steps, fit=fits.get(run.run_id),
                            finished=run.status == "done", last_reward=run.val_reward, compute=run.gpu_hours,
                            stopped=run.status in ("failed", "stopped"))
                for run in self.runs]

    def _current_fits(self) -> dict:
        """run_id -> sigmoid fit (100 bootstrap draws, and the profile bound on A early termination judges by) on the
        run's evaluations so far, or None if it cannot be fitted; a run's fit is reused until it has new evaluations."""
        from rlscale.fitting.early_stop import UPPER_LEVEL
        from rlscale.fitting.sigmoid import FitError, fit_sigmoid

        records = self.store.records_frame(self.study.name).dropna(subset=["val_reward"])
        fits = {}
        for run_id, rows in records.groupby("run_id"):
            key = (len(rows), int(rows["step"].max()))
            cached = self._fit_cache.get(run_id)
            if cached is None or cached[0] != key:
                try:
                    fit = fit_sigmoid(rows["gpu_hours"].to_numpy(), rows["val_reward"].to_numpy(), bootstrap=100,
                                      upper_level=UPPER_LEVEL)
                except FitError:
                    fit = None
                self._fit_cache[run_id] = cached = (key, fit)
            fits[run_id] = cached[1]
        return fits

    # fits -----------------------------------------------------------------------------------------

    def _refit(self) -> None:
        """Fit every run's curve on its records so far and store the fits."""
        from rlscale.fitting.stored import fit_study

        if self.store.records_frame(self.study.name)["val_reward"].notna().any():
            fit_study(self.store, self.study.name)

    # the shared actors ------------------------------------------------------------------------------

    def run_key(self, run: RunState) -> str:
        """Checkpoint directory name: unique per store, study and run row (a re-created store starts afresh)."""
        ident = f"{self.store.url_for_display}|{self.study.name}|{run.run_id}|{run.created_at}"
        return f"{self.study.name}-{run.run_id}-{hashlib.sha256(ident.encode()).hexdigest()[:10]}"

    def _shared_actor(self, role: str, recipe: Recipe):
        """The live generator or trainer for `recipe`, started on first use and kept for the next job on the same
        model: reloading base weights costs far less than a new actor (a vLLM engine takes 5-45 s to start, a
        trainer a few seconds); a job on another model, head precision or device count gets fresh ones."""
        if role == "generator":
            from rlscale.runner.builtin.generator import create_generator as create

            key = (recipe.model, recipe.fp32_head, recipe.generator_devices)
        else:
            from rlscale.runner.builtin.trainer import create_trainer as create

            key = (recipe.model, recipe.trainer_devices)
        held = self._actors.get(role)
        if held is not None and held[0] != key:
            self._release_actors(role)
        if role not in self._actors:
            self._actors[role] = (key, create(recipe))
        return self._actors[role][1]

    def close(self) -> None:
        """Stop the shared actors, and the local Ray cluster if this driver started it."""
        self._release_actors()
        if self._started_ray:
            import ray

            ray.shutdown()
            self._started_ray = False

    def _release_actors(self, *roles: str) -> None:
        import ray

        for role in roles or list(self._actors):
            _key, actor = self._actors.pop(role, (None, None))
            if actor is not None:
                try:
                    ray.kill(actor)
                except Exception:
                    pass


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
