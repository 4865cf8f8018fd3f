"""The prediction interval of a run's end reward, calibrated and judged on the real runs of bench/data (issue 41).

Every run is fitted on its first half and on its first quarter of compute and predicts its mean reward over its last
10% (`rlscale backtest`). The interval (fitting/laws/predict.py) is calibrated by split-conformal prediction held out by
source: for each source, the scale's coefficients and the conformal scores come from the other sources only, and
score that source's runs. Judged by coverage, the interval score (Gneiting and Raftery 2007) and width, each
training counted once, beside today's method: fitting/laws/predict.py as of BASELINE_COMMIT (a drift term in proportion
to the run's total gain |A - R0|, its constant fitted held out by source in the same way). The calibration on every
source goes to fitting/laws/interval.json. Used by bench/backtest.py, which runs it; bench/decisions.py reads the
held-out calibrations it writes.
"""

import importlib.util
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlscale.fitting.backtest import in_end_window, interval_score  # noqa: E402
from rlscale.fitting.laws.predict import DEFAULT_LEVEL, Calibration  # noqa: E402
from rlscale.fitting.sigmoid import FitError, fit_sigmoid  # noqa: E402
from scipy import optimize  # noqa: E402

# Fractions the prediction interval is judged from: the half and the quarter
FRACTIONS = (0.5, 0.25)
# Today's method: fitting/laws/predict.py as of this commit (the last that changed it before issue 41)
BASELINE_COMMIT = "6a662d7"
# The synthetic random-walk plateau's step per unit gain and sqrt(ln compute): the size of today's drift term
RANDOM_WALK_PER_GAIN = 0.085


def load_baseline():
    """Today's fitting/laws/predict.py (at BASELINE_COMMIT), imported under its own name."""
    text = subprocess.run(
        ["git", "show", f"{BASELINE_COMMIT}:fitting/laws/predict.py"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "predict_baseline.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("predict_baseline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ordered(compute, reward) -> tuple[np.ndarray, np.ndarray]:
    """A run's finite points at compute >= 0, in compute order (as backtest_run reads them)."""
    x, y = np.asarray(compute, dtype=float), np.asarray(reward, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y) & (x >= 0)
    order = np.argsort(x[keep], kind="stable")
    return x[keep][order], y[keep][order]


def baseline_parts(baseline, compute, reward, fraction: float, fit: dict) -> tuple[float, float] | None:
    """(known sd, drift scale) of today's interval for one run cut at `fraction` (as backtest_run cuts it): its
    parameter and window-noise sd in quadrature, and |A - R0| sqrt(distance); None when the part cannot be fitted."""
    x, y = _ordered(compute, reward)
    if not len(x) or not x[-1] > 0:
        return None
    part = x <= fraction * x[-1]
    end = in_end_window(x, x[-1]) & ~part
    try:
        part_fit = fit_sigmoid(x[part], y[part], **fit)
    except FitError:
        return None
    p = baseline.predict_at(part_fit, x[part], y[part], float(x[-1]), window_compute=x[end], drift=baseline.NO_DRIFT)
    return math.hypot(p.sd_parameters, p.sd_noise), baseline.drift_scale(part_fit, p.distance)


def own_extrapolation_error(compute, reward, fraction: float) -> float:
    """A run's own backtest inside what the fit sees: the sigmoid fitted on the first half of the part cut at
    `fraction` predicts the part's last 10%; that prediction's error (NaN with under 5 points to fit or none to
    check). A candidate sign of how far this run wanders from its curve, for the alternatives."""
    x, y = _ordered(compute, reward)
    if not len(x) or not x[-1] > 0:
        return math.nan
    part = x <= fraction * x[-1]
    x, y = x[part], y[part]
    if not len(x):
        return math.nan
    inner = x <= 0.5 * x[-1]
    check = in_end_window(x, x[-1]) & ~inner
    if inner.sum() < 5 or not check.any():
        return math.nan
    try:
        inner_fit = fit_sigmoid(x[inner], y[inner], bootstrap=0, noise="auto", seed=0)
    except FitError:
        return math.nan
    return float(np.mean(inner_fit.predict(x[check])) - np.mean(y[check]))


def interval_rows(backtests: list, training_key, fit: dict) -> list[dict]:
    """One row per run and fraction of `backtests` ((source, path, compute column, fraction, records, [RunBacktest])
    for every data set on its compute column): source, training key, fraction, the backtest's error, observed end
    reward and the interval's inputs (sd_parameters, sigma, gain_left, distance), and today's (known, drift_scale);
    `weight` = 1 / the copies of its training at that fraction."""
    baseline = load_baseline()
    rows = []
    for name, path, compute_col, f, records, results in backtests:
        by_run = {str(run): g for run, g in records.groupby("run", sort=False, dropna=False)}
        for r in results:
            if not (r.fitted and math.isfinite(r.error)):
                continue
            run_compute, run_reward = by_run[r.run][compute_col], by_run[r.run]["reward"]
            old = baseline_parts(baseline, run_compute, run_reward, f, fit)
            rows.append(
                {
                    "source": name,
                    "training": training_key(name, path, r.run),
                    "run": r.run,
                    "fraction": f,
                    "error": r.error,
                    "observed": r.observed,
                    "predicted": r.predicted,
                    "sd_parameters": r.sd_parameters,
                    "sigma": r.sigma,
                    "gain_left": r.gain_left,
                    "distance": r.distance,
                    "identified": r.identified,
                    "known": old[0] if old else math.nan,
                    "drift_scale": old[1] if old else math.nan,
                    "own_error": own_extrapolation_error(run_compute, run_reward, f),
                }
            )
    copies: dict = {}
    for row in rows:
        copies[(row["training"], row["fraction"])] = copies.get((row["training"], row["fraction"]), 0) + 1
    for row in rows:
        row["weight"] = 1.0 / copies[(row["training"], row["fraction"])]
    return [
        row
        for row in rows
        if all(
            math.isfinite(row[k]) for k in ("sd_parameters", "sigma", "gain_left", "distance", "known", "drift_scale")
        )
    ]


def column(rows, key) -> np.ndarray:
    return np.array([row[key] for row in rows], dtype=float)


def interval_scale(calibration_or_coefficients, sd_parameters, sigma, gain_left, distance) -> np.ndarray:
    """The interval's scale (reward units) for arrays of its inputs: sqrt(sd_parameters^2 + (a sigma)^2 +
    distance (b^2 sigma^2 + g^2 gain_left^2)), the coefficients (a, b, g) given directly or by a Calibration."""
    c = calibration_or_coefficients
    a, b, g = (c.noise_share, c.drift_per_noise, c.drift_per_gain) if isinstance(c, Calibration) else c
    p, s, gl, d = (np.asarray(v, dtype=float) for v in (sd_parameters, sigma, gain_left, distance))
    return np.sqrt(p**2 + (a * s) ** 2 + np.maximum(d, 0.0) * ((b * s) ** 2 + (g * gl) ** 2))


def calibrate_interval(
    errors, sd_parameters, sigma, gain_left, distance, *, weights=None, provenance: dict | None = None
) -> Calibration:
    """Calibration from runs' errors (prediction - observed) and `predict_at`'s parts: (a, b, g) maximising the weighted
    Laplace likelihood under `interval_scale`, then scores |error| / scale; runs with a non-finite input are dropped."""
    e, p, s, gl, d = (np.asarray(v, dtype=float) for v in (errors, sd_parameters, sigma, gain_left, distance))
    w = np.ones_like(e) if weights is None else np.asarray(weights, dtype=float)
    ok = np.isfinite(e) & np.isfinite(p) & np.isfinite(s) & np.isfinite(gl) & np.isfinite(d) & (w > 0)
    e, p, s, gl, d, w = (v[ok] for v in (e, p, s, gl, d, w))
    floor = 1e-9 * max(float(np.max(np.abs(e))) if len(e) else 1.0, 1e-12)  # an exact fit's scale is not 0

    def loss(log_coefficients):
        scale = interval_scale(np.exp(log_coefficients), p, s, gl, d) + floor
        return float(np.sum(w * (np.log(scale) + np.abs(e) / scale)))

    # a few starts: the likelihood is smooth but flat where one term dwarfs another
    best = min(
        (
            optimize.minimize(
                loss, np.full(3, start), method="Nelder-Mead", options={"xatol": 1e-4, "fatol": 1e-8, "maxiter": 4000}
            )
            for start in (-3.0, -1.0, 0.0)
        ),
        key=lambda r: r.fun,
    )
    a, b, g = (float(v) for v in np.exp(best.x))
    scores = np.abs(e) / (interval_scale((a, b, g), p, s, gl, d) + floor)
    return Calibration(a, b, g, tuple(map(float, scores)), tuple(map(float, w)), provenance or {})


def calibration_dict(calibration: Calibration) -> dict:
    """JSON-ready `calibration`, as Calibration.from_dict (and fitting/laws/interval.json) reads it."""
    return {
        "noise_share": calibration.noise_share,
        "drift_per_noise": calibration.drift_per_noise,
        "drift_per_gain": calibration.drift_per_gain,
        "scores": list(calibration.scores),
        "weights": list(calibration.weights),
        "provenance": calibration.provenance,
    }


def calibrate(rows, provenance: dict | None = None) -> Calibration:
    """The interval's calibration on `rows` (`calibrate_interval`, each training counted once)."""
    return calibrate_interval(
        column(rows, "error"),
        column(rows, "sd_parameters"),
        column(rows, "sigma"),
        column(rows, "gain_left"),
        column(rows, "distance"),
        weights=column(rows, "weight"),
        provenance=provenance,
    )


def new_interval(rows, calibration: Calibration, level: float) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) of the interval with `calibration`, clipped to [0, 1] (every source's reward is a pass rate)."""
    half = calibration.quantile(level) * interval_scale(
        calibration,
        column(rows, "sd_parameters"),
        column(rows, "sigma"),
        column(rows, "gain_left"),
        column(rows, "distance"),
    )
    predicted = column(rows, "predicted")
    return np.clip(predicted - half, 0.0, 1.0), np.clip(predicted + half, 0.0, 1.0)


def todays_interval(rows, train, level: float, baseline) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) of today's interval, its drift constant fitted on `train` (not clipped: today's method is not)."""
    from scipy import stats

    constant = baseline.calibrate_drift(
        column(train, "error"),
        column(train, "known"),
        column(train, "drift_scale"),
        weights=column(train, "weight"),
        level=level,
    )
    half = stats.norm.ppf(0.5 + level / 2.0) * np.hypot(column(rows, "known"), constant * column(rows, "drift_scale"))
    predicted = column(rows, "predicted")
    return predicted - half, predicted + half


def judge(rows, lo, hi, level: float) -> dict:
    """Coverage and mean interval score (each training once), median width and |error| (over runs), per fraction."""
    out = {}
    observed, weight = column(rows, "observed"), column(rows, "weight")
    fractions = column(rows, "fraction")
    for f in FRACTIONS:
        at = fractions == f
        if not at.any():
            continue
        w = weight[at]
        inside = (lo[at] <= observed[at]) & (observed[at] <= hi[at])
        scores = np.array([interval_score(a, b, o, level) for a, b, o in zip(lo[at], hi[at], observed[at])])
        width, error = (hi - lo)[at], np.abs(column(rows, "error"))[at]
        out[f"from_{f:g}"] = {
            "runs": int(at.sum()),
            "trainings": float(w.sum()),
            "coverage": float(np.sum(w * inside) / w.sum()),
            "mean_interval_score": float(np.sum(w * scores) / w.sum()),
            "median_width": float(np.median(width)),
            "median_abs_error": float(np.median(error)),
            "median_width_over_median_abs_error": float(np.median(width) / np.median(error)),
        }
    return out


def held_out(rows, level: float = DEFAULT_LEVEL) -> dict:
    """Both methods held out by source: each source's runs scored with the calibration (today: the drift constant)
    fitted on the other sources. Per source and over all; with each source's held-out calibration."""
    baseline = load_baseline()
    sources = sorted({row["source"] for row in rows})
    new_lo, new_hi, old_lo, old_hi = (np.full(len(rows), np.nan) for _ in range(4))
    per_source = {}
    for src in sources:
        mine = [i for i, row in enumerate(rows) if row["source"] == src]
        held = [rows[i] for i in mine]
        train = [row for row in rows if row["source"] != src]
        calibration = calibrate(train)
        new_lo[mine], new_hi[mine] = new_interval(held, calibration, level)
        old_lo[mine], old_hi[mine] = todays_interval(held, train, level, baseline)
        per_source[src] = {
            "new": judge(held, new_lo[mine], new_hi[mine], level),
            "today": judge(held, old_lo[mine], old_hi[mine], level),
            "calibration_from_other_sources": calibration_dict(calibration),
        }
    return {
        "level": level,
        "sources": sources,
        "new": judge(rows, new_lo, new_hi, level),
        "today": judge(rows, old_lo, old_hi, level),
        "per_source": per_source,
    }


def _alternative_scales() -> dict:
    """{name: (scale(rows, theta), number of coefficients, whether they must be positive)}: the interval's scale in
    forms tried beside the shipped one (the first)."""

    def f(rows, *keys):
        return [column(rows, k) for k in keys]

    def unidentified(rows):
        return 1.0 - column(rows, "identified")

    def shipped(rows, t):
        p, s, gl, d = f(rows, "sd_parameters", "sigma", "gain_left", "distance")
        return np.sqrt(p**2 + s**2 * (t[0] ** 2 + t[1] ** 2 * d) + t[2] ** 2 * gl**2 * d)

    def todays_terms(rows, t):
        p, s, total = f(rows, "sd_parameters", "sigma", "drift_scale")
        return np.sqrt(p**2 + (t[0] * s) ** 2 + (t[1] * total) ** 2)

    def gain_left_only(rows, t):
        p, gl, d = f(rows, "sd_parameters", "gain_left", "distance")
        return np.sqrt(p**2 + t[0] ** 2 * gl**2 * d)

    def noise_distance_identification(rows, t):
        s, d = f(rows, "sigma", "distance")
        return s * (t[0] + t[1] * d) * (1.0 + t[2] * unidentified(rows))

    def shipped_unidentified(rows, t):
        return shipped(rows, t) * (1.0 + t[3] * unidentified(rows))

    def own_error(rows):
        # |own_extrapolation_error|, or where it cannot be had, sigma times its median ratio to sigma
        e, s = np.abs(column(rows, "own_error")), column(rows, "sigma")
        return np.where(np.isfinite(e), e, np.nanmedian(e / s) * s)

    def shipped_own_error(rows, t):
        return np.sqrt(shipped(rows, t) ** 2 + (t[3] * own_error(rows)) ** 2)

    def log_linear(rows, t):
        s, known, gl, d = f(rows, "sigma", "known", "gain_left", "distance")
        return np.exp(
            t[0]
            + t[1] * np.log(s + 1e-4)
            + t[2] * np.log(known + 1e-4)
            + t[3] * np.log(gl + 0.005)
            + t[4] * column(rows, "identified")
            + t[5] * d
        )

    return {
        "shipped: parameters, sigma, sigma x sqrt(distance), gain left x sqrt(distance)": (shipped, 3, True),
        "today's terms refitted: parameters, sigma, total gain x sqrt(distance)": (todays_terms, 2, True),
        "parameters, gain left x sqrt(distance)": (gain_left_only, 1, True),
        "sigma x (a + b distance) x (1 + c if unidentified)": (noise_distance_identification, 3, True),
        "shipped x (1 + c if unidentified)": (shipped_unidentified, 4, True),
        "log-linear in sigma, parameters and window noise, gain left, identified, distance": (log_linear, 6, False),
        "shipped + the run's own error from the first half of what the fit sees": (shipped_own_error, 4, True),
    }


def _fit_scale(rows, scale, k: int, positive: bool) -> np.ndarray:
    """The coefficients of `scale` that maximise the weighted Laplace likelihood of the rows' errors."""
    from scipy import optimize

    e, w = np.abs(column(rows, "error")), column(rows, "weight")

    def loss(t):
        s = np.maximum(scale(rows, np.exp(t) if positive else t), 1e-9)
        return float(np.sum(w * (np.log(s) + e / s)))

    starts = [np.full(k, v) for v in (-3.0, -1.0, 0.0)] if positive else [np.zeros(k)]
    best = min(
        (
            optimize.minimize(loss, x0, method="Nelder-Mead", options={"maxiter": 6000, "xatol": 1e-4, "fatol": 1e-8})
            for x0 in starts
        ),
        key=lambda r: r.fun,
    )
    return np.exp(best.x) if positive else best.x


def alternatives(rows, level: float = DEFAULT_LEVEL) -> dict:
    """Each form of `_alternative_scales` held out by source as the shipped one is (coefficients by the Laplace
    likelihood and conformal scores, both on the other sources): coverage, mean interval score, median width."""
    from rlscale.fitting.laws.predict import conformal_quantile

    out = {}
    for name, (scale, k, positive) in _alternative_scales().items():
        lo, hi = np.full(len(rows), np.nan), np.full(len(rows), np.nan)
        for src in sorted({row["source"] for row in rows}):
            mine = [i for i, row in enumerate(rows) if row["source"] == src]
            train = [row for row in rows if row["source"] != src]
            theta = _fit_scale(train, scale, k, positive)
            q = conformal_quantile(np.abs(column(train, "error")) / scale(train, theta), column(train, "weight"), level)
            held = [rows[i] for i in mine]
            half = q * scale(held, theta)
            lo[mine] = np.clip(column(held, "predicted") - half, 0.0, 1.0)
            hi[mine] = np.clip(column(held, "predicted") + half, 0.0, 1.0)
        out[name] = {
            key: {m: v[m] for m in ("coverage", "mean_interval_score", "median_width")}
            for key, v in judge(rows, lo, hi, level).items()
        }
    return out


def hindsight_score(rows, calibration: Calibration, level: float = DEFAULT_LEVEL) -> dict:
    """A floor for this form of interval: the mean interval score (each training once) per fraction when every source
    and fraction gets the multiplier of `calibration`'s scale that is best for its own runs in hindsight (which no
    method held out by source can know), with the intervals clipped to [0, 1]."""
    grid = np.geomspace(0.1, 30.0, 600)
    out = {}
    for f in FRACTIONS:
        total = weight = 0.0
        for src in sorted({row["source"] for row in rows}):
            mine = [row for row in rows if row["source"] == src and row["fraction"] == f]
            if not mine:
                continue
            scale = interval_scale(
                calibration,
                column(mine, "sd_parameters"),
                column(mine, "sigma"),
                column(mine, "gain_left"),
                column(mine, "distance"),
            )
            predicted, observed, w = column(mine, "predicted"), column(mine, "observed"), column(mine, "weight")
            best = min(
                np.sum(
                    w
                    * [
                        interval_score(a, b, o, level)
                        for a, b, o in zip(
                            np.clip(predicted - q * scale, 0, 1), np.clip(predicted + q * scale, 0, 1), observed
                        )
                    ]
                )
                for q in grid
            )
            total, weight = total + best, weight + w.sum()
        out[f"from_{f:g}"] = total / weight
    return out


def synthetic_coverage(n_runs: int, calibration: Calibration, seed: int = 0) -> dict:
    """The interval's coverage, median width and mean interval score on synthetic curves with a known end, each fitted
    on its first half and predicting its mean reward over its last 10% of compute: bench/fit_accuracy.py's curves
    (160 evaluations) with its independent ('constant'), AR(1) and slow-drift noise, which are stationary; and the
    same independent noise on a plateau that wanders as a random walk in ln(compute) (RANDOM_WALK_PER_GAIN x
    |A - R0| per sqrt(ln compute))."""
    sys.path.insert(0, str(ROOT / "bench"))
    from fit_accuracy import FULL_GPU_HOURS, simulate
    from rlscale.fitting.laws.predict import predict_at

    out = {}
    for noise in ("constant", "ar1", "drift", "random_walk_plateau"):
        rng = np.random.default_rng([seed, 7])
        inside, widths, scores = [], [], []
        curves = simulate(
            n_runs, seed, "constant" if noise == "random_walk_plateau" else noise, observed=FULL_GPU_HOURS
        )
        for truth, compute, reward in curves:
            if noise == "random_walk_plateau":
                log_c = np.log(compute)
                steps = rng.standard_normal(compute.size) * np.sqrt(np.diff(log_c, prepend=log_c[0]))
                reward = np.clip(reward + RANDOM_WALK_PER_GAIN * abs(truth["A"] - truth["R0"]) * np.cumsum(steps), 0, 1)
            part, end = compute <= compute[-1] / 2, in_end_window(compute, compute[-1])
            part_fit = fit_sigmoid(compute[part], reward[part], seed=0)
            observed = float(np.mean(reward[end]))
            p = predict_at(
                part_fit,
                compute[part],
                reward[part],
                float(compute[-1]),
                window_compute=compute[end],
                calibration=calibration,
            )
            inside.append(p.lo <= observed <= p.hi)
            widths.append(p.width)
            scores.append(interval_score(p.lo, p.hi, observed, p.level))
        out[noise] = {
            "coverage": float(np.mean(inside)),
            "median_width": float(np.median(widths)),
            "mean_interval_score": float(np.mean(scores)),
        }
        print(
            f"   synthetic {noise}: coverage {out[noise]['coverage']:.1%}, median width "
            f"{out[noise]['median_width']:.3f}, mean interval score {out[noise]['mean_interval_score']:.3f}"
        )
    return {"runs_per_noise": n_runs, "level": DEFAULT_LEVEL, "noise": out}
