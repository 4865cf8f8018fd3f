"""One measure and one rule for every view: a run's reward at a compute is its fitted sigmoid there, and two rewards
separate when the gap reaches the noise band (and twice the seeds' pooled sd), so all views name the same best run."""

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from rlscale.fitting.curves import MAX_TRUNCATION, fitted, stable
from rlscale.fitting.sigmoid.curve import sigmoid

from rlscale.base.numbers import NOISE_BAND

MEASURE = "fitted reward"  # what Standing.reward is, for labels: the run's fitted sigmoid at the compute


def fitted_rewards(curves: pd.DataFrame, compute) -> np.ndarray:
    """Each run's fitted reward (its sigmoid with A, B, C_mid, R0 from `curves`) at `compute`: shape (runs,) for a
    number, (runs, len(compute)) for an array; NaN for a run without a fit."""
    params = curves[["A", "B", "C_mid", "R0"]].to_numpy(float)
    grid = np.asarray(compute, dtype=float)
    if grid.ndim == 0:
        return sigmoid(grid, *params.T)
    return np.stack([sigmoid(grid, *row) for row in params]) if len(params) else np.empty((0, grid.size))


def pooled_sd(sds) -> float:
    """The root mean square of the finite sds (seed-to-seed spreads); NaN when none is finite."""
    finite = [float(s) for s in sds if s is not None and math.isfinite(s)]
    return math.sqrt(sum(s * s for s in finite) / len(finite)) if finite else float("nan")


def beyond_noise(gap: float, spread: float = float("nan"), noise_band: float = NOISE_BAND) -> bool:
    """Whether a reward gap separates runs (or variants): |gap| >= noise_band and, if finite, 2 x pooled sd `spread`."""
    floor = max(noise_band, 2.0 * spread) if math.isfinite(spread) else noise_band
    return bool(math.isfinite(gap) and abs(gap) >= floor)


def read_runs(curves: pd.DataFrame, max_truncation: float = MAX_TRUNCATION) -> pd.DataFrame:
    """The runs every view reads at a compute: with a fitted curve, trained stably and not stopped early (the
    scheduler judged those already, and their data end before the others')."""
    usable = curves[curves[["A", "B", "C_mid", "R0"]].notna().all(axis=1)]
    return usable[(usable["status"].fillna("done") != "stopped") & stable(usable, max_truncation)]


def decision_runs(curves: pd.DataFrame, max_truncation: float = MAX_TRUNCATION) -> pd.DataFrame:
    """The runs a decision over (B_p, n) reads: read_runs with a known geometry."""
    return read_runs(fitted(curves), max_truncation)


@dataclass(frozen=True)
class Standing:
    """The runs at one compute (the study's unit), best first, as {run, prompts_per_batch, rollouts, reward, gap (best's
    reward minus this one's), within_band}."""

    compute: float
    runs: tuple
    noise_band: float = NOISE_BAND
    measure: str = MEASURE
    ended_before: tuple = ()  # {run, c_max} of fitted runs whose data end before the compute: not read there

    @property
    def best(self) -> dict:
        return self.runs[0]

    @property
    def best_rollouts(self) -> int | None:
        """n of the best run (None for a run of unknown geometry)."""
        return self.best["rollouts"]

    @property
    def within_band(self) -> list[str]:
        """Names of the runs within the noise band of the best (the best included), best first."""
        return [row["run"] for row in self.runs if row["within_band"]]

    def reward(self, run: str) -> float:
        return next(row["reward"] for row in self.runs if row["run"] == run)

    def to_dict(self) -> dict:
        return {
            "compute": self.compute,
            "measure": self.measure,
            "noise_band": self.noise_band,
            "best": self.best["run"],
            "best_rollouts": self.best_rollouts,
            "within_band": self.within_band,
            "runs": [dict(row) for row in self.runs],
            "ended_before": [dict(row) for row in self.ended_before],
        }


def count_or_none(value) -> int | None:
    """`value` (a count read from a frame or a dict) as an int; None when it is None or NaN."""
    return None if value is None or value != value else int(value)


def standing_at(
    curves: pd.DataFrame, compute: float, *, noise_band: float = NOISE_BAND, inside_data: bool = True
) -> Standing | None:
    """The Standing of `curves`' fitted runs at `compute` (ties to the earlier run; None when none is read); runs whose
    data end before it are set apart unless inside_data is off (identified fits read past their data)."""
    usable = curves[curves[["A", "B", "C_mid", "R0"]].notna().all(axis=1)]
    ended = (
        usable["c_max"].astype(float) < compute * (1 - 1e-9)
        if inside_data and "c_max" in usable
        else usable["A"].isna()
    )
    ended_before = tuple({"run": str(row["run"]), "c_max": float(row["c_max"])} for _, row in usable[ended].iterrows())
    usable = usable[~ended]  # a curve is read only inside its own data
    if usable.empty or not compute > 0:
        return None
    rewards = fitted_rewards(usable, float(compute))
    order = sorted(range(len(usable)), key=lambda i: (-rewards[i], i))
    best = float(rewards[order[0]])
    rows = []
    for i in order:
        row = usable.iloc[i]
        gap = best - float(rewards[i])
        rows.append(
            {
                "run": str(row["run"]),
                "prompts_per_batch": count_or_none(row.get("prompts_per_batch")),
                "rollouts": count_or_none(row.get("rollouts")),
                "reward": float(rewards[i]),
                "gap": gap,
                "within_band": not beyond_noise(gap, noise_band=noise_band),
            }
        )
    return Standing(compute=float(compute), runs=tuple(rows), noise_band=noise_band, ended_before=ended_before)
