"""The ScaleRL sigmoid R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) fitted to one run: SigmoidFit and fit_sigmoid.
A's interval: the hull of wild-bootstrap percentile and profile-likelihood intervals, widened for correlated noise."""

import warnings
from dataclasses import dataclass, field

import numpy as np
from rlscale.fitting.sigmoid.bootstrap import percentile_interval, wild_resamples
from rlscale.fitting.sigmoid.curve import (
    THETA_A,
    curve_model,
    log_compute,
    natural_parameters,
    parameter_bounds,
    shape_grid,
    sigmoid,
)
from rlscale.fitting.sigmoid.noise import NOISE_MODELS, autocorrelation_inflation, likeliest_noise, noise_sqrt_weights
from rlscale.fitting.sigmoid.profile import Profile
from rlscale.fitting.sigmoid.solver import levenberg_marquardt

# A and its interval closer than this to a bound of A (0 or 1 for pass rates) count as touching it.
_AT_BOUND = 1e-6
# Distinct compute values the fitted rise (10% to 90% of the gain) must span to count as seen.
_MIN_POINTS_IN_RISE = 3
# Relative size of the fitted gain |A - R0| below which the curve is called flat.
_FLAT_GAIN = 1e-6
MAX_CI_WIDTH = 0.1  # ScaleRL: A is identified when its 95% interval is at most this wide (pass-rate units)


class FitError(ValueError):
    """Data that cannot be fitted at all; the message says why. n_points: the points the fit would have used (finite,
    at or past min_compute), where they were counted."""

    def __init__(self, message: str, n_points: int | None = None):
        super().__init__(message)
        self.n_points = n_points


@dataclass(frozen=True)
class SigmoidFit:
    """One run's fitted sigmoid, its 95% interval on A and whether A is identified; noise: the model it weighted by;
    rho: the residuals' lag-1 autocorrelation, which widens the intervals; A_upper: NaN without upper_level."""

    A: float
    B: float
    C_mid: float
    R0: float
    rss: float
    r2: float
    A_lo: float
    A_hi: float
    n_points: int
    identified: bool
    reason: str
    samples: np.ndarray | None = field(default=None, compare=False, repr=False)
    A_upper: float = float("nan")
    noise: str = "binomial"
    rho: float = 0.0

    def predict(self, compute) -> np.ndarray:
        return sigmoid(compute, self.A, self.B, self.C_mid, self.R0)

    def predict_interval(self, compute, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
        """Bootstrap band (lo, hi) of the fitted mean reward at `compute`; NaN when no bootstrap was run."""
        compute = np.asarray(compute, dtype=float)
        if self.samples is None or len(self.samples) == 0:
            nan = np.full(compute.shape, np.nan)
            return nan, nan.copy()
        draws = self.samples
        curves = sigmoid(compute[..., None], draws[:, 0], draws[:, 1], draws[:, 2], draws[:, 3])
        return percentile_interval(curves, level, axis=-1)

    def to_dict(self) -> dict:
        """Plain-Python summary with keys A, B, C_mid, R0, rss, r2, A_lo, A_hi, n_points, identified, reason, noise."""
        summary = {key: float(getattr(self, key)) for key in ("A", "B", "C_mid", "R0", "rss", "r2", "A_lo", "A_hi")}
        summary.update(n_points=int(self.n_points), identified=bool(self.identified))
        summary.update(reason=self.reason, noise=self.noise)
        return summary


def fit_sigmoid(
    compute,
    reward,
    *,
    r0=None,
    min_compute=0.0,
    bounded=True,
    noise="auto",
    bootstrap=200,
    seed=0,
    max_ci_width=MAX_CI_WIDTH,
    upper_level=None,
) -> SigmoidFit:
    """Fitted ScaleRL sigmoid of `reward` against `compute` (any unit; C_mid comes back in it); FitError when it cannot
    be fitted (under 3 usable points, rewards outside [0, 1] if `bounded`, bad options); bootstrap 0: no A interval."""
    if noise not in NOISE_MODELS:
        raise FitError(f"noise must be one of {', '.join(NOISE_MODELS)}, got {noise!r}")
    if noise == "binomial" and not bounded:
        raise FitError("binomial noise is for pass rates in [0, 1]; use constant, multiplicative or auto")
    # Degenerate input (inf, huge or tiny values) is refused or flagged below, never a warning on the way.
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return _fit(compute, reward, r0, min_compute, bounded, noise, bootstrap, seed, max_ci_width, upper_level)


def _fit(compute, reward, r0, min_compute, bounded, noise, bootstrap, seed, max_ci_width, upper_level) -> SigmoidFit:
    x, y = _clean(compute, reward, 0.0 if min_compute is None else float(min_compute), bounded)
    if r0 is not None and not (np.isfinite(r0) and (not bounded or 0.0 <= r0 <= 1.0)):
        raise FitError(f"r0 must be a finite reward{' in [0, 1]' if bounded else ''}, got {r0}")
    # Unbounded metrics are fitted in standard units so the grid and tolerances need no scale.
    shift, unit = (0.0, 1.0) if bounded else _standard_units(y)
    ys = (y - shift) / unit
    r0s = None if r0 is None else (r0 - shift) / unit
    u, center = log_compute(x)
    free = np.array([True, True, True, r0 is None])
    lower, upper = parameter_bounds(u, center, bounded)
    model = curve_model(u)
    natural_mean = lambda t: shift + unit * model(t)[0][0]  # noqa: E731
    starts = _grid_starts(u, ys, r0s, bounded)
    # Reweighted once (IRLS): weights 1 / sd at the best grid curve, then at the fit, where "auto" picks its model.
    sqrt_w = noise_sqrt_weights("constant" if noise == "auto" else noise, natural_mean(starts[:1]))
    # A few steps from every start pick the basin; only the best one is then polished.
    theta, cost = levenberg_marquardt(model, starts, ys, sqrt_w, lower, upper, free, max_iter=8)
    best = theta[np.argmin(cost)][None, :]
    used = likeliest_noise(y, natural_mean(best), bounded) if noise == "auto" else noise
    sqrt_w = noise_sqrt_weights(used, natural_mean(best))
    best, cost = levenberg_marquardt(model, best, ys, sqrt_w, lower, upper, free)
    theta_hat = best[0]
    if not np.all(np.isfinite(theta_hat)) or not np.isfinite(cost[0]):
        raise FitError("the fit did not converge to finite parameters", len(ys))
    fitted, jac = model(best)
    fitted, jac = fitted[0], jac[0] * sqrt_w[:, None]
    resid_w = sqrt_w * (ys - fitted)
    n_free = int(free.sum())
    dof = len(ys) - n_free
    rho, inflation = autocorrelation_inflation(resid_w, jac[:, free])
    se_a = _standard_error_a(jac[:, free], resid_w, dof) * np.sqrt(inflation)
    samples = None
    # Below two points per parameter resamples refit the same few points almost exactly: far too narrow, so no interval.
    if bootstrap and len(ys) >= 2 * n_free:
        y_star = wild_resamples(fitted, resid_w, sqrt_w, jac[:, free], bootstrap, seed)
        draws, draw_cost = levenberg_marquardt(
            model, np.repeat(best, bootstrap, axis=0), y_star, sqrt_w, lower, upper, free, max_iter=60, xtol=1e-7
        )
        keep = np.isfinite(draw_cost) & np.all(np.isfinite(draws), axis=1)
        # Independent sign flips reproduce the residuals' variance, not their carry-over: widen by it.
        draws = np.clip(theta_hat + np.sqrt(inflation) * (draws[keep] - theta_hat), lower, upper)
        samples = natural_parameters(draws, shift, unit, center)
    sigma2 = float(cost[0]) / dof * inflation if dof > 0 else float("nan")
    profile = Profile(model, theta_hat, float(cost[0]), sigma2, u, ys, sqrt_w, lower, upper, free)
    alt_offset = 0.5 * max_ci_width / unit  # the identification test's distance from the estimate
    A_upper = float("nan") if upper_level is None else shift + unit * profile.bound(upper_level)
    A, B, C_mid, R0 = natural_parameters(best, shift, unit, center)[0]
    rss = float(np.sum((y - (shift + unit * fitted)) ** 2))
    tss = float(np.sum((y - y.mean()) ** 2)) if np.ptp(y) > 0 else 0.0  # mean() of equal values can round
    r2 = 1.0 - rss / tss if tss > 0 else float("nan")
    if samples is not None and len(samples) >= 2:
        A_lo, A_hi = (float(v) for v in percentile_interval(samples[:, 0], 0.95))
        # The bootstrap misses a higher A reached more slowly (too narrow above on real runs): hull with the profile.
        ends, requests = [A_lo, A_hi], []
        for i, side in enumerate((-1, 1) if profile.testable() else ()):
            boot = (ends[i] - shift) / unit
            if side * (boot - (upper[THETA_A] if side > 0 else lower[THETA_A])) >= 0:
                continue  # the bootstrap already reaches A's bound on this side
            scale = max(side * (boot - theta_hat[THETA_A]), 1.96 * se_a)  # the profile grid's unit, fitting units
            requests.append((i, side, scale if 0 < scale < np.inf else None))
        # The identification test below is solved with the ends (one batch); its answer is used only if needed.
        profile_ends, a_alt = profile.bounds(0.975, [request[1:] for request in requests], alt_offset)
        alt_tested = True
        for (i, _, _), end in zip(requests, profile_ends):
            ends[i] = shift + unit * end
        A_lo, A_hi = min(A_lo, ends[0]), max(A_hi, ends[1])
        width, how = A_hi - A_lo, "95% interval"
    else:
        A_lo = A_hi = float("nan")
        width, how = 2 * 1.96 * unit * se_a, "approximate 95% interval"
        a_alt, alt_tested = None, False  # tested below, only where the rest says identified
    a_bounds = (shift + unit * lower[THETA_A], shift + unit * upper[THETA_A])
    reason = _unidentified_reason(x, y, A, B, C_mid, R0, n_free, width, how, max_ci_width, tss, a_bounds, A_lo, A_hi)
    # The bootstrap resamples around the fitted bend; on data that has not bent, other asymptotes fit too.
    if not reason and not alt_tested:
        a_alt = profile.not_rejected(alt_offset)
    if not reason and a_alt is not None:
        reason = (
            f"the data fit as well with A = {shift + unit * a_alt:.4g} "
            f"(profile likelihood, 95%): the asymptote is not pinned down"
        )
    return SigmoidFit(
        A=float(A),
        B=float(B),
        C_mid=float(C_mid),
        R0=float(R0),
        rss=rss,
        r2=r2,
        A_lo=A_lo,
        A_hi=A_hi,
        n_points=len(y),
        identified=not reason,
        reason=reason,
        samples=samples,
        A_upper=float(A_upper),
        noise=used,
        rho=float(rho),
    )


def _clean(compute, reward, min_compute, bounded) -> tuple[np.ndarray, np.ndarray]:
    try:
        x = np.asarray(compute, dtype=float).ravel()
        y = np.asarray(reward, dtype=float).ravel()
    except (TypeError, ValueError) as err:
        raise FitError(f"compute and reward must be numbers: {err}") from None
    if x.shape != y.shape:
        raise FitError(f"compute and reward differ in length: {x.size} vs {y.size}")
    keep = np.isfinite(x) & np.isfinite(y) & (x >= 0) & (x >= min_compute)
    order = np.argsort(x[keep], kind="stable")  # compute order: the residuals' autocorrelation runs along it
    x, y = x[keep][order], y[keep][order]
    if len(x) < 3:
        raise FitError(
            f"need at least 3 points with finite compute >= {min_compute:g} and finite reward, got {len(x)}", len(x)
        )
    distinct = np.unique(x)
    if len(distinct) < 3 or np.count_nonzero(distinct > 0) < 2:
        raise FitError(f"need at least 3 distinct compute values (2 of them > 0), got {len(distinct)}", len(x))
    tiny = np.finfo(float).tiny
    if np.any((x > 0) & (x < tiny)):
        raise FitError(
            f"compute values below {tiny:.3g} (subnormal floats) have lost their precision: rescale compute", len(x)
        )
    if bounded and (y.min() < 0 or y.max() > 1):
        raise FitError(
            f"reward outside [0, 1] (min {y.min():g}, max {y.max():g}): "
            "fit metrics not in [0, 1] unbounded (rlscale fit --unbounded; bounded=False in the API)",
            len(x),
        )
    return x, y


def _standard_units(y) -> tuple[float, float]:
    # Divided by the largest |y| first so huge values do not overflow.
    size = float(np.max(np.abs(y))) or 1.0
    shift = size * float(np.mean(y / size))
    unit = size * float(np.std(y / size))
    return shift, (unit if unit > 0 and np.isfinite(unit) else size)


def _grid_starts(u, y, r0, bounded, n_starts=3) -> np.ndarray:
    bb, mm, s = shape_grid(u, (-0.5, 2.5), 25)
    if r0 is None:
        s_mean = s.mean(axis=1, keepdims=True)
        sc = s - s_mean
        sxx = np.einsum("gn,gn->g", sc, sc)
        gain = np.where(sxx > 0, sc @ (y - y.mean()) / np.where(sxx > 0, sxx, 1.0), 0.0)
        R0 = y.mean() - gain * s_mean[:, 0]
    else:
        sss = np.einsum("gn,gn->g", s, s)
        gain = np.where(sss > 0, s @ (y - r0) / np.where(sss > 0, sss, 1.0), 0.0)
        R0 = np.full_like(gain, r0)
    A = R0 + gain
    if bounded:
        A, R0 = np.clip(A, 0.0, 1.0), np.clip(R0, 0.0, 1.0)
    resid = R0[:, None] + (A - R0)[:, None] * s - y
    rss = np.einsum("gn,gn->g", resid, resid).reshape(bb.shape)
    padded = np.full((rss.shape[0] + 2, rss.shape[1] + 2), np.inf)
    padded[1:-1, 1:-1] = rss
    neighbours = np.minimum.reduce([padded[:-2, 1:-1], padded[2:, 1:-1], padded[1:-1, :-2], padded[1:-1, 2:]])
    minima = np.flatnonzero((rss <= neighbours).ravel())
    minima = minima[np.argsort(rss.ravel()[minima], kind="stable")][:n_starts]
    if minima.size == 0:
        minima = np.array([np.argmin(rss)])
    return np.column_stack([A[minima], np.log(bb.ravel()[minima]), mm.ravel()[minima], R0[minima]])


def _standard_error_a(jac, resid_w, dof) -> float:
    # Asymptotic (Jacobian) standard error of A, used for identification when no bootstrap is run.
    if dof <= 0:
        return float("inf")
    sigma2 = float(resid_w @ resid_w) / dof
    try:
        cov = np.linalg.pinv(jac.T @ jac) * sigma2
    except np.linalg.LinAlgError:
        return float("inf")
    se = float(np.sqrt(cov[THETA_A, THETA_A])) if cov[THETA_A, THETA_A] >= 0 else float("inf")
    return se if np.isfinite(se) else float("inf")


def _unidentified_reason(x, y, A, B, C_mid, R0, n_free, width, how, max_ci_width, tss, a_bounds, A_lo, A_hi) -> str:
    reasons = []
    if len(y) < 2 * n_free:
        # A few points are fitted almost exactly by some bend, and resamples of them agree with it.
        reasons.append(
            f"{len(y)} points for {n_free} parameters (at least {2 * n_free} needed; no interval below that)"
        )
    spread = max(float(np.ptp(y)), float(np.max(np.abs(y))), 1e-300)
    if tss == 0:
        reasons.append("reward is constant")
    elif abs(A - R0) <= _FLAT_GAIN * spread:
        reasons.append("fitted curve is flat (A = R0)")
    elif A < R0:
        reasons.append("reward decreases with compute (A < R0)")
    if x.max() < C_mid:
        reasons.append(f"has not passed the inflection: max C {x.max():.4g} < C_mid {C_mid:.4g}")
    # A rise steeper than the evaluations resolve is a step fitted to noise as often as a real bend.
    rising = np.unique(x[(x > 0) & (np.abs(B * (np.log(x / C_mid))) <= np.log(9.0))])
    if rising.size < _MIN_POINTS_IN_RISE and tss > 0 and abs(A - R0) > _FLAT_GAIN * spread:
        reasons.append(
            f"the rise is too sharp for the data: {rising.size} compute value{'s' * (rising.size != 1)} between 10% "
            f"and 90% of the gain (at least {_MIN_POINTS_IN_RISE} needed)"
        )
    if not width <= max_ci_width:
        reasons.append(f"{how} on A is too wide ({width:.3g} > {max_ci_width:.3g})")
    for bound in a_bounds:
        if not np.isfinite(bound):
            continue
        if abs(A - bound) <= _AT_BOUND:
            reasons.append(f"A sits at its bound {bound:g}")
        elif np.isfinite(A_lo) and min(abs(A_lo - bound), abs(A_hi - bound)) <= _AT_BOUND:
            reasons.append(f"{how} on A touches A's bound {bound:g}")
    return "; ".join(reasons)
