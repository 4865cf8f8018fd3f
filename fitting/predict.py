"""The reward a run will show at a target compute, with a prediction interval a user can bet compute on.

What is predicted: the mean validation reward over a window of evaluations ending at compute C (the last WINDOW of
C), as the run's own evaluations would measure it. The interval carries three independent parts, added in variance:
- the fit's parameter uncertainty: the spread of the window's mean over the fit's bootstrap draws, widened as the
  fit's interval on A widens the bootstrap's (its profile likelihood follows a higher A reached more slowly);
- evaluation noise over the window: the residuals' variance over the window's evaluations (AR(1)-correlated);
- drift: the plateau's wander and creep beyond what the data shows, a random walk in log compute whose size is in
  proportion to the fitted gain: sd = drift x |A - R0| x sqrt(ln(C / last compute seen)), zero inside the data. Its
  constant comes from real runs (bench/backtest.py writes DRIFT_FILE, with which runs and the held-out coverage).
The interval on A (SigmoidFit.A_lo/A_hi) is a confidence interval for the asymptote of the curve behind the data;
this one is for a future measurement, which is why it is wider where the target lies far past the data.
"""

import json
import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from scipy import stats

from rlscale.fitting.sigmoid import SigmoidFit, sigmoid

# The reward at C is read as the mean over the evaluations at compute in [(1 - WINDOW) C, C].
WINDOW = 0.1
DEFAULT_LEVEL = 0.9
# The drift constant and where it was estimated (bench/backtest.py writes it).
DRIFT_FILE = Path(__file__).with_name("drift.json")
# The window's mean curve is taken over at most this many evaluations (a target far past the data may hold billions).
_MAX_GRID = 1000
# Parameter uncertainty is read from the draws' central 90% (a robust scale: draws of a fit that has not bent
# have long tails the variance would be dominated by).
_DRAW_LEVEL = 0.9


@dataclass(frozen=True)
class Drift:
    """How far the plateau wanders past the data: sd = per_gain x |A - R0| x sqrt(ln(C / last compute seen)), in
    reward units. `provenance`: which runs it was estimated on, by what command, at which commit."""

    per_gain: float
    provenance: dict

    @classmethod
    def load(cls, path: Path = DRIFT_FILE) -> "Drift":
        """The drift in `path` (default: the one the package ships, read once)."""
        return _load_drift(str(path))


@lru_cache(maxsize=4)
def _load_drift(path: str) -> Drift:
    data = json.loads(Path(path).read_text())
    return Drift(per_gain=float(data["per_gain"]), provenance=data.get("provenance", {}))


NO_DRIFT = Drift(0.0, {"note": "no drift term"})


@dataclass(frozen=True)
class Prediction:
    """Mean reward over the evaluations in [(1 - window) at, at] and its prediction interval at `level`.

    predicted, lo, hi: the point prediction and the interval (NaN ends when a fit without bootstrap draws has no
    degrees of freedom left for its linearised sd).
    sd_parameters, sd_noise, sd_drift: the interval's three parts (reward units; they add in variance).
    distance: ln of the window's middle over the last compute seen (0 inside the data). n_window: evaluations
    the window's mean is over.
    """

    at: float
    level: float
    predicted: float
    lo: float
    hi: float
    sd_parameters: float
    sd_noise: float
    sd_drift: float
    distance: float
    n_window: int

    @property
    def width(self) -> float:
        return self.hi - self.lo

    def to_dict(self) -> dict:
        """JSON-ready: NaN becomes None."""
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()}


def evaluation_spacing(compute) -> float:
    """Median step in compute between consecutive evaluations over the later half of the data (where the
    schedule is as it will continue); NaN with fewer than two distinct positive values."""
    x = np.unique(np.asarray(compute, dtype=float))
    x = x[np.isfinite(x) & (x > 0)]
    if len(x) < 2:
        return float("nan")
    steps = np.diff(x[len(x) // 2 - 1 if len(x) > 2 else 0:])
    return float(np.median(steps))


def window_evaluations(compute, at: float, window: float = WINDOW) -> tuple[np.ndarray, int]:
    """(compute grid, n): the n evaluations expected in [(1 - window) at, at], spaced as the data's (at least one),
    and a grid of at most _MAX_GRID of them spanning the same compute, for the curve's mean over the window."""
    spacing = evaluation_spacing(compute)
    span = window * at / spacing if spacing > 0 else 0.0
    n = int(min(math.floor(span + 1e-9), 1e15)) + 1 if math.isfinite(span) else int(1e15)
    if n == 1:
        return np.array([float(at)]), 1
    grid = min(n, _MAX_GRID)
    return np.linspace(at - (n - 1) * spacing, at, grid), n


def noise_sd(fit: SigmoidFit, compute, reward) -> float:
    """Evaluation noise sd around the curve: the residuals' root mean square over the later half of the fitted points
    (the plateau's noise, not the rise's), scaled for the fit's degrees of freedom."""
    x = np.asarray(compute, dtype=float)
    y = np.asarray(reward, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    order = np.argsort(x, kind="stable")
    resid = (y - fit.predict(x))[order]
    late = resid[len(resid) // 2:]
    dof_share = max(1.0 - 4.0 / max(len(resid), 5), 0.2)
    return float(np.sqrt(np.mean(late**2) / dof_share)) if len(late) else float("nan")


def _mean_of_ar1_variance(n: int, rho: float) -> float:
    """Variance of the mean of n AR(1) values of unit variance and coefficient rho (closed form)."""
    if n <= 1 or rho <= 0:
        return 1.0 / max(n, 1)
    return float((1.0 + rho) / (1.0 - rho) / n - 2.0 * rho * (1.0 - rho**n) / ((1.0 - rho) ** 2 * n**2))


def predict_at(fit: SigmoidFit, compute, reward, at: float, *, level: float = DEFAULT_LEVEL,
               window_compute=None, drift: Drift | None = None, window: float = WINDOW) -> Prediction:
    """The fit's prediction of the mean reward over the evaluations in [(1 - window) at, at], with its interval.

    fit: the sigmoid fitted to (compute, reward), the data it saw. window_compute: the evaluations' compute in the
    window when known (else spaced as the data's, `window_evaluations`). drift: the plateau's drift (default: the
    constant in DRIFT_FILE; NO_DRIFT to leave it out).
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if not (math.isfinite(at) and at > 0):
        raise ValueError(f"the target compute must be finite and > 0, got {at}")
    drift = Drift.load() if drift is None else drift
    x = np.asarray(compute, dtype=float)
    seen = x[np.isfinite(x)]
    if window_compute is None:
        points, n_window = window_evaluations(seen, at, window)
    else:
        points = np.asarray(window_compute, dtype=float)
        n_window = len(points)
    predicted = float(np.mean(fit.predict(points)))
    sd_parameters = _parameter_sd(fit, points)
    if not math.isfinite(sd_parameters):  # too few points for a bootstrap: the linearised sd
        sd_parameters = _linearised_sd(fit, compute, reward, points, level)
    sd_noise = noise_sd(fit, compute, reward) * math.sqrt(_mean_of_ar1_variance(n_window, fit.rho))
    middle = float(np.mean(points))
    last = float(np.max(seen)) if seen.size else float("nan")
    distance = max(0.0, math.log(middle / last)) if last > 0 and middle > 0 else 0.0
    sd_drift = drift.per_gain * drift_scale(fit, distance)
    sd = math.sqrt(sd_parameters**2 + sd_noise**2 + sd_drift**2)
    z = float(stats.norm.ppf(0.5 + level / 2.0))
    lo, hi = predicted - z * sd, predicted + z * sd
    return Prediction(at=float(at), level=float(level), predicted=predicted, lo=float(lo), hi=float(hi),
                      sd_parameters=sd_parameters, sd_noise=float(sd_noise), sd_drift=float(sd_drift),
                      distance=distance, n_window=n_window)


def drift_scale(fit: SigmoidFit, distance: float) -> float:
    """The drift's sd per unit of the constant: |A - R0| x sqrt(distance), distance in ln(compute) past the data."""
    gain = abs(fit.A - fit.R0)
    return float(gain * math.sqrt(max(distance, 0.0))) if math.isfinite(gain) else float("nan")


def _parameter_sd(fit: SigmoidFit, points: np.ndarray) -> float:
    """Robust sd of the window's mean over the fit's bootstrap draws (NaN without draws)."""
    draws = fit.samples
    if draws is None or len(draws) < 2:
        return float("nan")
    means = sigmoid(points[None, :], draws[:, 0, None], draws[:, 1, None], draws[:, 2, None],
                    draws[:, 3, None]).mean(axis=1)
    means = means[np.isfinite(means)]
    if len(means) < 2:
        return float("nan")
    tail = (1.0 - _DRAW_LEVEL) / 2.0
    lo, hi = np.quantile(means, [tail, 1.0 - tail])
    return float((hi - lo) / (2.0 * stats.norm.ppf(1.0 - tail))) * _profile_widening(fit)


def _profile_widening(fit: SigmoidFit) -> float:
    """How much wider the fit's interval on A (the hull of the bootstrap's and the profile likelihood's) is than the
    bootstrap's percentile interval on A alone (>= 1): the draws miss the same ridge for a prediction past the data."""
    draws = fit.samples[:, 0]
    lo, hi = np.quantile(draws[np.isfinite(draws)], [0.025, 0.975])
    hull = fit.A_hi - fit.A_lo
    if not (math.isfinite(hull) and hi - lo > 0):
        return 1.0
    return max(1.0, float(hull / (hi - lo)))


def _linearised_sd(fit: SigmoidFit, compute, reward, points: np.ndarray, level: float) -> float:
    """sd of the window's mean from the fit's linearisation (Jacobian covariance), scaled by Student's t over the
    normal quantile at `level` for the few degrees of freedom left; NaN with none left."""
    x = np.asarray(compute, dtype=float)
    y = np.asarray(reward, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y) & (x >= 0)
    x, y = x[keep], y[keep]
    dof = len(x) - 4
    theta = np.array([fit.A, math.log(fit.B), math.log(fit.C_mid), fit.R0])
    if dof <= 0 or not np.all(np.isfinite(theta)):
        return float("nan")

    def curve(t, c):
        return sigmoid(c, t[0], math.exp(t[1]), math.exp(t[2]), t[3])

    step = 1e-6 * np.maximum(np.abs(theta), 1.0)
    jac, grad = np.empty((len(x), 4)), np.empty(4)
    for i in range(4):
        up, down = theta.copy(), theta.copy()
        up[i] += step[i]
        down[i] -= step[i]
        jac[:, i] = (curve(up, x) - curve(down, x)) / (2 * step[i])
        grad[i] = (np.mean(curve(up, points)) - np.mean(curve(down, points))) / (2 * step[i])
    s2 = float(np.sum((y - fit.predict(x)) ** 2)) / dof
    variance = float(grad @ np.linalg.pinv(jac.T @ jac) @ grad) * s2
    t_over_z = stats.t.ppf(0.5 + level / 2.0, dof) / stats.norm.ppf(0.5 + level / 2.0)
    return float(math.sqrt(max(variance, 0.0)) * t_over_z) if math.isfinite(variance) else float("nan")


def calibrate_drift(errors, sd_known, drift_scales, *, level: float = DEFAULT_LEVEL, weights=None) -> float:
    """The drift constant at which the intervals cover (weighted) `level` of the `errors` (prediction - observed),
    given each one's known sd (parameters and noise) and `drift_scale` (the drift's sd per unit of the constant).
    0 when they already cover that share without drift; inf when no drift can (a prediction with no distance
    that misses)."""
    e = np.abs(np.asarray(errors, dtype=float))
    s = np.asarray(sd_known, dtype=float)
    d = np.asarray(drift_scales, dtype=float)
    w = np.ones_like(e) if weights is None else np.asarray(weights, dtype=float)
    ok = np.isfinite(e) & np.isfinite(s) & np.isfinite(d) & (w > 0)
    e, s, d, w = e[ok], s[ok], d[ok], w[ok]
    z = float(stats.norm.ppf(0.5 + level / 2.0))

    def covered(kappa: float) -> float:
        return float(np.sum(w * (e <= z * np.sqrt(s**2 + (kappa * d) ** 2))) / np.sum(w))

    if covered(0.0) >= level:
        return 0.0
    # the drift each miss needs to be covered; the answer is the smallest of these reaching `level`
    with np.errstate(divide="ignore", invalid="ignore"):
        needed = np.where(d > 0, np.sqrt(np.maximum((e / z) ** 2 - s**2, 0.0)) / d, np.where(e <= z * s, 0.0, np.inf))
    for kappa in np.sort(np.unique(needed[np.isfinite(needed)])):
        if covered(float(kappa)) >= level:
            return float(kappa)
    return float("inf")


def predict_run(compute, reward, at: float, *, level: float = DEFAULT_LEVEL, drift: Drift | None = None,
                **fit_kwargs) -> Prediction | None:
    """`predict_at` on the sigmoid fitted to one run's (compute, reward) by `fit_sigmoid(**fit_kwargs)`; None when
    the run cannot be fitted."""
    from rlscale.fitting.sigmoid import FitError, fit_sigmoid

    x = np.asarray(compute, dtype=float)
    y = np.asarray(reward, dtype=float)
    try:
        fit = fit_sigmoid(x, y, **fit_kwargs)
    except FitError:
        return None
    used = np.isfinite(x) & np.isfinite(y) & (x >= float(fit_kwargs.get("min_compute") or 0.0))
    return predict_at(fit, x[used], y[used], at, level=level, drift=drift)


def predict_stored_run(records, chosen, compute_col: str, at: float, *, reward_col: str = "val_reward",
                       **kwargs) -> Prediction | None:
    """`predict_run` on the records of one run of a stored study: those whose run_id (else run name) is `chosen`'s
    (a row of the study's fits). None when it cannot be fitted or has no interval."""
    key = "run_id" if "run_id" in records.columns and "run_id" in chosen.index else "run"
    mine = records[records[key] == chosen[key]]
    p = predict_run(mine[compute_col].to_numpy(dtype=float, na_value=np.nan),
                    mine[reward_col].to_numpy(dtype=float, na_value=np.nan), at, **kwargs)
    return p if p is not None and math.isfinite(p.lo) and math.isfinite(p.hi) else None


def predict_runs(records, at: float, *, level: float = DEFAULT_LEVEL, run_col="run", compute_col="compute",
                 reward_col="reward", **fit_kwargs):
    """One row per run of `records` (in order of first appearance): run, at, predicted, predicted_lo, predicted_hi,
    level (`predict_run` on each; NaN for a run that cannot be fitted or has no interval). `fit_kwargs` go to
    `fit_sigmoid`; a missing `compute` column falls back to `gpu_hours`, a missing run column means one run."""
    import pandas as pd

    from rlscale.fitting.frame import SINGLE_RUN

    if compute_col not in records.columns and compute_col == "compute" and "gpu_hours" in records.columns:
        compute_col = "gpu_hours"
    groups = records.groupby(run_col, sort=False, dropna=False) if run_col in records.columns else [(SINGLE_RUN, records)]
    drift = Drift.load()
    rows = []
    for run, group in groups:
        p = predict_run(group[compute_col].to_numpy(dtype=float, na_value=np.nan),
                        group[reward_col].to_numpy(dtype=float, na_value=np.nan), at, level=level, drift=drift,
                        **fit_kwargs)
        nan = float("nan")
        rows.append({"run": run, "at": float(at), "predicted": p.predicted if p else nan,
                     "predicted_lo": p.lo if p else nan, "predicted_hi": p.hi if p else nan, "level": float(level)})
    return pd.DataFrame(rows, columns=["run", "at", "predicted", "predicted_lo", "predicted_hi", "level"])
