"""The sweep driver: study -> planned runs in the store -> runs on an engine (rlscale.runner.engine; the builtin
one runs RL jobs on Ray) -> records -> fits.

The driver is the store's one writer: engines hand records back through a callback that runs in this process. Resumable by construction: a run's identity is its config hash and seed, finished runs
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
from rlscale.runner.engine import DEFAULT_ENGINE, Engine, get_engine
from rlscale.runner.sweep.state import FINISHED, RunState, run_name, run_states


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
    """Runs a study's planned runs through an engine (rlscale.runner.engine), one writer to the store, resumable
    and fault tolerant. The driver never touches Ray: the engine does."""

    def __init__(self, study, store, *, engine: Engine | None = None, ray_address: str | None = None,
                 max_retries: int = 2, on_update: Callable[[list[RunState]], None] | None = None,
                 engine_options: dict[str, dict] | None = None):
        self.study = study
        self.store = store
        # an engine given here trains every run; otherwise each run's recipe names its engine, made on first use
        # with ray_address and engine_options[name] (e.g. {"verl": {"shared_dir": ...}})
        self.engine = engine
        self.ray_address, self.engine_options = ray_address, dict(engine_options or {})
        self._engines: dict[str, Engine] = {}
        self.max_retries = max_retries
        self.on_update = on_update or (lambda runs: None)
        self.runs: list[RunState] = []
        self._lock = threading.Lock()
        self._hyperband = None  # rlscale.runner.sweep.hyperband.HyperbandStopper, made on first use
        self._fit_cache: dict[int, tuple[tuple, object]] = {}  # run_id -> ((evaluations, last step), fit)

    # planning -------------------------------------------------------------------------------------

    def plan(self) -> list[RunState]:
        """Put every planned point in the store (idempotent) and load each run's status and progress."""
        from rlscale.planner.study import planned_runs

        self.store.upsert_study(self.study.name, self.study.to_spec())
        several_seeds = len(self.study.seeds) > 1
        planned = {}
        for point in planned_runs(self.study):
            name = run_name(point, several_seeds)
            planned[self.store.ensure_run(self.study.name, name, point.recipe.to_json(), point.seed)] = (name, point)
        self.runs = self._load(planned)
        return self.runs

    def add_run(self, name: str, recipe: Recipe, seed: int, planned_gpu_hours: float) -> RunState:
        """Register one run (idempotent) and load its status and progress from the store."""
        run_id = self.store.ensure_run(self.study.name, name, recipe.to_json(), seed)
        state, = self._load({run_id: (name, planned_gpu_hours)})
        self.runs.append(state)
        return state

    def _load(self, planned: dict) -> list[RunState]:
        """The RunStates of `planned` (run_id -> (name, planned point or GPU-hours)), in its order."""
        runs = self.store.runs_frame(self.study.name)
        runs = runs.set_index("run_id").loc[list(planned)].reset_index()
        hours = {name: getattr(plan, "gpu_hours", plan) for name, plan in planned.values()}
        return run_states(runs, self.store.records_frame(self.study.name), hours)

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

    def run_one(self, run: RunState, summary: SweepSummary, until_step: int | None = None,
                should_stop: Callable[[], str | None] | None = None) -> None:
        """Run one job to the end, or pause it at `until_step` (retrying crashes), then refit the study's curves.
        should_stop: asked at each checkpoint (default: the study's early_terminate rule for one run at a time)."""
        self._run_with_retries(run, summary, until_step, should_stop or (lambda: self._should_stop(run)))
        self._refit()
        if self._hyperband is not None and run.status != "paused":
            self._hyperband.finish(run.run_id, run.val_reward if run.status == "done" else None)

    def _run_with_retries(self, run: RunState, summary: SweepSummary, until_step: int | None,
                          should_stop: Callable[[], str | None]) -> None:
        while True:
            run.attempts += 1
            run.status, run.note = "running", ("" if run.attempts == 1 else f"retry {run.attempts - 1}")
            self.store.set_run_status(run.run_id, "running")
            self.on_update(self.runs)
            try:
                result = self.engine_for(run.recipe).run(
                    run.recipe,
                    run_key=self.run_key(run),
                    on_records=lambda records, run=run: self._on_records(run, records),
                    until_step=until_step,
                    should_stop=should_stop,
                    progress=lambda info, run=run: self._on_progress(run, info),
                    **self._compute_stop(run),
                )
            except Exception as err:  # a crashing job must not end the sweep
                message = f"{type(err).__name__}: {err}".splitlines()[0][:500]
                if run.attempts <= self.max_retries:
                    run.note = f"attempt {run.attempts} failed: {message}"
                    continue
                run.status, run.note = "failed", message
                self.store.set_run_status(run.run_id, "failed", error=_error_text(err))
                self.on_update(self.runs)
                return
            for key, seconds in result.timings.items():
                summary.timings[key] = summary.timings.get(key, 0.0) + seconds
            summary.busy_seconds += result.busy_seconds
            if result.stopped:
                run.status, run.note = "stopped", result.stop_reason
            elif result.steps < run.recipe.steps and not result.compute_reached:
                run.status, run.note = "paused", f"paused at {result.steps / run.recipe.steps:.0%} of its compute"
            else:
                run.status, run.note = "done", ""
            self.store.set_run_status(run.run_id, run.status, error=run.note or None)
            self.on_update(self.runs)
            return

    def _compute_stop(self, run: RunState) -> dict:
        """{gpu_hours: planned} when the study plans measured GPU-hours, so the run ends at its planned compute
        on any host (the step count follows from it); {} when it plans steps, rollouts or tokens."""
        compute = self.study.compute
        if compute is None or compute.unit != "gpu_hours" or not run.planned_gpu_hours > 0:
            return {}
        return {"gpu_hours": run.planned_gpu_hours}

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
        """`early_terminate: asymptote`: the rung scheduler (rlscale.runner.sweep.scheduler) interleaves the runs rung
        by rung, pausing and resuming them from checkpoints, and stops those whose asymptote cannot reach the best
        run's; this supplies the runs' progress and what advancing or stopping one means here."""
        from rlscale.runner.sweep.scheduler import RungSchedule, run_by_rungs

        by_id = {run.run_id: run for run in self.runs}

        def advance(run_id, until, check):
            run = by_id[run_id]
            until_step = max(run.step + 1, math.ceil(until * run.recipe.steps - 1e-9))
            self.run_one(run, summary, until_step=until_step, should_stop=lambda: check(self._progress_of(run)))

        def stop(run_id, reason):
            run = by_id[run_id]
            run.status, run.note = "stopped", reason
            self.store.set_run_status(run.run_id, "stopped", error=reason)
            self.on_update(self.runs)

        run_by_rungs(RungSchedule.from_rule(self.study.early_terminate), self._progress, advance, stop)

    def _should_stop(self, run: RunState) -> str | None:
        """A reason to stop `run` now by the study's early_terminate rule when it runs on its own (not by rungs:
        e.g. a bayes trial), or None."""
        rule = self.study.early_terminate
        if rule.type == "none":
            return None
        if rule.type == "asymptote":
            from rlscale.runner.sweep.scheduler import RungSchedule

            return RungSchedule.from_rule(rule).stop_check(self._progress())(self._progress_of(run))
        if self._hyperband is None:
            from rlscale.runner.sweep.hyperband import HyperbandStopper

            self._hyperband = HyperbandStopper(run.recipe.steps, rule.min_fraction, rule.eta, seed=self.study.seeds[0],
                                               study=self.study.name)
        records = self.store.records_frame(self.study.name).dropna(subset=["val_reward"])
        mine = records[records["run_id"] == run.run_id]
        return self._hyperband.check(run.run_id, list(zip(mine["step"], mine["val_reward"])))

    def _progress(self) -> list:
        """Every run as the rung scheduler sees it: compute spent (fraction of planned steps, and GPU-hours, the
        unit of its fit), its sigmoid fit so far, whether it finished, stopped or failed."""
        fits = self._current_fits()
        return [self._progress_of(run, fits.get(run.run_id)) for run in self.runs]

    def _progress_of(self, run: RunState, fit=...):
        """One run as the rung scheduler sees it (its fit refreshed from the store unless given)."""
        from rlscale.fitting.early_stop import RunProgress

        if fit is ...:
            fit = self._current_fits(run.run_id).get(run.run_id)
        return RunProgress(key=run.run_id, fraction=run.step / run.recipe.steps, fit=fit,
                           finished=run.status == "done", last_reward=run.val_reward, compute=run.gpu_hours,
                           stopped=run.status in ("failed", "stopped"))

    def _current_fits(self, run_id: int | None = None) -> dict:
        """run_id -> sigmoid fit (100 bootstrap draws, and the profile bound on A early termination judges by) on the
        run's evaluations so far, or None if it cannot be fitted; every run's, or only `run_id`'s; a run's fit is
        reused until it has new evaluations."""
        from rlscale.fitting.early_stop import UPPER_LEVEL
        from rlscale.fitting.sigmoid import FitError, fit_sigmoid

        records = self.store.records_frame(self.study.name).dropna(subset=["val_reward"])
        if run_id is not None:
            records = records[records["run_id"] == run_id]
        fits = {}
        for key, rows in records.groupby("run_id"):
            stamp = (len(rows), int(rows["step"].max()))
            cached = self._fit_cache.get(key)
            if cached is None or cached[0] != stamp:
                try:
                    fit = fit_sigmoid(rows["gpu_hours"].to_numpy(), rows["val_reward"].to_numpy(), bootstrap=100,
                                      upper_level=UPPER_LEVEL)
                except FitError:
                    fit = None
                self._fit_cache[key] = cached = (stamp, fit)
            fits[key] = cached[1]
        return fits

    # fits -----------------------------------------------------------------------------------------

    def _refit(self) -> None:
        """Fit every run's curve on its records so far and store the fits."""
        from rlscale.fitting.stored import fit_study

        if self.store.records_frame(self.study.name)["val_reward"].notna().any():
            fit_study(self.store, self.study.name)

    # the engine -------------------------------------------------------------------------------------

    def run_key(self, run: RunState) -> str:
        """Checkpoint name: unique per store, study and run row (a re-created store starts afresh)."""
        ident = f"{self.store.url_for_display}|{self.study.name}|{run.run_id}|{run.created_at}"
        return f"{self.study.name}-{run.run_id}-{hashlib.sha256(ident.encode()).hexdigest()[:10]}"

    def engine_for(self, recipe: Recipe) -> Engine:
        """The engine that trains `recipe`: the one given to the driver, else the one its `engine` key names."""
        if self.engine is not None:
            return self.engine
        name = getattr(recipe, "engine", DEFAULT_ENGINE)
        if name not in self._engines:
            self._engines[name] = get_engine(name, ray_address=self.ray_address, **self.engine_options.get(name, {}))
        return self._engines[name]

    def close(self) -> None:
        """Release the engines' workers (and the local Ray cluster one started)."""
        for engine in [self.engine, *self._engines.values()]:
            if engine is not None:
                engine.close()


def _error_text(err: Exception) -> str:
    text = "".join(traceback.format_exception_only(type(err), err)).strip()
    return text[-2000:]
