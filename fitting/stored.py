"""Fits of a stored study: its evaluated records in, per-run sigmoid fits out and saved beside them.
Takes any object with the Store's frame methods (fitting never imports the runner)."""

import pandas as pd

from rlscale.fitting.frame import fit_runs
from rlscale.base.errors import UserError


def study_records(store, study: str) -> pd.DataFrame:
    """The study's evaluated records as (run, run_id, compute = gpu_hours, reward = val_reward); one label per run."""
    records = store.records_frame(study)
    records = records[records["val_reward"].notna()]
    if records.empty:
        raise UserError(f"no records with a validation reward in study {study!r} ({store.url_for_display})", field="--study")
    runs = store.runs_frame(study).set_index("run_id")
    # runs of one study may share a name (seeds): those get the seed in their label so each fit is its own run
    names = runs["run"]
    shared = names.duplicated(keep=False)
    labels = names.where(~shared, names + " (seed " + runs["seed"].astype(str) + ")")
    return records.assign(run=records["run_id"].map(labels)).rename(columns={"gpu_hours": "compute", "val_reward": "reward"})


def fit_study(store, study: str, **fit_kwargs) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(records, fits) of a stored study; the fits replace the study's saved sigmoid fits."""
    records = study_records(store, study)
    fits = fit_runs(records, run_col="run", compute_col="compute", reward_col="reward", **fit_kwargs)
    store.save_fits(study, fits.merge(records[["run", "run_id"]].drop_duplicates(), on="run"), model="sigmoid")
    return records, fits
