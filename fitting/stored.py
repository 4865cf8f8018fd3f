"""A stored study in, its fit of record (StudyFits) and the one Decision every view reads out. Takes any object with
the Store's frame methods (fitting never imports the runner)."""

import pandas as pd
from rlscale.fitting.curves import (
    StudyFits,
    compute_column,
    latest_runs,
    run_curves,
    run_geometry,
)
from rlscale.fitting.rules.reasons import Reason, Refusal
from rlscale.fitting.sigmoid.points import fits_record_breaking, reward_scale
from rlscale.fitting.sigmoid.runs import run_labels

from rlscale.base.errors import UserError


def study_fits(store, study: str, *, cache=None) -> StudyFits:
    """The fit of record of a stored study: each run on the points its study's `fit.points` names, in its compute
    unit and metric; Refusal (no_evaluations) before any run is evaluated. cache: fitting.curves.run_curves'."""
    from rlscale.planner.study_file import stored_study

    typed = stored_study(store, study)
    return fits_from_frames(study, typed, store.runs_frame(study), store.records_frame(study), cache=cache)


def fits_from_frames(study: str, typed, runs: pd.DataFrame, records: pd.DataFrame, *, cache=None) -> StudyFits:
    """study_fits from frames (pure): typed the Study (None: no spec), runs and records shaped as the Store's frames."""
    metric = typed.metric if typed is not None else "val_reward"
    runs = latest_runs(runs)
    records = records[records["run_id"].isin(runs["run_id"])]
    records = records[pd.to_numeric(records[metric], errors="coerce").notna()].copy()
    if records.empty:
        raise Refusal(Reason("no_evaluations", {"study": study}))
    labels = run_labels(runs)  # runs of one study may share a name (seeds): each fit is its own run
    records["run"] = records["run_id"].map(dict(zip(runs["run_id"], labels)))
    record_breaking = fits_record_breaking(typed)
    scale = reward_scale(records[metric])
    compute_col = compute_column(typed)
    curves, draws = run_curves(
        records,
        runs,
        compute_col=compute_col,
        reward_col=metric,
        record_breaking=record_breaking,
        scale=scale,
        cache=cache,
    )
    return StudyFits(study, typed, runs, records, curves, draws, compute_col, metric, record_breaking, scale)


def store_fits(store, study: str) -> StudyFits:
    """study_fits, saved as the study's sigmoid fits (what the bayes objective and `rlscale fit --study` read)."""
    fits = study_fits(store, study)
    store.save_fits(study, fits.curves, model="sigmoid")
    return fits


def study_decision(
    store,
    study: str,
    *,
    budget: float | None = None,
    profile: str | None = None,
    extend: float | None = None,
    cache=None,
):
    """The one Decision of a stored study at `budget` (its unit; default: its decision budget); None before any run is
    evaluated. extend: the study's extension factor (default: its spec's)."""
    from rlscale.fitting.rules.decision import decide

    try:
        fits = study_fits(store, study, cache=cache)
    except Refusal:
        return None
    if extend is None:
        extend = getattr(fits.spec, "extend", None) or 1.0
    return decide(fits, budget=budget, profile=profile, extend=extend)


def study_records(store, study: str) -> pd.DataFrame:
    """The study's evaluated records: run (a label per run), run_id, compute (its unit's), reward (its metric)."""
    try:
        fits = study_fits(store, study)
    except Refusal:
        raise UserError(
            f"no records with a validation reward in study {study!r} ({store.url_for_display})", field="--study"
        ) from None
    return fits.records.rename(columns={fits.compute_col: "compute", fits.metric: "reward"})


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


def model_parameters(study) -> dict[str, float]:
    """HF directory -> parameter count for a study with a `model` axis (its `models`); {} otherwise."""
    return {} if study is None else {name: size.parameters for name, size in study.models.items()}


def size_law_of(fits: StudyFits, *, bootstrap: int = 100, seed: int = 0):
    """The SizeLaw of a study with a `model` axis, on the runs and records of its fit of record (a rerun supersedes
    the attempt before it); Refusal when it has no such axis or its sizes cannot be fitted."""
    from rlscale.fitting.laws.model_size import fit_size_law, size_frame
    from rlscale.fitting.sigmoid import FitError

    parameters = model_parameters(fits.spec)
    if not parameters:
        raise Refusal(Reason("no_model_axis", {"study": fits.study}))
    frame = size_frame(fits.records, fits.runs, parameters, compute_col=fits.compute_col, reward_col=fits.metric)
    try:
        return fit_size_law(frame, bootstrap=bootstrap, seed=seed)
    except FitError as err:
        raise Refusal(Reason("size_law_not_fitted", {"error": str(err)})) from None


def recommend_size_study(store, study: str, budget: float, *, bootstrap: int = 100, seed: int = 0):
    """The model size for `budget` (fitting.laws.model_size.SizeChoice) from a stored study with a `model` axis."""
    from rlscale.fitting.laws.model_size import choose_size

    return choose_size(size_law_of(study_fits(store, study), bootstrap=bootstrap, seed=seed), budget)


def sweeps_models(store, study: str) -> bool:
    """Whether stored study `study` has a `model` axis (then recommend names a model size)."""
    from rlscale.planner.study_file import stored_study

    return bool(model_parameters(stored_study(store, study)))
