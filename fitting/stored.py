"""Fits of a stored study: its evaluated records in, per-run sigmoid fits out and saved beside them.
Takes any object with the Store's frame methods (fitting never imports the runner)."""

import pandas as pd

from rlscale.base.errors import UserError
from rlscale.fitting.frame import fit_runs, run_labels


def study_records(store, study: str) -> pd.DataFrame:
    """The study's evaluated records as (run, run_id, compute = gpu_hours, reward = val_reward); one label per run."""
    records = store.records_frame(study)
    records = records[records["val_reward"].notna()]
    if records.empty:
        raise UserError(f"no records with a validation reward in study {study!r} ({store.url_for_display})", field="--study")
    runs = store.runs_frame(study).set_index("run_id")
    labels = run_labels(runs)  # runs of one study may share a name (seeds): each fit is its own run
    return records.assign(run=records["run_id"].map(labels)).rename(columns={"gpu_hours": "compute", "val_reward": "reward"})


def fit_study(store, study: str, **fit_kwargs) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(records, fits) of a stored study; the fits replace the study's saved sigmoid fits."""
    records = study_records(store, study)
    fits = fit_runs(records, run_col="run", compute_col="compute", reward_col="reward", **fit_kwargs)
    store.save_fits(study, fits.merge(records[["run", "run_id"]].drop_duplicates(), on="run"), model="sigmoid")
    return records, fits
