"""The study page's charts as plain, JSON-ready data (pure: frames and fits in, dicts out).

rlscale/views/page.py embeds them and assets/page.js draws them with uPlot, in report.html and in the dashboard alike.
Numbers are rounded to 4 significant digits: a chart cannot show more, and 16 runs x 100 evaluations stay ~40 KB.
"""

import math

import numpy as np
import pandas as pd

from rlscale.fitting.sigmoid import sigmoid
from rlscale.fitting.sigmoid.bootstrap import percentile_interval
from rlscale.views.wording import reason_text

# matplotlib's tab10: the runs table's swatches and the charts' series share these, by run order
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
GRID_POINTS = 60  # points of a fitted curve on the chart's log grid
EXTEND = 2.0  # fitted curves go on, dashed, to this multiple of the run's last compute (as the report's PNG)
BAND_LEVEL = 0.95


def color_index(position: int) -> int:
    """The palette slot of the run at `position` in the study's run order (the CSS class c0..c9)."""
    return position % len(PALETTE)


def rounded(values, digits: int = 4) -> list:
    """Plain floats to `digits` significant digits; NaN and infinities become None (JSON null: a gap)."""
    out = []
    for value in np.asarray(values, dtype=float).ravel():
        out.append(float(f"{value:.{digits}g}") if math.isfinite(value) else None)
    return out


def compute_grid(records: pd.DataFrame, compute_col: str, points: int = GRID_POINTS) -> np.ndarray:
    """A log grid from the smallest positive compute evaluated to EXTEND x the largest (empty without one)."""
    compute = pd.to_numeric(records[compute_col], errors="coerce").to_numpy(float) if len(records) else np.array([])
    compute = compute[np.isfinite(compute) & (compute > 0)]
    if compute.size == 0:
        return np.array([])
    lo, hi = compute.min(), compute.max() * EXTEND
    return np.geomspace(lo, hi, points) if hi > lo else np.array([lo])


def curve_chart(
    records: pd.DataFrame,
    curves: pd.DataFrame,
    *,
    compute_col: str,
    reward_col: str,
    draws: dict | None = None,
    unit_label: str = "GPU-hours",
    reward_label: str = "reward",
) -> dict:
    """Reward against compute per run: its evaluations and its fitted sigmoid with a 95% band.

    records: run (label), compute_col, reward_col. curves: one row per run (run, A, B, C_mid, R0, A_lo, A_hi,
    identified), in the study's run order (it sets the colours). draws: {run: (m, 4) bootstrap (A, B, C_mid, R0)},
    whose percentile band is drawn; without them the band spans A_lo..A_hi, as the report's PNG draws it.
    Returns {grid, unit, reward, runs: [{run, color, c, r, fit}]}; fit: {mean, lo, hi, until} on the shared grid,
    null outside the run's compute (the chart dashes it past `until`, the last compute the run reached).
    """
    grid = compute_grid(records, compute_col)
    runs = []
    by_run = {name: rows for name, rows in records.groupby("run", sort=False)} if len(records) else {}
    for position, row in enumerate(curves.to_dict("records")):
        mine = by_run.get(row["run"], records.iloc[:0])
        compute = pd.to_numeric(mine[compute_col], errors="coerce").to_numpy(float)
        reward = pd.to_numeric(mine[reward_col], errors="coerce").to_numpy(float)
        shown = np.isfinite(compute) & (compute > 0) & np.isfinite(reward)  # a log axis has no 0
        entry = {
            "run": str(row["run"]),
            "color": color_index(position),
            "c": rounded(compute[shown]),
            "r": rounded(reward[shown]),
            "fit": None,
        }
        if shown.any() and grid.size and all(np.isfinite(float(row.get(k, np.nan))) for k in ("A", "B", "C_mid", "R0")):
            entry["fit"] = _fitted(row, grid, compute[shown], (draws or {}).get(row["run"]))
        runs.append(entry)
    return {"grid": rounded(grid), "unit": unit_label, "reward": reward_label, "runs": runs}


def _fitted(row: dict, grid: np.ndarray, compute: np.ndarray, samples) -> dict:
    until = float(compute.max())
    inside = (grid >= compute.min() * (1 - 1e-9)) & (grid <= until * EXTEND * (1 + 1e-9))
    params = [float(row[k]) for k in ("A", "B", "C_mid", "R0")]
    mean = np.where(inside, sigmoid(grid, *params), np.nan)
    if samples is not None and len(samples) >= 2:
        curves = sigmoid(grid[:, None], samples[:, 0], samples[:, 1], samples[:, 2], samples[:, 3])
        lo, hi = percentile_interval(curves, BAND_LEVEL, axis=1)
    elif np.isfinite(row.get("A_lo", np.nan)) and np.isfinite(row.get("A_hi", np.nan)):
        lo, hi = sigmoid(grid, row["A_lo"], *params[1:]), sigmoid(grid, row["A_hi"], *params[1:])
    else:
        lo = hi = np.full(grid.shape, np.nan)
    lo, hi = np.where(inside, lo, np.nan), np.where(inside, hi, np.nan)
    return {
        "mean": rounded(mean),
        "lo": rounded(lo),
        "hi": rounded(hi),
        "until": rounded([until])[0],
        "identified": bool(row.get("identified", False)),
    }


def frontier_chart(law, *, extrapolate_to: float | None = None, unit_label: str = "GPU-hours") -> dict:
    """The frontier's n*(C) and the fitted optimal-n law (fitting.laws.optimal_n.RolloutsLaw), on one log grid.

    Returns {grid, frontier (n* per grid point, null off the frontier), law (inside the observed compute),
    beyond (the law past it, dashed, to `extrapolate_to` or 4x), identified, reason, unit}.
    """
    front = law.frontier
    c_lo, c_hi = law.compute_range
    end = max(extrapolate_to or 4 * c_hi, c_hi)
    grid = np.unique(np.concatenate([front["compute"].to_numpy(float), np.geomspace(c_lo, end, GRID_POINTS)]))
    on_front = dict(zip(front["compute"].to_numpy(float), front["rollouts"].to_numpy(float)))
    predicted = law.predict(grid)
    inside = grid <= c_hi * (1 + 1e-9)
    beyond = grid >= c_hi * (1 - 1e-9)
    return {
        "grid": rounded(grid),
        "frontier": rounded([on_front.get(c, np.nan) for c in grid]),
        "law": rounded(np.where(inside, predicted, np.nan)),
        "beyond": rounded(np.where(beyond, predicted, np.nan)),
        "identified": bool(law.identified),
        "reason": reason_text(law.verdict),
        "unit": unit_label,
    }
