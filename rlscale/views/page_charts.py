"""The study page's chart data (pure): CURVE_POINTS a run at 4 digits keep hundreds of runs to a few hundred KB."""

import math

import numpy as np
import pandas as pd

from rlscale.fitting.sigmoid.runs import variant_names
from rlscale.views.wording import reason_text

# matplotlib's tab10: the runs table's swatches and the charts' series share these, by run order or group
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
GRID_POINTS = 60  # points of the frontier's log grid
CURVE_POINTS = 24  # evaluations a run sends at most, spread evenly over log compute (its last one always)
EXTEND = 2.0  # fitted curves go on, dashed, to this multiple of the run's last compute (as the report's PNG)
ORDINAL_MAX = 16  # an axis with at most this many values is drawn as its values in order, evenly spaced
# config keys that name where an imported run came from, not a knob: never an axis
NOT_AXES = {"source", "run", "compute_unit", "seed"}
FITTED_AXES = (("A", "A"), ("B", "B"))  # after the study's own axes: the fit's asymptote and efficiency


def color_index(position: int) -> int:
    """The palette slot of the run at `position` in the study's run order (the CSS class c0..c9)."""
    return position % len(PALETTE)


def rounded(values, digits: int = 4) -> list:
    """Plain floats to `digits` significant digits; NaN and infinities become None (JSON null: a gap)."""
    out = []
    for value in np.asarray(values, dtype=float).ravel():
        out.append(float(f"{value:.{digits}g}") if math.isfinite(value) else None)
    return out


def number(value, digits: int = 4):
    """One value as `rounded` writes it (None for a missing or non-finite one)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return float(f"{value:.{digits}g}") if math.isfinite(value) else None


def decimated(compute: np.ndarray, points: int = CURVE_POINTS) -> np.ndarray:
    """Indices of at most `points` evaluations (compute > 0): the nearest to each log-spaced target, and the last."""
    compute = np.asarray(compute, dtype=float)
    shown = np.flatnonzero(np.isfinite(compute) & (compute > 0))
    if shown.size <= points:
        return shown
    logs = np.log(compute[shown])
    targets = np.linspace(logs.min(), logs.max(), points)
    nearest = np.abs(logs[None, :] - targets[:, None]).argmin(axis=1)
    return shown[np.unique(np.append(nearest, logs.argmax()))]


def run_points(compute, reward, points: int = CURVE_POINTS) -> dict:
    """{n: evaluations with compute > 0 and a reward (log axis), c, r: at most `points` of them}."""
    compute = np.asarray(compute, dtype=float)
    reward = np.asarray(reward, dtype=float)
    ok = np.isfinite(compute) & (compute > 0) & np.isfinite(reward)
    keep = decimated(np.where(ok, compute, np.nan), points)
    return {"n": int(ok.sum()), "c": rounded(compute[keep]), "r": rounded(reward[keep])}


def study_axes(spec, runs: pd.DataFrame) -> dict[str, list]:
    """{axis: each run's value}: the spec's `parameters`, loo variants, or differing config keys; `seed` if several."""
    configs = [cfg if isinstance(cfg, dict) else {} for cfg in runs.get("config", [None] * len(runs))]
    axes: dict[str, list] = {}
    if spec is not None and spec.parameters:
        keys = list(spec.parameters)
    elif spec is not None and spec.method == "loo":
        axes["variant"], keys = variant_names(runs).tolist(), []
    else:
        seen = {key for cfg in configs for key in cfg} - NOT_AXES
        keys = sorted(key for key in seen if len({_plain(cfg.get(key)) for cfg in configs}) > 1)
    for key in keys:
        axes[key] = [_plain(cfg.get(key)) for cfg in configs]
    if "seed" in runs.columns and runs["seed"].nunique() > 1:
        axes["seed"] = [int(seed) for seed in runs["seed"]]
    return axes


def _plain(value):
    if value is None or isinstance(value, bool | str):
        return value if not isinstance(value, bool) else str(value).lower()
    if isinstance(value, int | float | np.integer | np.floating):
        return number(value, 6)
    return str(value)


def parallel_axes(axes: dict[str, list], rows: list[dict], budget_label: str | None) -> list[dict]:
    """The study's axes, then A, B, at_budget (given `budget_label`): {key, label, fitted, kind, values or lo, hi}."""
    out = []
    for key, values in axes.items():
        out.append({"key": key, "label": key.replace("_", " "), "fitted": False, **_scale(values)})
    fitted = [*FITTED_AXES, *((("at_budget", budget_label),) if budget_label else ())]
    for key, label in fitted:
        out.append({"key": key, "label": label, "fitted": True, **_scale([row.get(key) for row in rows], numeric=True)})
    return out


def _scale(values: list, numeric: bool = False) -> dict:
    known = [v for v in values if v is not None]
    numbers = [float(v) for v in known if isinstance(v, int | float)]
    if not numeric and (len(numbers) < len(known) or len(set(numbers)) <= ORDINAL_MAX):
        text = sorted({str(v) for v in known if not isinstance(v, int | float)})
        return {"kind": "ordinal", "values": sorted(set(numbers)) + text}
    if not numbers:
        return {"kind": "linear", "lo": 0.0, "hi": 1.0}
    lo, hi = min(numbers), max(numbers)
    if lo > 0 and hi / lo >= 20:
        return {"kind": "log", "lo": number(lo), "hi": number(hi)}
    pad = (hi - lo) * 0.05 or abs(hi) * 0.05 or 0.05
    return {"kind": "linear", "lo": number(lo - pad), "hi": number(hi + pad)}


def default_group(axes: dict[str, list]) -> str:
    """The first colouring axis: rollouts if varied (the optimal-n question), else the first varied one, else status."""
    varied = [key for key, values in axes.items() if len(set(map(str, values))) > 1 and key != "seed"]
    if "rollouts" in varied:
        return "rollouts"
    return varied[0] if varied else "status"


def frontier_chart(law, *, extrapolate_to: float | None = None, unit_label: str = "GPU-hours") -> dict:
    """{grid, frontier, law, beyond, ...}: n*(C) and the fitted law on a log grid, beyond to `extrapolate_to` or 4x."""
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
