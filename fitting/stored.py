"""A stored study in, fits and decisions out: its evaluated records fitted per run (and saved beside them), its
decision, its recommendation and its model size. Takes any object with the Store's frame methods (fitting never
imports the runner); the work itself is in the pure modules (fitting.curves, rules.recommend, rules.decision)."""

import pandas as pd
from rlscale.fitting.curves import compute_column, run_curves, run_geometry
from rlscale.fitting.rules.reasons import Reason, Refusal
from rlscale.fitting.sigmoid.points import fits_record_breaking, record_breaking_points
from rlscale.fitting.sigmoid.runs import fit_runs, run_labels

from rlscale.base.errors import UserError


def study_records(store, study: str) -> pd.DataFrame:
    """The study's evaluated records as (run, run_id, compute = gpu_hours, reward = val_reward); one label per run."""
    records = store.records_frame(study)
    records = records[records["val_reward"].notna()]
    if records.empty:
        raise UserError(
            f"no records with a validation reward in study {study!r} ({store.url_for_display})", field="--study"
        )
    runs = store.runs_frame(study).set_index("run_id")
    labels = run_labels(runs)  # runs of one study may share a name (seeds): each fit is its own run
    return records.assign(run=records["run_id"].map(labels)).rename(
        columns={"gpu_hours": "compute", "val_reward": "reward"}
    )


def fit_study(store, study: str, **fit_kwargs) -> tuple[pd.DataFrame, pd.DataFrame, bool]:
    """(records, fits, record_breaking) of a stored study: each run fitted on the points its study's `fit.points`
    names (record_breaking True: its record-breaking points; else every evaluation). The fits replace the study's
    saved sigmoid fits."""
    from rlscale.planner.study import stored_study

    records = study_records(store, study)
    record_breaking = fits_record_breaking(stored_study(store, study))
    points = records
    if record_breaking:
        keep = [
            group.index[record_breaking_points(group["compute"], group["reward"])]
            for _, group in records.groupby("run", sort=False)
        ]
        points = records.loc[[index for part in keep for index in part]]
    fits = fit_runs(points, run_col="run", compute_col="compute", reward_col="reward", **fit_kwargs)
    store.save_fits(study, fits.merge(records[["run", "run_id"]].drop_duplicates(), on="run"), model="sigmoid")
    return records, fits, record_breaking


# --- a stored study's decision: the store's frames in, fitting.rules.decision on them --------------------------------


def pick_study(store, study: str | None) -> str:
    """`study`, or the only stored study whose runs try more than one rollouts value."""
    if study is not None:
        store.study_spec(study)  # UserError naming the known studies if it does not exist
        return study
    candidates = [
        name for name in store.study_names() if run_geometry(store.runs_frame(name))["rollouts"].nunique() >= 2
    ]
    if len(candidates) != 1:
        known = ", ".join(candidates) or "none"
        raise UserError(f"pick the study with --study (studies that vary rollouts: {known})", field="--study")
    return candidates[0]


def study_curves(store, study: str, *, bootstrap: int = 100, seed: int = 0):
    """(the stored Study or None, runs, records, curves, draws) of a stored study, fitted as its sweep fits them;
    Refusal (no_evaluations) before any run is evaluated."""
    from rlscale.planner.study import stored_study

    typed = stored_study(store, study)
    runs = store.runs_frame(study)
    records = store.records_frame(study)
    if records["val_reward"].notna().sum() == 0:
        raise Refusal(Reason("no_evaluations", {"study": study}))
    curves, draws = run_curves(
        records,
        runs,
        compute_col=compute_column(typed),
        record_breaking=fits_record_breaking(typed),
        bootstrap=bootstrap,
        seed=seed,
    )
    return typed, runs, records, curves, draws


def recommend_study(
    store, study: str, budget: float, *, profile: str | None = None, bootstrap: int = 100, seed: int = 0
) -> tuple:
    """(Recommendation, the stored Study or None) for a stored study at `budget` (its unit); Refusal when the
    evidence is not enough."""
    from rlscale.fitting.rules.decision import recommend_from_frames

    typed, runs, records, curves, draws = study_curves(store, study, bootstrap=bootstrap, seed=seed)
    return recommend_from_frames(
        typed, study, runs, records, curves, draws, budget, profile=profile, bootstrap=bootstrap, seed=seed
    ), typed


def study_decision(
    store, study: str, *, budget: float | None = None, extend: float = 1.0, bootstrap: int = 100, seed: int = 0
):
    """The Decision (rules.decision) of a stored study at `budget` (default: its decision budget); None before any
    run is evaluated."""
    from rlscale.fitting.rules.decision import decide

    try:
        typed, runs, records, curves, draws = study_curves(store, study, bootstrap=bootstrap, seed=seed)
    except Refusal:
        return None
    return decide(
        typed, study, runs, records, curves, draws, budget=budget, bootstrap=bootstrap, seed=seed, extend=extend
    )


def model_parameters(study) -> dict[str, float]:
    """HF directory -> parameter count for a study with a `model` axis (its `models`); {} otherwise."""
    return {} if study is None else {name: size.parameters for name, size in study.models.items()}


def study_size_law(store, study: str, *, bootstrap: int = 100, seed: int = 0):
    """(the stored Study, SizeLaw) of a study with a `model` axis; Refusal when its sizes cannot be fitted."""
    from rlscale.fitting.laws.model_size import fit_size_law, size_frame
    from rlscale.fitting.sigmoid import FitError
    from rlscale.planner.study import stored_study

    typed = stored_study(store, study)
    parameters = model_parameters(typed)
    if not parameters:
        raise Refusal(Reason("no_model_axis", {"study": study}))
    frame = size_frame(
        store.records_frame(study),
        store.runs_frame(study),
        parameters,
        compute_col=compute_column(typed),
        reward_col=typed.metric,
    )
    try:
        return typed, fit_size_law(frame, bootstrap=bootstrap, seed=seed)
    except FitError as err:
        raise Refusal(Reason("size_law_not_fitted", {"error": str(err)})) from None


def recommend_size_study(store, study: str, budget: float, *, bootstrap: int = 100, seed: int = 0):
    """The model size for `budget` (fitting.laws.model_size.SizeChoice) from a stored study with a `model` axis."""
    from rlscale.fitting.laws.model_size import choose_size

    _typed, law = study_size_law(store, study, bootstrap=bootstrap, seed=seed)
    return choose_size(law, budget)


def sweeps_models(store, study: str) -> bool:
    """Whether stored study `study` has a `model` axis (then recommend names a model size)."""
    from rlscale.planner.study import stored_study

    return bool(model_parameters(stored_study(store, study)))
