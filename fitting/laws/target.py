"""The compute at which a run is predicted to reach a target reward R: the sigmoid's inverse C_mid ((R - R0) /
(A - R))^(1/B), with an interval from the bootstrap draws, or a Reason saying it is not reached below A."""

import math

import numpy as np
import pandas as pd
from rlscale.fitting.rules.reasons import Reason

DEFAULT_LEVEL = 0.9  # the interval's level, as the prediction intervals (fitting.laws.predict)


def compute_to_reach(target: float, A, B, C_mid, R0) -> np.ndarray:
    """The first compute (C_mid's unit) at which the sigmoid reaches `target`: 0 where it starts at or above it, inf
    where its asymptote A is at or below it; elementwise over arrays of parameters."""
    A, B, C_mid, R0 = (np.asarray(v, dtype=float) for v in (A, B, C_mid, R0))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inverse = C_mid * ((target - R0) / (A - target)) ** (1.0 / B)
    out = np.where(R0 >= target, 0.0, np.where(A <= target, np.inf, inverse))
    return np.where(np.isnan(out) & (R0 < target), np.inf, out)


def reach(
    target: float, params, draws: np.ndarray | None = None, *, level: float = DEFAULT_LEVEL, identified: bool = True
) -> Reason:
    """Where a fit (params (A, B, C_mid, R0), bootstrap `draws` (m, 4)) reaches `target`, as a Reason: reached,
    reached_unbounded (over (1 - level) / 2 of the draws never reach it), at_start, not_reached, or a_not_identified
    (A is below the target but not identified: not a prediction)."""
    A, B, C_mid, R0 = (float(v) for v in params)
    point = float(compute_to_reach(target, A, B, C_mid, R0))
    if point == 0.0:
        return Reason("at_start", {"target": target, "R0": R0})
    if math.isinf(point):
        return Reason("not_reached" if identified else "a_not_identified", {"target": target, "A": A})
    lo = hi = float("nan")
    share = 0.0
    if draws is not None and len(draws) >= 2:
        values = compute_to_reach(target, draws[:, 0], draws[:, 1], draws[:, 2], draws[:, 3])
        # sample quantiles (no interpolation), so draws that never reach the target stay infinite
        lo, hi = (float(np.quantile(values, q, method="inverted_cdf")) for q in ((1 - level) / 2, (1 + level) / 2))
        share = float(np.mean(np.isinf(values)))
    values = {"target": target, "compute": point, "compute_lo": lo, "level": level}
    if math.isinf(hi):
        return Reason("reached_unbounded", {**values, "share_unreached": share})
    return Reason("reached", {**values, "compute_hi": hi})


def curve_targets(curves: pd.DataFrame, draws: dict, target: float, *, level: float = DEFAULT_LEVEL) -> list[dict]:
    """One row per run of `curves` (fitting.curves.run_curves, with its draws): run, A, A_lo, A_hi, identified, and
    `reach` as a Reason dict; a run without a fit gets code not_fitted."""
    rows = []
    for row in curves.to_dict("records"):
        params = [row["A"], row["B"], row["C_mid"], row["R0"]]
        if not all(math.isfinite(float(v)) for v in params):
            why = Reason("not_fitted", {"error": row.get("reason") or "no fit"})
        else:
            why = reach(target, params, draws.get(row["run"]), level=level, identified=bool(row["identified"]))
        rows.append(
            {
                "run": str(row["run"]),
                "A": row["A"],
                "A_lo": row["A_lo"],
                "A_hi": row["A_hi"],
                "identified": bool(row["identified"]),
                "reach": why.to_dict(),
            }
        )
    return rows


def record_targets(
    records: pd.DataFrame,
    target: float,
    *,
    level: float = DEFAULT_LEVEL,
    run_col: str = "run",
    compute_col: str = "compute",
    reward_col: str = "reward",
    **fit_kwargs,
) -> list[dict]:
    """`curve_targets` for a records frame (a run log): each run fitted by fit_sigmoid(**fit_kwargs), its bootstrap
    draws giving the interval. A missing run column means one run, "all"."""
    from rlscale.fitting.sigmoid import FitError, fit_sigmoid
    from rlscale.fitting.sigmoid.points import scaled_fit_options
    from rlscale.fitting.sigmoid.runs import SINGLE_RUN

    fit_kwargs = scaled_fit_options(records[reward_col], fit_kwargs)
    groups = (
        records.groupby(run_col, sort=False, dropna=False) if run_col in records.columns else [(SINGLE_RUN, records)]
    )
    rows = []
    for run, group in groups:
        try:
            fit = fit_sigmoid(
                group[compute_col].to_numpy(dtype=float, na_value=np.nan),
                group[reward_col].to_numpy(dtype=float, na_value=np.nan),
                **fit_kwargs,
            )
        except FitError as err:
            rows.append(
                {
                    "run": str(run),
                    "A": None,
                    "A_lo": None,
                    "A_hi": None,
                    "identified": False,
                    "reach": Reason("not_fitted", {"error": str(err)}).to_dict(),
                }
            )
            continue
        why = reach(target, (fit.A, fit.B, fit.C_mid, fit.R0), fit.samples, level=level, identified=fit.identified)
        rows.append(
            {
                "run": str(run),
                "A": fit.A,
                "A_lo": fit.A_lo,
                "A_hi": fit.A_hi,
                "identified": fit.identified,
                "reach": why.to_dict(),
            }
        )
    return rows
