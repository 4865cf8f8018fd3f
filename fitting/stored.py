"""Fits of a stored study: its evaluated records in, per-run sigmoid fits out and saved beside them.
Takes any object with the Store's frame methods (fitting never imports the runner)."""

import pandas as pd

from rlscale.base.errors import UserError
from rlscale.fitting.frame import fit_runs, run_labels
from rlscale.fitting.records import fits_record_breaking, record_breaking_points


def study_records(store, study: str) -> pd.DataFrame:
    """The study's evaluated records as (run, run_id, compute = gpu_hours, reward = val_reward); one label per run."""
    records = store.records_frame(study)
    records = records[records["val_reward"].notna()]
    if records.empty:
        raise UserError(f"no records with a validation reward in study {study!r} ({store.url_for_display})", field="--study")
    runs = store.runs_frame(study).set_index("run_id")
    labels = run_labels(runs)  # runs of one study may share a name (seeds): each fit is its own run
    return records.assign(run=records["run_id"].map(labels)).rename(columns={"gpu_hours": "compute", "val_reward": "reward"})


def fit_study(store, study: str, **fit_kwargs) -> tuple[pd.DataFrame, pd.DataFrame, bool]:
    """(records, fits, record_breaking) of a stored study: each run fitted on the points its study's `fit.points`
    names (record_breaking True: its record-breaking points; else every evaluation). The fits replace the study's
    saved sigmoid fits."""
    from rlscale.planner.study import stored_study

    records = study_records(store, study)
    record_breaking = fits_record_breaking(stored_study(store, study))
    points = records
    if record_breaking:
        keep = [group.index[record_breaking_points(group["compute"], group["reward"])]
                for _, group in records.groupby("run", sort=False)]
        points = records.loc[[index for part in keep for index in part]]
    fits = fit_runs(points, run_col="run", compute_col="compute", reward_col="reward", **fit_kwargs)
    store.save_fits(study, fits.merge(records[["run", "run_id"]].drop_duplicates(), on="run"), model="sigmoid")
    return records, fits, record_breaking
