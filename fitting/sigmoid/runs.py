"""Notebook API: a DataFrame of (run, compute, reward) records in, a DataFrame of per-run sigmoid fits out."""

import numpy as np
import pandas as pd
from rlscale.fitting.sigmoid import FitError, fit_sigmoid
from rlscale.fitting.sigmoid.points import scaled_fit_options

FIT_COLUMNS = ["A", "B", "C_mid", "R0", "rss", "r2", "A_lo", "A_hi", "n_points", "identified", "reason", "noise"]
SINGLE_RUN = "all"  # run name used when the records have no run column
# One bootstrap size and seed for every fit of record, so each view of a run, stored or from its log, reads the same
# intervals and verdicts.
FIT_BOOTSTRAP = 100
FIT_SEED = 0


def fit_runs(
    records: pd.DataFrame, *, run_col="run", compute_col="compute", reward_col="reward", **fit_kwargs
) -> pd.DataFrame:
    """One row per run (first-appearance order): run and FIT_COLUMNS; unfittable runs: NaN and the FitError as reason.
    A missing `compute` column falls back to `gpu_hours`; a missing run column means one run, "all". The bootstrap and
    its seed default to the fit of record's."""
    if compute_col not in records.columns and compute_col == "compute" and "gpu_hours" in records.columns:
        compute_col = "gpu_hours"
    for col in (compute_col, reward_col):
        if col not in records.columns:
            raise KeyError(f"records have no column {col!r} (columns: {', '.join(map(str, records.columns))})")
    fit_kwargs = {"bootstrap": FIT_BOOTSTRAP, "seed": FIT_SEED, **scaled_fit_options(records[reward_col], fit_kwargs)}
    if run_col in records.columns:
        groups = records.groupby(run_col, sort=False, dropna=False)
    else:
        groups = [(SINGLE_RUN, records)]
    rows = []
    for run, group in groups:
        try:
            row = fit_sigmoid(
                group[compute_col].to_numpy(dtype=float, na_value=np.nan),
                group[reward_col].to_numpy(dtype=float, na_value=np.nan),
                **fit_kwargs,
            ).to_dict()
        except FitError as err:
            row = {name: np.nan for name in FIT_COLUMNS}
            points = len(group) if err.n_points is None else err.n_points  # those the fit would have used
            row.update(n_points=int(points), identified=False, reason=str(err), noise=None)
        rows.append({"run": run, **row})
    return pd.DataFrame(rows, columns=["run", *FIT_COLUMNS])


def run_labels(runs: pd.DataFrame) -> pd.Series:
    """A label per run of `runs` (columns `run`, maybe `seed`): its name, + " (seed n)" where several runs share it."""
    names = runs["run"].astype(str)
    if "seed" not in runs.columns:
        return names
    shared = names.duplicated(keep=False)
    return names.where(~shared, names + " (seed " + runs["seed"].astype(str) + ")")


def variant_names(runs: pd.DataFrame) -> pd.Series:
    """Each run's study point: its name without the `/s<seed>` a sweep adds (runner.sweep.state.run_name)."""
    names = runs["run"].astype(str)
    if "seed" not in runs.columns:
        return names
    suffixes = "/s" + runs["seed"].astype(str)
    return pd.Series([name.removesuffix(end) for name, end in zip(names, suffixes)], index=runs.index)
