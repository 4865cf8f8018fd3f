"""A study's fit of record: each run's sigmoid on the points and in the unit its study names, as every view and the
scheduler read it (pure: frames in, one row per run out); and the study's compute unit and its records column."""

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import pandas as pd
from rlscale.db.importer import logged_unit
from rlscale.fitting.sigmoid import FitError, fit_sigmoid
from rlscale.fitting.sigmoid.points import (
    BIN_WIDTH,
    RewardScale,
    record_breaking_points,
)
from rlscale.fitting.sigmoid.runs import FIT_BOOTSTRAP, FIT_SEED, run_labels

MAX_TRUNCATION = 0.05  # ScaleRL: stable runs keep the truncation rate below 5%
CURVE_COLUMNS = [
    "run_id",
    "run",
    "prompts_per_batch",
    "rollouts",
    "status",
    "A",
    "B",
    "C_mid",
    "R0",
    "A_lo",
    "A_hi",
    "r2",
    "n_points",
    "identified",
    "reason",
    "rss",
    "noise",
    "c_min",
    "c_max",
    "truncation_rate",
]
# A study's compute unit is also the name of the records column that meters it (db.models: records).
COMPUTE_UNITS = ("gpu_hours", "rollouts", "tokens")
UNIT_LABELS = {"gpu_hours": "GPU-hours", "rollouts": "rollouts", "tokens": "tokens"}


def study_unit(study) -> str:
    """The compute unit (gpu_hours, rollouts, tokens) of a Study; gpu_hours when it does not say (or is None)."""
    return study.compute.unit if study is not None and study.compute is not None else "gpu_hours"


def compute_column(study) -> str:
    """The records column that holds a Study's compute (its unit's column); gpu_hours for None."""
    unit = study_unit(study)
    if unit not in COMPUTE_UNITS:
        raise ValueError(f"unknown compute unit {unit!r} (expected one of {', '.join(COMPUTE_UNITS)})")
    return unit


def unit_label(unit: str) -> str:
    """A compute unit as people write it: GPU-hours, rollouts, tokens."""
    return UNIT_LABELS.get(unit, unit)


def latest_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The latest run row per (name, seed): a run re-planned with a changed recipe supersedes its failed attempt."""
    if not {"run", "seed", "run_id"} <= set(runs.columns):
        return runs
    return runs.sort_values("run_id").drop_duplicates(["run", "seed"], keep="last").sort_index()


def run_geometry(runs: pd.DataFrame) -> pd.DataFrame:
    """runs with prompts_per_batch and rollouts columns, taken from each run's `config` when not given."""
    runs = runs.copy()
    for key in ("prompts_per_batch", "rollouts"):
        if key not in runs.columns:
            runs[key] = [(cfg or {}).get(key) for cfg in runs.get("config", [None] * len(runs))]
    return runs


def late_truncation_rate(records: pd.DataFrame) -> float:
    """Mean truncation rate over a run's last quarter of records (where a crashing run climbs); NaN if unrecorded."""
    if "truncation_rate" not in records.columns:
        return float("nan")
    rates = pd.to_numeric(records.sort_values("step")["truncation_rate"], errors="coerce").dropna().to_numpy()
    if rates.size == 0:
        return float("nan")
    return float(rates[-max(1, rates.size // 4) :].mean())


def run_curves(
    records: pd.DataFrame,
    runs: pd.DataFrame,
    *,
    compute_col: str = "gpu_hours",
    reward_col: str = "val_reward",
    record_breaking: bool = True,
    scale: RewardScale = RewardScale(),
    min_compute: float = 0.0,
    bootstrap: int = FIT_BOOTSTRAP,
    seed: int = FIT_SEED,
    cache=None,
) -> tuple[pd.DataFrame, dict]:
    """(curves: a CURVE_COLUMNS row per run, NaN parameters and the reason where unfitted; draws: {run: (m, 4) bootstrap
    (A, B, C_mid, R0)}). cache: fits by their points (`memo_fit`), for a viewer that refits as records arrive."""
    runs = run_geometry(runs)
    key = "run_id" if "run_id" in runs.columns and "run_id" in records.columns else "run"
    runs["label"] = run_labels(runs)
    rows, draws = [], {}
    # each run's records by one groupby (a mask per run costs runs x records), of the columns read here only
    used = [c for c in dict.fromkeys([key, compute_col, reward_col, "step", "truncation_rate"]) if c in records]
    by_run, none = dict(list(records[used].groupby(key, sort=False))), records[used].iloc[:0]
    for run in runs.to_dict("records"):
        mine = by_run.get(run[key], none)
        mine = mine[np.isfinite(pd.to_numeric(mine[reward_col], errors="coerce").astype(float))]
        compute = mine[compute_col].to_numpy(float)
        reward = mine[reward_col].to_numpy(float)
        label = run["label"]
        row = {
            "run_id": run.get("run_id"),
            "run": label,
            "prompts_per_batch": run["prompts_per_batch"],
            "rollouts": run["rollouts"],
            "status": run.get("status", "done"),
            "c_min": float(compute[compute > 0].min()) if (compute > 0).any() else np.nan,
            "c_max": float(compute.max()) if compute.size else np.nan,
            "truncation_rate": late_truncation_rate(mine),
        }
        keep = fitted_points(compute, reward, record_breaking, scale.bin_width)
        fit = memo_fit(
            compute[keep],
            reward[keep],
            cache,
            min_compute=min_compute,
            bounded=scale.bounded,
            max_ci_width=scale.max_ci_width,
            bootstrap=bootstrap,
            seed=seed,
        )
        if isinstance(fit, FitError):
            row.update(
                A=np.nan,
                B=np.nan,
                C_mid=np.nan,
                R0=np.nan,
                A_lo=np.nan,
                A_hi=np.nan,
                r2=np.nan,
                n_points=int(keep.size if fit.n_points is None else fit.n_points),
                identified=False,
                reason=f"not fitted: {fit}",
            )
        else:
            row.update(fit.to_dict())
            if fit.samples is not None and len(fit.samples):
                draws[label] = fit.samples
        rows.append(row)
    return pd.DataFrame(rows, columns=CURVE_COLUMNS), draws


def memo_fit(compute: np.ndarray, reward: np.ndarray, cache, **options):
    """fit_sigmoid(compute, reward, **options), or the FitError it raises, through `cache` (None, or a dict-like
    keyed by the points and the options): a fit, its seeded bootstrap included, is a pure function of them."""
    key = (compute.tobytes(), reward.tobytes(), tuple(sorted(options.items())))
    found = None if cache is None else cache.get(key)
    if found is None:
        try:
            found = fit_sigmoid(compute, reward, **options)
        except FitError as err:
            found = err
        if cache is not None:
            cache[key] = found
    return found


class FitMemo:
    """memo_fit's thread-safe LRU cache of fits by their points (the dashboard's and the sweep driver's)."""

    def __init__(self, size: int = 64):
        self.size = size
        self._fits: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key, default=None):
        with self._lock:
            found = self._fits.get(key)
            if found is not None:
                self._fits.move_to_end(key)
            return default if found is None else found

    def __setitem__(self, key, value) -> None:
        with self._lock:
            self._fits[key] = value
            self._fits.move_to_end(key)
            while len(self._fits) > self.size:
                self._fits.popitem(last=False)

    def __len__(self) -> int:
        return len(self._fits)


def fitted_points(compute: np.ndarray, reward: np.ndarray, record_breaking: bool, bin_width: float = BIN_WIDTH):
    """Indices of the points a run's fit of record uses: its record-breaking points, or every evaluation."""
    return record_breaking_points(compute, reward, bin_width) if record_breaking else np.arange(len(compute))


def fit_of_record(
    compute,
    reward,
    *,
    record_breaking: bool,
    scale: RewardScale = RewardScale(),
    min_compute: float = 0.0,
    upper_level=None,
    cache=None,
):
    """One run's fit of record (a SigmoidFit; None when it cannot be fitted) on `fitted_points`, with the fit of
    record's bootstrap and seed; upper_level: also the profile bound on A (early termination's); cache: memo_fit's."""
    compute, reward = np.asarray(compute, dtype=float), np.asarray(reward, dtype=float)
    keep = fitted_points(compute, reward, record_breaking, scale.bin_width)
    fit = memo_fit(
        compute[keep],
        reward[keep],
        cache,
        min_compute=min_compute,
        bounded=scale.bounded,
        max_ci_width=scale.max_ci_width,
        bootstrap=FIT_BOOTSTRAP,
        seed=FIT_SEED,
        upper_level=upper_level,
    )
    return None if isinstance(fit, FitError) else fit


@dataclass(frozen=True)
class StudyFits:
    """A study's fit of record: spec (the Study; None when imported without one), the store's runs and records (those
    with the metric), and run_curves' curves and draws on `compute_col` and `metric`."""

    study: str
    spec: object
    runs: pd.DataFrame
    records: pd.DataFrame
    curves: pd.DataFrame
    draws: dict
    compute_col: str
    metric: str
    record_breaking: bool
    scale: RewardScale = RewardScale()  # how its rewards are read: bounds, tolerances, bins

    @property
    def bin_width(self) -> float:
        return self.scale.bin_width

    @property
    def bounded(self) -> bool:
        return self.scale.bounded

    @property
    def noise_band(self) -> float:
        return self.scale.noise_band

    @property
    def unit(self) -> str:
        """The compute unit: the study's, else the one its imported logs name (a tracker's tag, steps), else
        gpu_hours."""
        if self.spec is None and "config" in self.runs:
            unit = logged_unit(self.runs["config"])
            if unit is not None:
                return unit
        return study_unit(self.spec)


def fitted(curves: pd.DataFrame) -> pd.DataFrame:
    """Runs with finite curve parameters (identified or not) and known geometry."""
    ok = curves[["A", "B", "C_mid", "R0"]].notna().all(axis=1)
    ok &= curves["prompts_per_batch"].notna() & curves["rollouts"].notna()
    return curves[ok]


def stable(curves: pd.DataFrame, max_truncation: float = MAX_TRUNCATION) -> pd.Series:
    """Runs that finished without failing and kept truncation below the limit (when it was recorded)."""
    truncation = curves["truncation_rate"].astype(float)
    return (curves["status"].fillna("done") != "failed") & ~(truncation >= max_truncation)


def reach_of_finished(curves: pd.DataFrame) -> float:
    """The compute every run with a fitted curve, not stopped early or failed, reached (0 when none), below which each
    curve reads its own data; unidentified runs that ended earlier are not waited for when one is identified."""
    usable = curves[curves[["A", "B", "C_mid", "R0"]].notna().all(axis=1)]
    usable = usable[~usable["status"].fillna("done").isin(["stopped", "failed"])]
    if not len(usable) or "c_max" not in usable:
        return 0.0
    identified = usable[usable["identified"].astype(bool)]
    return float((identified if len(identified) else usable)["c_max"].astype(float).min())
