"""The sweep driver: study -> planned runs in the store -> runs on an engine -> records -> fits.
The driver is the store's one writer; one driver per study and store (Store.lock_study); resumable by construction."""

import hashlib
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from rlscale.fitting.curves import FitMemo, compute_column, fit_of_record, latest_runs
from rlscale.fitting.sigmoid.points import reward_scale
from rlscale.planner.recipe import Recipe
from rlscale.runner.engine import DEFAULT_ENGINE, ComputeStop, DevicesUnavailable, Engine, study_engine
from rlscale.runner.engine_process import EngineProcess
from rlscale.runner.sweep.head import SweepCluster, head_dir
from rlscale.runner.sweep.pool import JobPool, devices_text
from rlscale.runner.sweep.scheduler import RunProgress, Schedule, run_concurrently, schedule_for
from rlscale.runner.sweep.state import FINISHED, RunState, run_name, run_states

from rlscale.base.numbers import NOISE_BAND

__all__ = ["SweepDriver", "SweepSummary", "devices_text"]

STORE_OUTAGE_SECONDS = 300.0  # how long the sweep waits for a database that went away before it gives up
INTERRUPT_SECONDS = 120.0  # after Ctrl-C, how long the runs in flight get to reach a checkpoint and end


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
    """Runs a study's planned runs through engines, the store's one writer, resumable and fault tolerant. It never
    calls Ray: the engines do, on the named cluster or the sweep's local head (runner/sweep/head.py)."""

    def __init__(
        self,
        study,
        store,
        *,
        engine: Engine | None = None,
        ray_address: str | None = None,
        max_retries: int = 2,
        on_update: Callable[[list[RunState]], None] | None = None,
        engine_options: dict[str, dict] | None = None,
        max_concurrent: int | None = None,
    ):
        self.study = study
        self.store = store
        # given: it trains every run; else each recipe names its engine, made on first use with engine_options[name]
        self.engine = engine
        self.ray_address, self.engine_options = ray_address, dict(engine_options or {})
        self._engines: dict[str, Engine] = {}
        self.max_retries = max_retries
        self.on_update = on_update or (lambda runs: None)
        self.runs: list[RunState] = []
        # runs in flight at once: this, else the study's max_concurrent, else as many as the free devices admit
        self.max_concurrent = max_concurrent
        self.cluster_status = ""  # "GPU 6/8 busy" while a sweep runs (for the live view)
        self.store_note = ""  # set while the store is unreachable and writes are being retried
        self.interrupted = False  # the sweep is ending early: jobs that end now are not retried
        self._lock = threading.RLock()  # the driver's shared state (the store serialises its own calls)
        self._fits_lock = threading.Lock()
        self._engines_lock = threading.Lock()
        self._study_lock = None  # this driver's hold on its study (Store.lock_study), from plan() to close()
        self.cluster = SweepCluster(ray_address, head_dir(store.url_for_display, study.name), on_note=self._store_note)
        # a database that goes away (a server restart) is waited for, with a note on the live view meanwhile
        store.wait_out_outages(STORE_OUTAGE_SECONDS, self._store_note)
        from rlscale.runner.tracking import make_tracker

        self.tracker = make_tracker(getattr(study, "tracking", None), study.name)  # `tracking:` mirrors evaluations
        self._fit_memo = FitMemo()  # each run is refitted only when its points change
        self._noise_band = NOISE_BAND  # the study's, at its rewards so far (its RewardScale's)
        self._stored_tip: dict[int, tuple[int, float]] = {}  # run id -> its last stored (step, gpu_hours)

    # planning -------------------------------------------------------------------------------------

    def plan(self) -> list[RunState]:
        """Put every planned point in the store (idempotent) and load each run's status and progress; with `extend`
        above 1, a done run short of its grown steps or compute is paused again, to resume from its checkpoint."""
        from rlscale.planner.planning import planned_runs
        from rlscale.planner.study_file import stored_spec

        self._hold()
        self.store.upsert_study(self.study.name, stored_spec(self.study))
        several_seeds = len(self.study.seeds) > 1
        planned = {}
        for point in planned_runs(self.study):
            name = run_name(point, several_seeds)
            planned[self.store.ensure_run(self.study.name, name, point.recipe.to_json(), point.seed)] = (name, point)
        self._drop_superseded(planned)
        self.runs = self._load(planned)
        return self.runs

    def _drop_superseded(self, planned: dict) -> None:
        runs = self.store.runs_frame(self.study.name)
        records = self.store.records_frame(self.study.name)
        metric = self.study.metric if self.study.metric in records.columns else "val_reward"
        evaluated = set(records.loc[records[metric].notna(), "run_id"])
        current = {(name, point.seed) for name, point in planned.values()}
        for row in runs.itertuples():
            replaced = row.run_id not in planned and (row.run, row.seed) in current
            if replaced and row.status in ("failed", "pending") and row.run_id not in evaluated:
                self.store.delete_run(row.run_id)

    def add_run(self, name: str, recipe: Recipe, seed: int, planned_gpu_hours: float) -> RunState:
        """Register one run (idempotent) and load its status and progress from the store."""
        self._hold()
        run_id = self.store.ensure_run(self.study.name, name, recipe.to_json(), seed)
        (state,) = self._load({run_id: (name, planned_gpu_hours)})
        self.runs.append(state)
        return state

    def _load(self, planned: dict) -> list[RunState]:
        runs = self.store.runs_frame(self.study.name)
        runs = runs.set_index("run_id").loc[list(planned)].reset_index()
        hours = {name: getattr(plan, "gpu_hours", plan) for name, plan in planned.values()}
        records = self.store.records_frame(self.study.name)
        factor = getattr(self.study, "extend", 1.0)
        extended = factor > 1 and all(hasattr(plan, "recipe") for _name, plan in planned.values())  # not Optuna's
        states = run_states(runs, records, hours, extend=factor if extended else 1.0)
        self._stored_tip.update({run.run_id: (run.step, run.gpu_hours) for run in states})
        # each run's first record (step, gpu_hours): where its step cost is counted from, as its engine counted it
        first = records.sort_values("step").groupby("run_id")[["step", "gpu_hours"]].first()
        for run in states:
            if run.status == "failed" and run.recipe is not None:  # a sweep run again retries what crashed last time
                run.status, run.note = "paused", f"retried; it failed before: {run.note}"[:200]  # the store keeps why
            origin = (
                (int(first.at[run.run_id, "step"]), float(first.at[run.run_id, "gpu_hours"]))
                if run.run_id in first.index
                else None
            )
            ended = run.recipe is not None and self._reached_end(run, origin)
            if run.status not in FINISHED and ended:
                # a driver killed between a run's last records and its status: the records say it is done
                self._set_status(run, "done", "")
            if extended and run.recipe is not None and run.status == "done" and not ended:
                self._queue(run, f"extended {factor:g}x")
        return states

    def _queue(self, run: RunState, note: str) -> None:
        """A done run queued again (to resume from its checkpoint), in the store too, so status shows it queued."""
        run.status, run.note = "paused", note
        self.store.set_run_status(run.run_id, "paused", error=note)

    # running --------------------------------------------------------------------------------------

    def run(self) -> SweepSummary:
        """Run the unfinished runs, as many at once as free devices and max_concurrent admit; failures don't stop it.
        A bayes study has no planned runs: Optuna proposes them as it goes (runner.sweep.bayes)."""
        if self.study.method == "bayes":
            from rlscale.runner.sweep.bayes import run_bayes

            self.plan()  # stores the study's spec and holds it; close(), which run_bayes calls, lets go
            return run_bayes(self)
        try:
            self._hold()
            if not self.runs:
                self.plan()
            started = time.perf_counter()
            summary = SweepSummary(self.runs)
            todo = [run for run in self.runs if run.status not in FINISHED]
            if todo:
                self.run_schedule(self.schedule(todo), self.runs, summary)
        finally:
            self.close()
        summary.wall_seconds = time.perf_counter() - started
        self.on_update(self.runs)
        return summary

    def schedule(self, runs: list[RunState], *, by_rungs: bool = True) -> Schedule:
        """The study's early-termination Schedule for `runs` (by_rungs False: to the end, judged at checkpoints)."""
        steps = next((run.recipe.steps for run in runs if run.recipe is not None), 1)
        return schedule_for(
            self.study.early_terminate,
            by_rungs=by_rungs,
            steps=steps,
            evaluations=self.evaluations,
            seed=self.study.seeds[0],
            study=self.study.name,
        )

    def run_schedule(self, schedule: Schedule, runs: list[RunState], summary: SweepSummary) -> None:
        """Advance `runs` by `schedule`, each advance a job on its own thread once its devices are free (JobPool)."""
        todo = [run for run in runs if run.status not in FINISHED and run.recipe is not None]
        engines = {run.run_id: self.engine_for(run.recipe) for run in todo}
        first = next((run.recipe for run in todo), None)
        pool = JobPool(
            {run.run_id: run for run in runs},
            devices={key: engine.devices(self._run(key).recipe) for key, engine in engines.items()},
            nodes=lambda: self._nodes(first),
            limit=self.max_concurrent or getattr(self.study, "max_concurrent", None),
            advance=lambda run, until_step, should_stop: self.advance(
                run, until_step, should_stop, summary=summary, schedule=schedule
            ),
            progress_of=self.progress_of,
            stopped=self._mark_stopped,
            on_change=self._cluster_changed,
            adopted={key for key, engine in engines.items() if self._has_live_job(engine, self._run(key))},
        )
        try:
            run_concurrently(
                schedule,
                lambda: self.progress(runs, pool.waiting()),
                pool.start,
                pool.wait,
                pool.stop,
                admit=pool.admit,
                slots=pool.slots,
            )
        except BaseException:
            self.interrupted = True  # jobs that end now were stopped, not crashed: no retries
            pool.interrupt()
            self._close_engines()  # stops their jobs now (a checkpoint may be far off)
            for run in pool.join(INTERRUPT_SECONDS):  # a run whose thread did not end: paused here, its last word
                if run.status in ("starting", "running"):
                    self._set_status(run, "paused", "interrupted")
            raise

    def advance(
        self,
        run: RunState,
        until_step: int | None,
        should_stop: Callable[[], str | None],
        *,
        summary: SweepSummary,
        schedule: Schedule,
    ) -> bool:
        """Run `run`'s job to `until_step` (None: its end) with retries, then refit the study and tell `schedule`
        when the run ended for good; False when its devices were taken before it started (back to the queue)."""
        if not self._run_with_retries(run, summary, until_step, should_stop):
            return False
        self.refit()
        if run.status != "paused":
            with self._lock:
                schedule.ended(run.run_id, run.val_reward if run.status == "done" else None)
        return True

    def _run_with_retries(
        self, run: RunState, summary: SweepSummary, until_step: int | None, should_stop: Callable[[], str | None]
    ) -> bool:
        while True:
            # the study's lock may have gone with the store's connection (a server restart) and another driver taken it
            if self._study_lock is not None and not self._study_lock.ensure():
                raise self._busy()
            run.attempts += 1
            # `rlscale status` in another terminal shows what a run in flight holds
            self._set_status(
                run,
                "running",
                "" if run.attempts == 1 else f"retry {run.attempts - 1}",
                stored=f"on {run.devices}" if run.devices else None,
            )
            generation = self.cluster.enter()
            try:
                result = self.engine_for(run.recipe).run(
                    run.recipe,
                    run_key=self.run_key(run),
                    on_records=lambda records, run=run: self._on_records(run, records),
                    until_step=until_step,
                    should_stop=should_stop,
                    progress=lambda info, run=run: self._on_progress(run, info),
                    resume_gpu_hours=lambda step, run=run: self._stored_gpu_hours(run, step),
                    **self._compute_stop(run),
                )
                error = None
            except DevicesUnavailable as err:
                run.attempts -= 1
                self._set_status(run, "pending", f"devices taken: {str(err).splitlines()[0][:80]}", shown="queued")
                return False
            except Exception as err:  # a crashing job must not end the sweep
                error = err
            finally:
                self.cluster.leave()
            if run.run_id in self._stored_tip:  # the live view's last reading gives way to what the store holds
                run.step, run.gpu_hours = self._stored_tip[run.run_id]
            if error is not None:
                if self.interrupted:  # the sweep is ending (Ctrl-C): its jobs were stopped, not crashed
                    self._set_status(run, "paused", "interrupted")
                    return True
                if self.cluster.recover(generation, self._close_engines, self._end_engine_processes):  # head died
                    run.attempts -= 1
                    continue
                message = f"{type(error).__name__}: {error}".splitlines()[0][:500]
                if run.attempts <= self.max_retries:
                    run.note = f"attempt {run.attempts} failed: {message}"
                    continue
                self._set_status(run, "failed", message, stored=_error_text(error))
                return True
            with self._lock:
                for key, seconds in result.timings.items():
                    summary.timings[key] = summary.timings.get(key, 0.0) + seconds
                summary.busy_seconds += result.busy_seconds
            if result.stopped and self.interrupted:  # stopped at a checkpoint by Ctrl-C, not by the study's rule
                self._set_status(run, "paused", "interrupted")
            elif result.stopped:
                self._set_status(run, "stopped", result.stop_reason)
            elif result.steps < run.recipe.steps and not result.compute_reached:
                self._set_status(run, "paused", f"paused at {result.steps / run.recipe.steps:.0%} of its compute")
            else:
                self._set_status(run, "done", "")
            return True

    def _set_status(self, run: RunState, status: str, note: str, *, stored: str | None = ..., shown: str = "") -> None:
        run.status, run.note = shown or status, note
        error = (note or None) if stored is ... else stored
        self.store.set_run_status(run.run_id, status, error=error)
        untold = self._tell_ended(run, status) if status in FINISHED else ""
        if untold:  # kept beside why the run ended, which it does not replace
            run.note = "; ".join(filter(None, [note, untold]))[:200]
            self.store.set_run_status(run.run_id, status, error="\n".join(filter(None, [error, untold])))
        self.on_update(self.runs)

    def _tell_ended(self, run: RunState, status: str) -> str:
        """The run's engine and the study's tracker end what they keep open for it (its MLflow runs); "" when told,
        else why not: a tracker's server gone is a note on the run, not a failure, for its training is over."""
        engine, key = self._live_engine(run.recipe), self.run_key(run)
        try:
            if engine is not None and not getattr(engine, "lost", False):
                engine.ended(key, status)
            if self.tracker is not None:
                self.tracker.end(key, status)
        except Exception as err:  # a tracker's server, or an engine's process, gone: the store keeps the run's end
            return f"its tracker run not ended: {type(err).__name__}: {err}".splitlines()[0][:200]
        return ""

    def _store_note(self, note: str) -> None:
        self.store_note = note
        self.on_update(self.runs)

    def _cluster_changed(self, status: str) -> None:
        self.cluster_status = status
        self.on_update(self.runs)

    def _mark_stopped(self, run: RunState, reason: str) -> None:
        self._set_status(run, "stopped", reason)

    def _hold(self) -> None:
        if self._study_lock is None:
            self._study_lock = self.store.lock_study(self.study.name)

    def _busy(self):
        from rlscale.db.study_lock import StudyBusy

        return StudyBusy(
            f"study {self.study.name!r} was taken by another driver while the store was away", field="study"
        )

    def _run(self, run_id: int) -> RunState:
        return next(run for run in self.runs if run.run_id == run_id)

    def _devices_per_job(self) -> int:
        return max(
            (run.recipe.generator_devices + run.recipe.trainer_devices for run in self.runs if run.recipe is not None),
            default=0,
        )

    def _reached_end(self, run: RunState, origin: tuple[int, float] | None) -> bool:
        """Whether the run's stored records end it: at its planned compute by the engines' rule, else at its steps."""
        planned = self._compute_stop(run).get("gpu_hours")
        if planned is None:
            return run.step >= run.recipe.steps
        return run.step > 0 and ComputeStop(planned, origin=origin).reaches(run.step, run.gpu_hours)

    def _stored_gpu_hours(self, run: RunState, step: int) -> float | None:
        records = self.store.records_frame(self.study.name)
        at = records[(records["run_id"] == run.run_id) & (records["step"] == step)]
        return float(at["gpu_hours"].iloc[0]) if len(at) else None

    def _compute_stop(self, run: RunState) -> dict:
        compute = self.study.compute
        if compute is None or compute.unit != "gpu_hours" or not run.planned_gpu_hours > 0:
            return {}
        return {"gpu_hours": run.planned_gpu_hours}

    def _on_records(self, run: RunState, records: list[dict]) -> None:
        self.store.add_records(run.run_id, records)  # the driver is the one writer, for every job's thread
        if self.tracker is not None:
            self.tracker.log(self.run_key(run), records)
        step, hours = self._stored_tip.get(run.run_id, (0, 0.0))
        for record in records:
            step, hours = max(step, int(record["step"])), max(hours, float(record["gpu_hours"]))
            if record.get("val_reward") is not None:
                run.val_reward = float(record["val_reward"])
        self._stored_tip[run.run_id] = step, hours
        run.step, run.gpu_hours = max(run.step, step), max(run.gpu_hours, hours)
        self.on_update(self.runs)

    def _on_progress(self, run: RunState, info: dict) -> None:
        run.step = int(info.get("step", run.step))
        run.gpu_hours = float(info.get("gpu_hours", run.gpu_hours))
        if info.get("val_reward") is not None:
            run.val_reward = float(info["val_reward"])
        self.on_update(self.runs)

    # what the scheduler sees ----------------------------------------------------------------------

    def evaluations(self, run_id: int) -> list[tuple[int, float]]:
        """The run's (step, reward) pairs stored so far, the reward the study's metric."""
        metric = self.study.metric
        records = self.store.records_frame(self.study.name)
        if metric not in records.columns:
            return []
        mine = records[(records["run_id"] == run_id) & records[metric].notna()]
        return list(zip(mine["step"], mine[metric]))

    def progress(self, runs: list[RunState] | None = None, waiting: dict | None = None) -> list[RunProgress]:
        """Every run (or `runs`) as the scheduler sees it; runs in `waiting` (run_id -> target) read as busy."""
        fits = self._current_fits()
        waiting = waiting or {}
        return [
            replace(progress, target=waiting[run.run_id]) if run.run_id in waiting else progress
            for run in (self.runs if runs is None else runs)
            for progress in [self._progress(run, fits.get(run.run_id))]
        ]

    def progress_of(self, run: RunState) -> RunProgress:
        """One run as the scheduler sees it, its fit refreshed from the store."""
        return self._progress(run, self._current_fits(run.run_id).get(run.run_id))

    def _progress(self, run: RunState, fitted: tuple | None) -> RunProgress:
        fit, compute = fitted if fitted is not None else (None, run.gpu_hours)
        return RunProgress(
            key=run.run_id,
            fraction=run.step / run.recipe.steps,
            fit=fit,
            finished=run.status == "done",
            last_reward=run.val_reward,
            compute=compute,  # in the fit's unit
            stopped=run.status in ("failed", "stopped"),
            noise_band=self._noise_band,
        )

    def _current_fits(self, run_id: int | None = None) -> dict:
        """run_id -> (its fit of record with early termination's bound on A, or None; its largest compute)."""
        from rlscale.fitting.rules.early_stop import UPPER_LEVEL

        metric, column = self.study.metric, compute_column(self.study)
        records = self.store.records_frame(self.study.name).dropna(subset=[metric])
        # the study's reward scale, as its fit of record reads it (the latest attempt of each run)
        records = records[records["run_id"].isin(latest_runs(self.store.runs_frame(self.study.name))["run_id"])]
        scale = reward_scale(records[metric])
        self._noise_band = scale.noise_band
        if run_id is not None:
            records = records[records["run_id"] == run_id]
        self._fit_memo.size = 2 * len(self.runs) + 16
        fits = {}
        with self._fits_lock:  # one thread fits at a time: the others then find its fits in the memo
            for key, rows in records.groupby("run_id"):
                fit = fit_of_record(
                    rows[column].to_numpy(dtype=float, na_value=float("nan")),
                    rows[metric].to_numpy(dtype=float),
                    record_breaking=self.study.fits_record_breaking,
                    scale=scale,
                    upper_level=UPPER_LEVEL,
                    cache=self._fit_memo,
                )
                fits[key] = (fit, float(rows[column].max()))
        return fits

    # fits -----------------------------------------------------------------------------------------

    def refit(self) -> None:
        """Store the study's fit of record on its records so far (what its decision reads)."""
        from rlscale.fitting.rules.reasons import Refusal
        from rlscale.fitting.stored import store_fits

        try:
            store_fits(self.store, self.study.name)
        except Refusal:  # no run is evaluated yet
            pass

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
        with self._engines_lock:
            engine = self._engines.get(name)
            if isinstance(engine, EngineProcess) and engine.lost:  # its process ended: a new one for this attempt
                self._engines.pop(name).close()
            if name not in self._engines:
                options = {"ray_address": self.cluster.address_for(name, cpus=self._devices_per_job())}
                options |= self.engine_options.get(name, {})
                if self.cluster.in_own_process(name):
                    self._engines[name] = EngineProcess(name, **options)
                else:
                    self._engines[name] = study_engine(self.study, name, **options)
            return self._engines[name]

    def _has_live_job(self, engine: Engine, run: RunState) -> bool:
        live = getattr(engine, "has_live_job", None)
        return bool(live and live(self.run_key(run)))

    def _nodes(self, recipe: Recipe | None) -> list | None:
        engine = self._live_engine(recipe)
        return engine.nodes() if engine is not None else None

    def _live_engine(self, recipe: Recipe | None) -> Engine | None:
        """The engine that trains `recipe` if it is made already (None: none is)."""
        with self._engines_lock:
            return self.engine or (self._engines.get(recipe.engine) if recipe is not None else None)

    def close(self) -> None:
        """Release the engines' workers, stop the local head the sweep owns, and let go of the study."""
        try:
            self._close_engines()
            if self.engine is not None:
                self.engine.close()
            self.cluster.close()
            if self.tracker is not None:
                self.tracker.close()
        finally:
            if self._study_lock is not None:
                self._study_lock.release()
                self._study_lock = None

    def _end_engine_processes(self) -> None:
        with self._engines_lock:
            engines = list(self._engines.values())
        for engine in engines:
            if isinstance(engine, EngineProcess):
                engine.end()

    def _close_engines(self) -> None:
        with self._engines_lock:
            engines, self._engines = list(self._engines.values()), {}
        for engine in engines:
            engine.close()


def _error_text(err: Exception) -> str:
    text = "".join(traceback.format_exception_only(type(err), err)).strip()
    return text[-2000:]
