"""The sweep driver: study -> planned runs in the store -> runs on an engine (rlscale.runner.engine; the builtin
one runs RL jobs on Ray) -> records -> fits.

The driver is the store's one writer: engines hand records back through a callback that runs in this process. Resumable by construction: a run's identity is its config hash and seed, finished runs
are skipped, interrupted ones resume from their checkpoint, and (run, step) is unique in the store.
"""

import hashlib
import math
import queue
import threading
import time
import traceback
from dataclasses import dataclass, field, replace
from typing import Callable

from rlscale.planner.recipe import Recipe
from rlscale.runner.engine import DEFAULT_ENGINE, Engine, get_engine
from rlscale.runner.sweep.state import FINISHED, RunState, run_name, run_states

STORE_OUTAGE_SECONDS = 300.0  # how long the sweep waits for a database that went away before it gives up
REQUEUE_SECONDS = 10.0  # a run whose devices were taken at start waits this long before it is admitted again
CLUSTER_POLL_SECONDS = 2.0  # how often admission reads the cluster's free devices
EXTEND_TOLERANCE = 0.05  # a run within this fraction of its extended compute is done (runs end within ~1%)


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
                 engine_options: dict[str, dict] | None = None, max_concurrent: int | None = None):
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
        # runs in flight at once: this, else the study's max_concurrent, else as many as the free devices admit
        self.max_concurrent = max_concurrent
        self.cluster_status = ""  # "GPU 6/8 busy" while a sweep runs (for the live view)
        self.store_note = ""  # set while the store is unreachable and writes are being retried
        self.interrupted = False  # the sweep is ending early: jobs that end now are not retried
        self._lock = threading.RLock()  # the store's one writer, and the driver's shared state
        self._fits_lock = threading.Lock()
        self._engines_lock = threading.Lock()
        self._hyperband = None  # rlscale.runner.sweep.hyperband.HyperbandStopper, made on first use
        self._fit_cache: dict[int, tuple[tuple, object]] = {}  # run_id -> ((evaluations, last step), fit)

    # planning -------------------------------------------------------------------------------------

    def plan(self) -> list[RunState]:
        """Put every planned point in the store (idempotent) and load each run's status and progress. With the
        study's `extend` above 1, each run's steps and planned compute grow by it and a finished run short of them
        is paused again, to resume from its last checkpoint (its identity, recipe hash and seed, is unchanged)."""
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
        """The RunStates of `planned` (run_id -> (name, planned point or GPU-hours)), in its order. Planned points of
        a study with `extend` above 1 get their steps grown by it (their compute grew in the plan), and a done run
        short of the new plan is paused, so the sweep resumes it from its last checkpoint."""
        runs = self.store.runs_frame(self.study.name)
        runs = runs.set_index("run_id").loc[list(planned)].reset_index()
        hours = {name: getattr(plan, "gpu_hours", plan) for name, plan in planned.values()}
        states = run_states(runs, self.store.records_frame(self.study.name), hours)
        factor = getattr(self.study, "extend", 1.0)
        for run, (_name, plan) in zip(states, planned.values()):
            if not (factor > 1 and run.recipe is not None and hasattr(plan, "recipe")):
                continue
            run.recipe = run.recipe.model_copy(update={"steps": math.ceil(run.recipe.steps * factor)})
            if self._compute_stop(run):  # it ends at measured compute, within half a step of its plan
                short = run.gpu_hours < (1 - EXTEND_TOLERANCE) * run.planned_gpu_hours
            else:
                short = run.step < run.recipe.steps
            if run.status == "done" and short:
                run.status, run.note = "paused", f"extended {factor:g}x"
        return states

    # running --------------------------------------------------------------------------------------

    def run(self) -> SweepSummary:
        """Run every unfinished planned run, several at once where the cluster's free devices and max_concurrent
        admit them; returns the summary (failed runs do not stop the sweep)."""
        if not self.runs:
            self.plan()
        started = time.perf_counter()
        summary = SweepSummary(self.runs)
        todo = [run for run in self.runs if run.status not in FINISHED]
        if todo:
            from rlscale.runner.sweep.scheduler import GridSchedule, RungSchedule

            rule = self.study.early_terminate
            schedule = RungSchedule.from_rule(rule) if rule.type == "asymptote" else GridSchedule()
            try:
                self.run_schedule(schedule, self.runs, summary)
            finally:
                self.close()
        summary.wall_seconds = time.perf_counter() - started
        self.on_update(self.runs)
        return summary

    def run_schedule(self, schedule, runs: list[RunState], summary: SweepSummary) -> None:
        """Advance `runs` by `schedule` (runner/sweep/scheduler.py), each advance a job on a thread of its own,
        admitted when its devices are free (runner/sweep/admission.py) and at most max_concurrent at once."""
        from rlscale.runner.sweep.scheduler import run_concurrently

        by_id = {run.run_id: run for run in runs}
        pool = JobPool(self, by_id, summary)
        if hasattr(schedule, "slots"):  # the rung schedule judges the runs itself
            schedule = replace(schedule, slots=pool.slots)
        else:  # every run to its end, each judged by the study's rule at its checkpoints (hyperband, or a bayes trial)
            pool.judge = self._should_stop
        try:
            run_concurrently(schedule, lambda: self._progress(runs, pool.waiting()), pool.start, pool.wait,
                             pool.stop, admit=pool.admit, slots=pool.slots)
        except BaseException:
            pool.interrupt()
            raise

    def _run_with_retries(self, run: RunState, summary: SweepSummary, until_step: int | None,
                          should_stop: Callable[[], str | None]) -> bool:
        """Run `run`'s job until it ends; False when its devices were taken before it started (DevicesUnavailable:
        back to the queue, no attempt counted)."""
        from rlscale.runner.engine import DevicesUnavailable

        while True:
            run.attempts += 1
            run.status, run.note = "running", ("" if run.attempts == 1 else f"retry {run.attempts - 1}")
            # `rlscale status` in another terminal shows what a run in flight holds
            self._store(self.store.set_run_status, run.run_id, "running",
                        error=f"on {run.devices}" if run.devices else None)
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
            except DevicesUnavailable as err:
                run.attempts -= 1
                run.status, run.note = "queued", f"devices taken: {str(err).splitlines()[0][:80]}"
                self._store(self.store.set_run_status, run.run_id, "pending")
                self.on_update(self.runs)
                return False
            except Exception as err:  # a crashing job must not end the sweep
                message = f"{type(err).__name__}: {err}".splitlines()[0][:500]
                if self.interrupted:  # the sweep is ending (Ctrl-C): its jobs were stopped, not crashed
                    run.status, run.note = "paused", "interrupted"
                    self._store(self.store.set_run_status, run.run_id, "paused", error="interrupted")
                    return True
                if run.attempts <= self.max_retries:
                    run.note = f"attempt {run.attempts} failed: {message}"
                    continue
                run.status, run.note = "failed", message
                self._store(self.store.set_run_status, run.run_id, "failed", error=_error_text(err))
                self.on_update(self.runs)
                return True
            with self._lock:
                for key, seconds in result.timings.items():
                    summary.timings[key] = summary.timings.get(key, 0.0) + seconds
                summary.busy_seconds += result.busy_seconds
            if result.stopped:
                run.status, run.note = "stopped", result.stop_reason
            elif result.steps < run.recipe.steps and not result.compute_reached:
                run.status, run.note = "paused", f"paused at {result.steps / run.recipe.steps:.0%} of its compute"
            else:
                run.status, run.note = "done", ""
            self._store(self.store.set_run_status, run.run_id, run.status, error=run.note or None)
            self.on_update(self.runs)
            return True

    def _store(self, method, *args, **kwargs):
        """Call a store method as the store's one writer, waiting out a database that went away (a PostgreSQL
        restart): its connection errors are retried for up to STORE_OUTAGE_SECONDS, with a note on the runs."""
        from sqlalchemy.exc import DBAPIError

        from rlscale.db.engine import StoreUnreachable

        deadline = time.monotonic() + STORE_OUTAGE_SECONDS
        delay = 0.5
        while True:
            try:
                with self._lock:
                    return method(*args, **kwargs)
            except (DBAPIError, StoreUnreachable) as err:
                gone = isinstance(err, StoreUnreachable) or err.connection_invalidated or _is_disconnect(err)
                if not gone or time.monotonic() > deadline:
                    raise
                self.store_note = f"store unreachable, retrying: {str(getattr(err, 'orig', None) or err).splitlines()[0][:60]}"
                self.on_update(self.runs)
                time.sleep(delay)
                delay = min(5.0, delay * 2)
            else:
                self.store_note = ""

    def _compute_stop(self, run: RunState) -> dict:
        """{gpu_hours: planned} when the study plans measured GPU-hours, so the run ends at its planned compute
        on any host (the step count follows from it); {} when it plans steps, rollouts or tokens."""
        compute = self.study.compute
        if compute is None or compute.unit != "gpu_hours" or not run.planned_gpu_hours > 0:
            return {}
        return {"gpu_hours": run.planned_gpu_hours}

    def _on_records(self, run: RunState, records: list[dict]) -> None:
        self._store(self.store.add_records, run.run_id, records)  # the one writer, for every job's thread
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
        """A reason to stop `run` now by the study's early_terminate rule when it runs to its end (not by rungs:
        hyperband, or a bayes trial), or None."""
        rule = self.study.early_terminate
        if rule.type == "none":
            return None
        if rule.type == "asymptote":
            from rlscale.runner.sweep.scheduler import RungSchedule

            return RungSchedule.from_rule(rule).stop_check(self._progress())(self._progress_of(run))
        records = self._store(self.store.records_frame, self.study.name).dropna(subset=["val_reward"])
        mine = records[records["run_id"] == run.run_id]
        with self._lock:  # one pruner for the runs of every thread
            if self._hyperband is None:
                from rlscale.runner.sweep.hyperband import HyperbandStopper

                self._hyperband = HyperbandStopper(run.recipe.steps, rule.min_fraction, rule.eta,
                                                   seed=self.study.seeds[0], study=self.study.name)
            return self._hyperband.check(run.run_id, list(zip(mine["step"], mine["val_reward"])))

    def _progress(self, runs: list[RunState] | None = None, waiting: dict | None = None) -> list:
        """Every run (or `runs`) as the rung scheduler sees it: compute spent (fraction of planned steps, and
        GPU-hours, the unit of its fit), its sigmoid fit so far, whether it finished, stopped or failed; runs in
        `waiting` (run_id -> target) read as busy."""
        from dataclasses import replace

        fits = self._current_fits()
        waiting = waiting or {}
        return [replace(progress, target=waiting[run.run_id]) if run.run_id in waiting else progress
                for run in (self.runs if runs is None else runs)
                for progress in [self._progress_of(run, fits.get(run.run_id))]]

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
        records = self._store(self.store.records_frame, self.study.name).dropna(subset=["val_reward"])
        if run_id is not None:
            records = records[records["run_id"] == run_id]
        fits = {}
        with self._fits_lock:
            for key, rows in records.groupby("run_id"):
                fits[key] = self._cached_fit(key, rows)
        return fits

    def _cached_fit(self, key, rows):
        """The fit of one run's evaluations `rows`, reused until the run has new ones."""
        from rlscale.fitting.early_stop import UPPER_LEVEL
        from rlscale.fitting.sigmoid import FitError, fit_sigmoid

        stamp = (len(rows), int(rows["step"].max()))
        cached = self._fit_cache.get(key)
        if cached is None or cached[0] != stamp:
            try:
                fit = fit_sigmoid(rows["gpu_hours"].to_numpy(), rows["val_reward"].to_numpy(), bootstrap=100,
                                  upper_level=UPPER_LEVEL)
            except FitError:
                fit = None
            self._fit_cache[key] = cached = (stamp, fit)
        return cached[1]

    # fits -----------------------------------------------------------------------------------------

    def _refit(self) -> None:
        """Fit every run's curve on its records so far and store the fits."""
        from rlscale.fitting.stored import fit_study

        if self._store(self.store.records_frame, self.study.name)["val_reward"].notna().any():
            self._store(fit_study, self.store, self.study.name)

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
            if name not in self._engines:
                self._engines[name] = get_engine(name, ray_address=self.ray_address,
                                                 **self.engine_options.get(name, {}))
            return self._engines[name]

    def close(self) -> None:
        """Release the engines' workers (and the local Ray cluster one started)."""
        for engine in [self.engine, *self._engines.values()]:
            if engine is not None:
                engine.close()


class JobPool:
    """The advances of one sweep in flight: a thread per job over the blocking Engine.run, admission on the
    cluster's free devices (runner/sweep/admission.py), stop requests, and the queue of ended jobs the scheduler
    waits on. Records reach the store through the driver, its one writer."""

    def __init__(self, driver: SweepDriver, runs: dict[int, RunState], summary: SweepSummary):
        from rlscale.base.errors import UserError
        from rlscale.runner.sweep.admission import Ledger

        self.driver, self.runs, self.summary = driver, runs, summary
        self.ended: queue.Queue = queue.Queue()
        self.threads: dict[int, threading.Thread] = {}
        self.stop_requests: dict[int, str] = {}
        self.requeued: dict[int, float] = {}  # run_id -> monotonic time it may be admitted again
        self.errors: list[BaseException] = []
        self.judge = lambda run: None  # a run's stop reason at a checkpoint, besides the schedule's check
        todo = [run for run in runs.values() if run.status not in FINISHED and run.recipe is not None]
        engines = [driver.engine_for(run.recipe) for run in todo]
        self.devices = {run.run_id: engine.devices(run.recipe) for run, engine in zip(todo, engines)}
        self.engine = engines[0] if engines else None
        nodes = self.engine.nodes() if self.engine is not None else None
        self.ledger = Ledger([node.total for node in nodes], _free(nodes)) if nodes else None
        self.polled = time.monotonic()
        for run in todo:
            if self.ledger is not None and not self.ledger.fits_at_all(self.devices[run.run_id]):
                raise UserError(f"run {run.name!r} needs {devices_text(self.devices[run.run_id])}; the cluster's "
                                f"nodes have {', '.join(devices_text([node]) for node in self.ledger.nodes)}",
                                field="generator_devices/trainer_devices")
        # the bound on runs in flight: --max-concurrent, else the study's, else the free devices alone (an engine
        # that cannot see its cluster runs one at a time)
        limit = driver.max_concurrent or getattr(driver.study, "max_concurrent", None)
        limit = limit or (len(todo) if self.ledger is not None else 1)
        self.slots = max(1, min(limit, len(todo) or 1))
        self._show()

    def admit(self, run_id: int) -> bool:
        """Reserve run_id's devices if its whole job fits on the free devices now."""
        if time.monotonic() < self.requeued.get(run_id, 0.0):
            return False
        if self.ledger is None:
            return True
        if time.monotonic() - self.polled > CLUSTER_POLL_SECONDS:
            nodes = self.engine.nodes()
            self.ledger.observe(_free(nodes) if nodes else None)
            self.polled = time.monotonic()
        admitted = self.ledger.admit(run_id, self.devices[run_id])
        if admitted:
            self.runs[run_id].devices = devices_text(self.devices[run_id])
        self._show()
        return admitted

    def start(self, run_id: int, until: float, check) -> None:
        """Advance run_id to `until` x its planned compute on a thread of its own."""
        run = self.runs[run_id]
        run.status, run.note = "starting", ""
        # to its end: the job's own stop (its planned compute, or recipe.steps) decides; a rung: that step
        until_step = None if until >= 1.0 - 1e-9 else max(run.step + 1, math.ceil(until * run.recipe.steps - 1e-9))
        driver = self.driver

        def should_stop() -> str | None:
            if run_id in self.stop_requests:
                return self.stop_requests[run_id]
            return check(driver._progress_of(run)) or self.judge(run)

        def advance() -> None:
            try:
                if driver._run_with_retries(run, self.summary, until_step, should_stop):
                    driver._refit()
                    if driver._hyperband is not None and run.status != "paused":
                        with driver._lock:
                            driver._hyperband.finish(run.run_id, run.val_reward if run.status == "done" else None)
                else:
                    self.requeued[run_id] = time.monotonic() + REQUEUE_SECONDS
            except BaseException as err:  # surfaces in the scheduler's thread (wait)
                self.errors.append(err)
            finally:
                self.ended.put(run_id)  # wait() releases its devices, in the scheduler's thread

        thread = threading.Thread(target=advance, name=f"run-{run.name}", daemon=True)
        self.threads[run_id] = thread
        thread.start()
        self._show()

    def wait(self) -> list[int]:
        """Run ids whose advance ended since the last call ([] after a second without one)."""
        ended = []
        try:
            ended.append(self.ended.get(timeout=1.0))
            while True:
                ended.append(self.ended.get_nowait())
        except queue.Empty:
            pass
        for run_id in ended:
            self.threads.pop(run_id, None)
            self.stop_requests.pop(run_id, None)
            if self.ledger is not None:
                self.ledger.release(run_id)
        if self.errors:
            raise self.errors[0]
        self._show()
        return ended

    def stop(self, run_id: int, reason: str) -> None:
        """Stop run_id: now if it is idle, at its next checkpoint if it is in flight."""
        run = self.runs[run_id]
        if run_id in self.threads:
            self.stop_requests[run_id] = reason
            run.note = f"stopping: {reason}"
        else:
            run.status, run.note = "stopped", reason
            self.driver._store(self.driver.store.set_run_status, run.run_id, "stopped", error=reason)
        self.driver.on_update(self.driver.runs)

    def waiting(self) -> dict[int, float]:
        """Runs sent back to the queue that may not be admitted yet (run_id -> 1.0: they read as busy)."""
        now = time.monotonic()
        return {run_id: 1.0 for run_id, until in self.requeued.items() if now < until}

    def interrupt(self) -> None:
        """The sweep is ending early (Ctrl-C, an error): ask every job in flight to stop at its next checkpoint;
        the engines' close() then releases what they hold."""
        self.driver.interrupted = True
        for run_id in list(self.threads):
            self.stop_requests[run_id] = "interrupted"

    def _show(self) -> None:
        """The cluster line of the live view: devices busy / total, runs in flight, runs queued."""
        queued = sum(run.status in ("pending", "paused", "queued") for run in self.runs.values())
        parts = []
        if self.ledger is not None:
            kinds = [key for key in ("GPU", "TPU", "CPU") if self.ledger.capacity(key) > 0]
            resource = next((key for key in kinds if any(key in b for bs in self.devices.values() for b in bs)),
                            kinds[0] if kinds else "GPU")
            parts.append(f"{resource} {self.ledger.busy(resource):g}/{self.ledger.capacity(resource):g} busy")
        parts.append(f"{len(self.threads)} in flight (max {self.slots})")
        parts.append(f"{queued} queued")
        self.driver.cluster_status = ", ".join(parts)
        self.driver.on_update(self.driver.runs)


def _free(nodes) -> list | None:
    """Each node's free devices as the cluster reported them, or None if it has not reported every node's."""
    free = [node.free for node in nodes]
    return None if any(entry is None for entry in free) else free


def devices_text(bundles) -> str:
    """[{"GPU": 8}, {"GPU": 8}] -> '2 x 8 GPU'."""
    texts = [" + ".join(f"{amount:g} {key}" for key, amount in bundle.items()) for bundle in bundles]
    return f"{len(texts)} x {texts[0]}" if len(texts) > 1 and len(set(texts)) == 1 else " and ".join(texts)


def _is_disconnect(err) -> bool:
    """Whether a database error means the server went away (restart, lost connection), not a bad statement."""
    text = str(getattr(err, "orig", err)).lower()
    return any(word in text for word in ("connection", "server closed", "terminating", "shutting down",
                                         "could not connect", "the database system is"))


def _error_text(err: Exception) -> str:
    text = "".join(traceback.format_exception_only(type(err), err)).strip()
    return text[-2000:]
