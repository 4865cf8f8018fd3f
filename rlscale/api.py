"""The notebook API: `rlscale fit`, `fit --at`, the decision and `fit --plot` as functions that take and return
pandas (and the one Decision). `import rlscale` loads none of this until one of its names is used (docs/api.md).

Each function takes either a frame of evaluations (columns run (optional), compute or gpu_hours, reward) or the name
of a stored study (its store: `db`, else RLSCALE_DB or ./rlscale.db, opened read-only). A stored study is read as
every command reads it: its fit of record and its Decision (fitting.stored)."""

import math
from pathlib import Path

import pandas as pd

FIT_OPTIONS = {"r0": None, "min_compute": 0.0, "noise": "auto", "bounded": True}  # `rlscale fit`'s defaults
FRAME_STUDY = "notebook"  # the study name a frame's decision goes by (its commands name it)


def fit(data, *, db: str | None = None, **options) -> pd.DataFrame:
    """One row per run: run, A, B, C_mid, R0, rss, r2, A_lo, A_hi (A's 95% interval), n_points, identified, reason
    (why A is not identified, or why the run could not be fitted), noise; `rlscale fit`'s fits.

    data: a frame of evaluations, fitted with `options` (r0, min_compute, noise, bounded as `rlscale fit`'s --r0,
    --min-compute, --noise, --unbounded), or a stored study's name: its fit of record (the one the decision reads,
    with run_id, prompts_per_batch, rollouts, status, c_min, c_max and truncation_rate besides)."""
    if isinstance(data, str):
        _no_options(data, options)
        with _store(db) as store:
            return _study_fits(store, data).curves.copy()
    from rlscale.fitting.sigmoid.runs import fit_runs

    records = _records(data)
    return fit_runs(records, run_col="run", compute_col="compute", reward_col="reward", **_options(options))


def predict(data, at: float, *, level: float = 0.9, db: str | None = None, **options) -> pd.DataFrame:
    """One row per run: run, at, predicted (the mean reward over the evaluations in the last 10% of compute up to
    `at`), predicted_lo, predicted_hi (its prediction interval at `level`), level; `rlscale fit --at`'s. NaN for a
    run that cannot be fitted. data and options: as `fit` (a stored study: its evaluations, as `fit --study --at`)."""
    from rlscale.fitting.laws.predict import predict_runs

    if not (isinstance(at, int | float) and math.isfinite(at) and at > 0):
        raise ValueError(f"at: expected a finite compute > 0, got {at!r}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level: expected a level in (0, 1), got {level!r}")
    if isinstance(data, str):
        _no_options(data, options)
        from rlscale.fitting.stored import study_records

        with _store(db) as store:
            records = study_records(store, data)
    else:
        records = _records(data)
    return predict_runs(
        records, float(at), level=level, run_col="run", compute_col="compute", reward_col="reward", **_options(options)
    )


def decide(
    data, *, budget: float | None = None, db: str | None = None, profile: str | None = None, study: str = FRAME_STUDY
):
    """The Decision (fitting.rules.decision) the CLI prints, the same object: what to run at `budget` (compute in the
    study's unit; default: the study's decision budget), or why not yet, the runs within the noise band there and
    what to run next. `decision_text` words it as the terminal does.

    data: a stored study's name (fitting.stored.study_decision; None before any run is evaluated), or a frame of
    evaluations of several runs, compute in GPU-hours, with prompts_per_batch and rollouts per run (then the decision
    is an allocation over n; without them, the best run), and optionally step (default: the row order within a run,
    as `rlscale import` reads a log), status (default done) and recipe keys (lr, loss, ...). study: the name a
    frame's decision goes by in its commands (import the frame as that study to run them)."""
    if budget is not None and not (isinstance(budget, int | float) and math.isfinite(budget) and budget > 0):
        raise ValueError(f"budget: expected a finite compute > 0, got {budget!r}")
    if isinstance(data, str):
        from rlscale.fitting.stored import study_decision

        with _store(db) as store:
            return study_decision(store, data, budget=budget, profile=profile)
    from rlscale.fitting.rules.decision import decide as decide_study
    from rlscale.fitting.stored import fits_from_frames

    runs, records = frame_study(data)
    fits = fits_from_frames(study, None, runs, records)
    return decide_study(fits, budget=budget, profile=profile, from_frame=True)


def decision_text(decision, *, db: str | None = None) -> str:
    """A Decision as the terminal prints it (rlscale.views.wording), its commands with `--db db` where given."""
    from rlscale.views.wording import decision_commands, decision_lines

    if decision is None:
        return "not yet: no run has been evaluated"
    return "\n".join(decision_lines(decision, decision_commands(decision, db=db)))


def plot(data, path, *, db: str | None = None, title: str | None = None, **options) -> Path:
    """Path of the PNG written to `path`: each run's points (filled: those its fit used), fitted sigmoid (dashed past
    its data) and 95% band on A; `rlscale fit --plot`'s figure (rlscale.views.plots.plot_study). data and options: as
    `fit`."""
    from rlscale.views.plots import plot_study

    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ValueError(f"path: expected a file name ending in .png, got {path.name!r}")
    if isinstance(data, str):
        _no_options(data, options)
        from rlscale.fitting.stored import study_records

        with _store(db) as store:
            records = study_records(store, data)
            of_record = _study_fits(store, data)
        fits, record_breaking, title = of_record.curves, of_record.record_breaking, title or data
    else:
        records = _records(data)
        fits, record_breaking = fit(records, **options), False
    return plot_study(
        records,
        fits,
        path,
        run_col="run",
        compute_col="compute",
        reward_col="reward",
        title=title,
        record_breaking=record_breaking,
    )


def frame_study(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, records) in the store's shape (db.store's runs_frame and records_frame) from a frame of evaluations: a
    run per name in order of first appearance (run_id 1, 2, ...), its config the recipe keys the frame gives it
    (prompts_per_batch, rollouts, lr, ...); records with step, gpu_hours = compute and val_reward = reward."""
    from rlscale.planner.recipe import Recipe

    records = _records(frame)
    names = list(dict.fromkeys(records["run"]))
    run_ids = {name: i + 1 for i, name in enumerate(names)}
    keys = [key for key in records.columns if key in Recipe.model_fields]
    rows = []
    for name, group in records.groupby("run", sort=False):
        config = {}
        for key in keys:
            values = group[key].dropna().unique()
            if len(values) > 1:
                hint = " (rollouts is n, per prompt: a log's cumulative count goes by another name)"
                raise ValueError(
                    f"column {key!r}: expected one value per run, run {name!r} has "
                    f"{', '.join(map(str, values[:3]))}{'...' if len(values) > 3 else ''}"
                    + (hint if key == "rollouts" else "")
                )
            if len(values):
                config[key] = values[0].item() if hasattr(values[0], "item") else values[0]
        status = str(group["status"].iloc[-1]) if "status" in group.columns else "done"
        rows.append({"run_id": run_ids[name], "run": name, "seed": 0, "status": status, "config": config})
    runs = pd.DataFrame(rows, columns=["run_id", "run", "seed", "status", "config"])
    stored = pd.DataFrame(
        {
            "run_id": records["run"].map(run_ids),
            "run": records["run"],
            "step": records["step"] if "step" in records.columns else records.groupby("run", sort=False).cumcount(),
            "gpu_hours": records["compute"],
            "val_reward": records["reward"],
        }
    )
    for column in ("tokens", "truncation_rate"):  # the tokens unit's cost model and the stability rule read them
        if column in records.columns:
            stored[column] = records[column]
    return runs, stored


def _records(frame) -> pd.DataFrame:
    """`frame` with columns run (str; "all" when it has none), compute (from gpu_hours where it has no compute) and
    reward, as floats; ValueError naming a missing column."""
    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"expected a pandas DataFrame of evaluations or a study name, got {type(frame).__name__}")
    records = frame.copy()
    if "compute" not in records.columns and "gpu_hours" in records.columns:
        records = records.rename(columns={"gpu_hours": "compute"})
    for column in ("compute", "reward"):
        if column not in records.columns:
            raise ValueError(
                f"the frame has no column {column!r}: expected run (optional), compute or gpu_hours, reward "
                f"(columns: {', '.join(map(str, records.columns))})"
            )
        records[column] = pd.to_numeric(records[column], errors="coerce").astype(float)
    records["run"] = records["run"].astype(str) if "run" in records.columns else "all"
    return records


def _options(options: dict) -> dict:
    unknown = set(options) - set(FIT_OPTIONS)
    if unknown:
        raise TypeError(f"unknown option(s) {', '.join(sorted(unknown))}: expected {', '.join(FIT_OPTIONS)}")
    return {**FIT_OPTIONS, **options}


def _no_options(study: str, options: dict) -> None:
    if options:
        raise TypeError(
            f"{', '.join(sorted(options))}: a stored study ({study!r}) is fitted as its study file says (its fit of "
            "record); fit a frame of its evaluations to try other options"
        )


def _store(db: str | None):
    from rlscale.db.store import Store

    return Store(db, read_only=True)


def _study_fits(store, study: str):
    """The stored study's fit of record (fitting.stored.study_fits); ValueError before any run is evaluated."""
    from rlscale.fitting.rules.reasons import Refusal
    from rlscale.fitting.stored import study_fits

    try:
        return study_fits(store, study)
    except Refusal:
        raise ValueError(f"study {study!r} has no evaluated records yet ({store.url_for_display})") from None
