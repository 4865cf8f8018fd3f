"""`method: bayes`: Optuna (TPE) proposes each next configuration; objective = the run's fitted asymptote.
Trials live in Optuna's RDB storage on the store's database: an interrupted trial resumes, Optuna gets its value."""

import math
import time

from rlscale.runner.sweep.driver import SweepSummary


def run_bayes(driver) -> SweepSummary:
    """Run `study.n_trials` Optuna trials through the sweep driver (resumable); returns the summary."""
    import optuna

    study, store = driver.study, driver.store
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    search = optuna.create_study(
        study_name=f"rlscale:{study.name}",
        storage=optuna.storages.RDBStorage(store.url.render_as_string(hide_password=False)),
        direction="maximize",
        sampler=optuna.samplers.TPESampler(seed=study.seeds[0]),
        load_if_exists=True,
    )
    started = time.perf_counter()
    summary = SweepSummary(driver.runs)
    base = study.recipe.to_json()
    # trials open at once: --max-concurrent or the study's (TPE then proposes each batch from the trials told)
    batch = driver.max_concurrent or study.max_concurrent or 1
    try:
        interrupted = search.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        if interrupted:
            _run_trials(driver, search, [(t.number, t.params) for t in interrupted], base, summary)
        while (open_now := min(batch, study.n_trials - _finished(search))) > 0:
            trials = [search.ask() for _ in range(open_now)]
            _run_trials(
                driver,
                search,
                [
                    (trial.number, {key: _suggest(trial, key, axis) for key, axis in study.parameters.items()})
                    for trial in trials
                ],
                base,
                summary,
            )
    finally:
        driver.close()
    summary.wall_seconds = time.perf_counter() - started
    return summary


def _run_trials(driver, search, trials: list[tuple[int, dict]], base: dict, summary: SweepSummary) -> None:
    import optuna
    from rlscale.planner.planning import trial_recipe

    runs = []
    for number, params in trials:
        recipe, planned_gpu_hours = trial_recipe(driver.study, {**base, **params})
        runs.append(driver.add_run(f"trial-{number}", recipe, driver.study.seeds[0], planned_gpu_hours))
    todo = [run for run in runs if run.status not in ("done", "failed", "stopped")]
    if todo:
        driver.run_schedule(driver.schedule(todo, by_rungs=False), todo, summary)
    for (number, _params), run in zip(trials, runs):
        value = _objective(driver, run.run_id)
        if value is None:
            search.tell(number, state=optuna.trial.TrialState.FAIL)
        else:
            search.tell(number, value)


def _objective(driver, run_id: int) -> float | None:
    fits = driver.store.fits_frame(driver.study.name)
    mine = fits[fits["run_id"] == run_id]
    if len(mine) and bool(mine["identified"].iloc[0]) and math.isfinite(float(mine["A"].iloc[0])):
        return float(mine["A"].iloc[0])
    records, metric = driver.store.records_frame(driver.study.name), driver.study.metric
    if metric not in records.columns:
        return None
    evals = records[records["run_id"] == run_id][metric].dropna()
    return float(evals.iloc[-1]) if len(evals) else None


def _suggest(trial, key: str, axis):
    if not axis.is_range:
        return trial.suggest_categorical(key, axis.values)
    if axis.sampling == "int_uniform":
        return trial.suggest_int(key, int(axis.min), int(axis.max))
    return trial.suggest_float(key, axis.min, axis.max, log=axis.sampling == "log_uniform")


def _finished(search) -> int:
    import optuna

    done = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL, optuna.trial.TrialState.PRUNED)
    return len(search.get_trials(deepcopy=False, states=done))
