"""A run's mean reward over the window ending at a target compute, with a split-conformal prediction interval whose
scale adds parameter, noise and drift parts in variance (calibrated on real runs into INTERVAL_FILE)."""

import json
import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from rlscale.fitting.sigmoid import SigmoidFit, sigmoid
from scipy import stats

from rlscale.base.numbers import json_safe

# The reward at C is read as the mean over the evaluations at compute in [(1 - WINDOW) C, C].
WINDOW = 0.1
DEFAULT_LEVEL = 0.9
# The interval's calibration and where it was estimated (bench/backtest.py writes it).
INTERVAL_FILE = Path(__file__).with_name("interval.json")
# The window's mean curve is taken over at most this many evaluations (a target far past the data may hold billions).
_MAX_GRID = 1000
# Parameter sd from the draws' central 90%: draws of a fit that has not bent have tails that would dominate a variance.
_DRAW_LEVEL = 0.9


@dataclass(frozen=True)
class Calibration:
    """The interval's scale coefficients (see `parts`) and the calibration runs' conformal scores |error| / scale,
    with weights (a training recorded k times weighs 1/k each) and provenance (runs, command, commit)."""

    noise_share: float
    drift_per_noise: float
    drift_per_gain: float
    scores: tuple
    weights: tuple
    provenance: dict

    @classmethod
    def load(cls, path: Path = INTERVAL_FILE) -> "Calibration":
        """The calibration in `path` (default: the one the package ships, read once)."""
        return _load_calibration(str(path))

    @classmethod
    def from_dict(cls, data: dict) -> "Calibration":
        return cls(
            float(data["noise_share"]),
            float(data["drift_per_noise"]),
            float(data["drift_per_gain"]),
            tuple(map(float, data["scores"])),
            tuple(map(float, data["weights"])),
            data.get("provenance", {}),
        )

    def quantile(self, level: float) -> float:
        """The multiplier of the scale for an interval at `level` (`conformal_quantile` of the scores)."""
        return conformal_quantile(self.scores, self.weights, level)

    def parts(
        self, sd_parameters: float, sigma: float, gain_left: float, distance: float
    ) -> tuple[float, float, float]:
        """(sd_parameters, sd_noise, sd_drift) in reward units; distance in ln(compute) past the data (0 inside)."""
        sd_noise = self.noise_share * sigma
        sd_drift = math.sqrt(max(distance, 0.0)) * math.hypot(
            self.drift_per_noise * sigma, self.drift_per_gain * gain_left
        )
        return float(sd_parameters), float(sd_noise), float(sd_drift)


@lru_cache(maxsize=4)
def _load_calibration(path: str) -> Calibration:
    return Calibration.from_dict(json.loads(Path(path).read_text()))


def conformal_quantile(scores, weights, level: float) -> float:
    """Split-conformal quantile at `level`: the smallest score whose weighted share, with the new run as weight 1,
    reaches `level`; past what the scores support (W / (W + 1)), the top score x the normal quantiles' ratio."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    s = np.asarray(scores, dtype=float)
    w = np.asarray(weights, dtype=float)
    keep = np.isfinite(s) & np.isfinite(w) & (w > 0)
    s, w = s[keep], w[keep]
    if not len(s):
        return float("nan")
    order = np.argsort(s, kind="stable")
    s, w = s[order], w[order]
    reach = level * (w.sum() + 1.0)
    covered = np.cumsum(w)
    if reach <= covered[-1] * (1 + 1e-12):
        return float(s[np.searchsorted(covered, reach * (1 - 1e-12))])
    top = covered[-1] / (covered[-1] + 1.0)  # the highest level the scores support
    return float(s[-1] * stats.norm.ppf(0.5 + level / 2.0) / stats.norm.ppf(0.5 + top / 2.0))


@dataclass(frozen=True)
class Prediction:
    """Mean reward over the evaluations in [(1 - window) at, at] and its interval: predicted -+ quantile x hypot(sd_*),
    in reward units, clipped for pass rates; distance: ln(window middle / last compute seen), 0 inside the data."""

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
    quantile: float = float("nan")
    sigma: float = float("nan")
    gain_left: float = float("nan")

    @property
    def width(self) -> float:
        return self.hi - self.lo

    def to_dict(self) -> dict:
        """JSON-ready: NaN and inf become None."""
        return json_safe(asdict(self))


def evaluation_spacing(compute) -> float:
    """Median step in compute between consecutive evaluations over the later half of the data (where the
    schedule is as it will continue); NaN with fewer than two distinct positive values."""
    x = np.unique(np.asarray(compute, dtype=float))
    x = x[np.isfinite(x) & (x > 0)]
    if len(x) < 2:
        return float("nan")
    steps = np.diff(x[len(x) // 2 - 1 if len(x) > 2 else 0 :])
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
    """The run's noise around its curve (sigma): the residuals' root mean square over the later half of the fitted
    points (the plateau's noise, not the rise's), scaled for the fit's degrees of freedom."""
    x = np.asarray(compute, dtype=float)
    y = np.asarray(reward, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    order = np.argsort(x, kind="stable")
    resid = (y - fit.predict(x))[order]
    late = resid[len(resid) // 2 :]
    dof_share = max(1.0 - 4.0 / max(len(resid), 5), 0.2)
    return float(np.sqrt(np.mean(late**2) / dof_share)) if len(late) else float("nan")


def predict_at(
    fit: SigmoidFit,
    compute,
    reward,
    at: float,
    *,
    level: float = DEFAULT_LEVEL,
    window_compute=None,
    calibration: Calibration | None = None,
    window: float = WINDOW,
    bounded: bool = True,
) -> Prediction:
    """The prediction of `fit` (fitted to compute, reward) of the mean reward over [(1 - window) at, at], with interval.
    window_compute: the window's evaluations if known (else spaced as the data's); bounded: clip to [0, 1]."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if not (math.isfinite(at) and at > 0):
        raise ValueError(f"the target compute must be finite and > 0, got {at}")
    calibration = Calibration.load() if calibration is None else calibration
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
    middle = float(np.mean(points))
    last = float(np.max(seen)) if seen.size else float("nan")
    distance = max(0.0, math.log(middle) - math.log(last)) if last > 0 and middle > 0 else 0.0  # no ratio to underflow
    sigma = noise_sd(fit, compute, reward)
    gain_left = abs(fit.A - float(fit.predict([last])[0])) if math.isfinite(last) else float("nan")
    parts = calibration.parts(sd_parameters, sigma, gain_left, distance)
    quantile = calibration.quantile(level)
    half = quantile * math.sqrt(sum(p**2 for p in parts))
    lo, hi = predicted - half, predicted + half
    if bounded:
        lo, hi = min(max(lo, 0.0), 1.0), min(max(hi, 0.0), 1.0)
    return Prediction(
        at=float(at),
        level=float(level),
        predicted=predicted,
        lo=float(lo),
        hi=float(hi),
        sd_parameters=parts[0],
        sd_noise=parts[1],
        sd_drift=parts[2],
        distance=distance,
        n_window=n_window,
        quantile=quantile,
        sigma=sigma,
        gain_left=gain_left,
    )


def _parameter_sd(fit: SigmoidFit, points: np.ndarray) -> float:
    draws = fit.samples
    if draws is None or len(draws) < 2:
        return float("nan")
    means = sigmoid(points[None, :], draws[:, 0, None], draws[:, 1, None], draws[:, 2, None], draws[:, 3, None]).mean(
        axis=1
    )
    means = means[np.isfinite(means)]
    if len(means) < 2:
        return float("nan")
    tail = (1.0 - _DRAW_LEVEL) / 2.0
    lo, hi = np.quantile(means, [tail, 1.0 - tail])
    return float((hi - lo) / (2.0 * stats.norm.ppf(1.0 - tail))) * _profile_widening(fit)


def _profile_widening(fit: SigmoidFit) -> float:
    draws = fit.samples[:, 0]
    lo, hi = np.quantile(draws[np.isfinite(draws)], [0.025, 0.975])
    hull = fit.A_hi - fit.A_lo
    if not (math.isfinite(hull) and hi - lo > 0):
        return 1.0
    return max(1.0, float(hull / (hi - lo)))


def _linearised_sd(fit: SigmoidFit, compute, reward, points: np.ndarray, level: float) -> float:
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


def predict_run(
    compute, reward, at: float, *, level: float = DEFAULT_LEVEL, calibration: Calibration | None = None, **fit_kwargs
) -> Prediction | None:
    """`predict_at` on `fit_sigmoid(compute, reward, **fit_kwargs)` for one run; None when the run cannot be fitted."""
    from rlscale.fitting.sigmoid import FitError, fit_sigmoid

    x = np.asarray(compute, dtype=float)
    y = np.asarray(reward, dtype=float)
    try:
        fit = fit_sigmoid(x, y, **fit_kwargs)
    except FitError:
        return None
    used = np.isfinite(x) & np.isfinite(y) & (x >= float(fit_kwargs.get("min_compute") or 0.0))
    return predict_at(
        fit, x[used], y[used], at, level=level, calibration=calibration, bounded=fit_kwargs.get("bounded", True)
    )


def predict_stored_run(
    records, chosen, compute_col: str, at: float, *, reward_col: str = "val_reward", **kwargs
) -> Prediction | None:
    """`predict_run` on the records of one run of a stored study: those whose run_id (else run name) is `chosen`'s
    (a row of the study's fits). None when it cannot be fitted or has no interval."""
    key = "run_id" if "run_id" in records.columns and "run_id" in chosen.index else "run"
    mine = records[records[key] == chosen[key]]
    p = predict_run(
        mine[compute_col].to_numpy(dtype=float, na_value=np.nan),
        mine[reward_col].to_numpy(dtype=float, na_value=np.nan),
        at,
        **kwargs,
    )
    return p if p is not None and math.isfinite(p.lo) and math.isfinite(p.hi) else None


def predict_runs(
    records,
    at: float,
    *,
    level: float = DEFAULT_LEVEL,
    run_col="run",
    compute_col="compute",
    reward_col="reward",
    **fit_kwargs,
):
    """DataFrame of run, at, predicted, predicted_lo, predicted_hi, level per run (NaN where `predict_run` gives none).
    A missing `compute` column falls back to `gpu_hours`; a missing run column means one run."""
    import pandas as pd
    from rlscale.fitting.sigmoid.points import scaled_fit_options
    from rlscale.fitting.sigmoid.runs import SINGLE_RUN

    if compute_col not in records.columns and compute_col == "compute" and "gpu_hours" in records.columns:
        compute_col = "gpu_hours"
    fit_kwargs = scaled_fit_options(records[reward_col], fit_kwargs)
    groups = (
        records.groupby(run_col, sort=False, dropna=False) if run_col in records.columns else [(SINGLE_RUN, records)]
    )
    calibration = Calibration.load()
    rows = []
    for run, group in groups:
        p = predict_run(
            group[compute_col].to_numpy(dtype=float, na_value=np.nan),
            group[reward_col].to_numpy(dtype=float, na_value=np.nan),
            at,
            level=level,
            calibration=calibration,
            **fit_kwargs,
        )
        nan = float("nan")
        rows.append(
            {
                "run": run,
                "at": float(at),
                "predicted": p.predicted if p else nan,
                "predicted_lo": p.lo if p else nan,
                "predicted_hi": p.hi if p else nan,
                "level": float(level),
            }
        )
    return pd.DataFrame(rows, columns=["run", "at", "predicted", "predicted_lo", "predicted_hi", "level"])
