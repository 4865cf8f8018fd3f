"""The ScaleRL sigmoid R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B): the curve, its fit, its intervals.

Inside, parameters are theta = (A, ln B, ln C_mid / G, R0) and compute enters as u = ln(C / G), G the
geometric mean of the positive compute values, so the curve is R0 + (A - R0) * expit(B (u - ln C_mid / G)):
B > 0 and C_mid > 0 hold by construction, and the fit neither cares about the unit of compute nor loses
precision when compute is near the ends of the float range (1e-300, 1e303). The solver is a batched
Levenberg-Marquardt in numpy, so the start points of the grid and the bootstrap resamples are each solved
together in one loop.

Noise models (variance of a reward around the curve R, up to a common scale): constant (plain least
squares), binomial R(1 - R) (pass rates over k samples), multiplicative R^2 (a relative error);
"auto" picks the one of highest Gaussian likelihood on the residuals of a first, unweighted fit.
The interval on A is the hull of a wild-bootstrap percentile interval and the profile-likelihood interval, both
widened by the factor correlated noise multiplies A's variance by (training noise carries from one evaluation to
the next): AR(1) of coefficient rho, rho from the residuals' lag-1 autocorrelation, or, where their lag-2
autocorrelation says the noise fades slower than that, independent evaluation noise plus an AR(1) drift, whichever
widens more.
"""

import warnings
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import numpy as np
from scipy import signal, stats
from scipy.optimize import isotonic_regression
from scipy.special import expit

from rlscale.fitting.bootstrap import percentile_interval, wild_resamples

N_PARAMS = 4
_A, _LOG_B, _LOG_CMID, _R0 = range(N_PARAMS)
NOISE_MODELS = ("auto", "binomial", "constant", "multiplicative")
# Pass-rate variance R(1-R)/k is floored so points near 0 or 1 do not get unbounded weight.
_VARIANCE_FLOOR = 0.01 * 0.99
# Multiplicative noise: sd floored at this fraction of the largest fitted |R|, for the same reason.
_RELATIVE_SD_FLOOR = 0.05
# C_mid is kept where exp() of its logarithm is a finite, normal float.
_LOG_CMID_RANGE = (-708.0, 709.0)
# Largest AR(1) coefficient of the noise used to widen intervals.
_MAX_RHO = 0.9
# One-sided z (5%) by which the residuals' lag-2 autocorrelation must exceed AR(1)'s for the noise-plus-drift model.
_LAG2_EVIDENCE = 1.645
# A and its interval closer than this to a bound of A (0 or 1 for pass rates) count as touching it.
_AT_BOUND = 1e-6
# Distinct compute values the fitted rise (10% to 90% of the gain) must span to count as seen.
_MIN_POINTS_IN_RISE = 3
# Relative size of the fitted gain |A - R0| below which the curve is called flat.
_FLAT_GAIN = 1e-6


class FitError(ValueError):
    """Data that cannot be fitted at all; the message says why."""


def sigmoid(compute, A, B, C_mid, R0) -> np.ndarray:
    """Reward at `compute` (same unit as C_mid): R0 + (A - R0) / (1 + (C_mid / C)^B); R(0) = R0."""
    compute = np.asarray(compute, dtype=float)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        return R0 + (A - R0) / (1.0 + (C_mid / compute) ** B)


@dataclass(frozen=True)
class SigmoidFit:
    """One run's fitted sigmoid, its 95% interval on A and whether A is identified.

    A_upper: the profile-likelihood upper bound on A (see `fit_sigmoid`'s upper_level), NaN when not computed.
    noise: the noise model the fit weighted by (the one "auto" chose). rho: the noise's lag-1
    autocorrelation estimated from the residuals (0 when none was found); the intervals are widened for it.
    """

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
        """Fitted reward at `compute`."""
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
        return {
            "A": float(self.A), "B": float(self.B), "C_mid": float(self.C_mid), "R0": float(self.R0),
            "rss": float(self.rss), "r2": float(self.r2), "A_lo": float(self.A_lo), "A_hi": float(self.A_hi),
            "n_points": int(self.n_points), "identified": bool(self.identified), "reason": self.reason,
            "noise": self.noise,
        }


def curve_and_jacobian(theta: np.ndarray, log_compute: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Curve values (k, n) and Jacobian (k, n, 4) w.r.t. (A, ln B, ln C_mid, R0) for k parameter rows."""
    return _curve_model(log_compute)(theta)


def _curve_model(log_compute: np.ndarray):
    """`curve_and_jacobian` at fixed compute, as a function of theta alone: what a fit evaluates many times."""
    at_zero = np.isneginf(log_compute)  # C = 0: the curve sits at R0 and no shape parameter moves it
    if not at_zero.any():
        at_zero = None

    def model(theta):
        # Each value is computed as in R0 + (A - R0) * s, s = expit(B (u - ln C_mid)), with fewer temporaries.
        A, log_b, log_cmid, R0 = theta[:, 0:1], theta[:, 1:2], theta[:, 2:3], theta[:, 3:4]
        B = np.exp(log_b)
        z = log_compute - log_cmid
        z *= B
        s = expit(z)
        gain = A - R0
        rest = 1.0 - s
        gain_slope = s * rest
        gain_slope *= gain
        jac = np.empty(z.shape + (N_PARAMS,))
        jac[..., _A] = s
        np.multiply(gain_slope, z if at_zero is None else np.where(at_zero, 0.0, z), out=jac[..., _LOG_B])
        np.multiply(gain_slope, -B, out=jac[..., _LOG_CMID])
        jac[..., _R0] = rest
        s *= gain
        s += R0
        return s, jac

    return model


def levenberg_marquardt(model, theta0, y, sqrt_w, lower, upper, free, *, max_iter=200, xtol=1e-10):
    """Least-squares parameters (k, p) and costs (k,) for k problems solved together.

    `model(theta) -> (f, J)` gives values (k, n) and Jacobian (k, n, p) for any rows theta (k, p), as new arrays
    (the solver weights them in place); `y` is (n,) or (k, n), `sqrt_w` (n,); residuals are sqrt_w * (f - y).
    Bounds are kept by projection with an active set; `free` (p,) marks the parameters that move. Stops per row
    when a step changes theta by < xtol (relative).
    """
    theta = np.minimum(np.maximum(np.array(theta0, dtype=float), lower), upper)
    p = theta.shape[1]
    y = np.asarray(y, dtype=float)
    sqrt_w_jac = np.repeat(sqrt_w[:, None], p, axis=1)  # (n, p): one contiguous stretch per row, not p at a time

    def evaluate(t, rows, shared=False):
        # shared: every row of t is one point (bootstrap resamples all start at the fit), so the model runs once
        f, jac = model(t[:1] if shared else t)
        r = f - (y[rows] if y.ndim == 2 else y)  # weighted below: r = sqrt_w * (f - y)
        r *= sqrt_w
        jac *= sqrt_w_jac  # a new array from the model
        if shared:
            r, jac = np.repeat(r, len(t) // len(r), axis=0), np.repeat(jac, len(t), axis=0)
        cost = np.einsum("kn,kn->k", r, r)
        return r, jac, np.where(np.isfinite(cost), cost, np.inf)

    r, jac, cost = evaluate(theta, slice(None), shared=len(theta) > 1 and bool((theta == theta[0]).all()))
    # Only the rows still moving are carried through an iteration (each row's arithmetic is its own): a batch
    # whose rows mostly stopped costs what its few slow rows cost.
    rows = np.flatnonzero(np.isfinite(cost))
    t, c = theta[rows], cost[rows]
    if rows.size < len(theta):
        r, jac = r[rows], jac[rows]
    lam = np.full(rows.size, 1e-3)
    fixed = ~np.asarray(free, dtype=bool)
    with np.errstate(all="ignore"):
        for _ in range(max_iter):
            if not rows.size:
                break
            k = rows.size
            grad = np.matmul(jac.transpose(0, 2, 1), r[..., None])[..., 0]
            # Parameters pinned at a bound by the gradient leave the step (active set).
            pinned = ((t <= lower) & (grad > 0)) | ((t >= upper) & (grad < 0))
            still = pinned | fixed
            any_still = still.any()
            jm = jac * ~still[:, None, :] if any_still else jac
            hess = np.matmul(jm.transpose(0, 2, 1), jm)
            diag = hess.reshape(k, p * p)[:, ::p + 1]  # a view: writing to it writes hess's diagonal
            # Marquardt's damping on the moving parameters (scaled by their curvature), 1 + lam on the still ones.
            floor = 1e-12 * diag.max(axis=1, keepdims=True) + 1e-300
            damping = lam[:, None] * np.maximum(diag, floor)
            diag += np.where(still, lam[:, None] + 1.0, damping) if any_still else damping
            rhs = np.where(still, 0.0, grad) if any_still else grad
            try:
                step = -np.linalg.solve(hess, rhs[..., None])[..., 0]
            except np.linalg.LinAlgError:
                step = -rhs / diag
            step = np.where(np.isfinite(step), step, 0.0)
            trial = np.minimum(np.maximum(t + step, lower), upper)
            moved = trial - t
            r_t, jac_t, cost_t = evaluate(trial, rows)
            better = cost_t <= c
            if better.all():
                t, r, jac = trial, r_t, jac_t
            elif better.any():
                t[better], r[better], jac[better] = trial[better], r_t[better], jac_t[better]
            small = np.einsum("kp,kp->k", moved, moved) <= xtol**2 * (np.einsum("kp,kp->k", t, t) + xtol)
            # No change in cost beyond rounding, accepted or not: at the minimum to machine precision.
            flat = np.abs(c - cost_t) <= 1e-14 * c
            c = np.where(better, cost_t, c)
            lam = np.where(better, np.maximum(lam / 3.0, 1e-12), lam * 5.0)
            done = small | flat | (lam > 1e16)
            if done.any():
                theta[rows[done]], cost[rows[done]] = t[done], c[done]
                going = ~done
                rows, t, c, lam, r, jac = rows[going], t[going], c[going], lam[going], r[going], jac[going]
    theta[rows], cost[rows] = t, c
    return theta, cost


def fit_sigmoid(compute, reward, *, r0=None, min_compute=0.0, bounded=True, noise="auto", bootstrap=200, seed=0,
                max_ci_width=0.1, upper_level=None) -> SigmoidFit:
    """Fitted ScaleRL sigmoid of `reward` against `compute` (any unit; C_mid comes back in it).

    r0: fixed reward before RL (else fitted). min_compute: points below it are dropped.
    bounded: pass rates (A, R0 in [0, 1]); False for metrics not in [0, 1]. noise: the variance of a reward
    around the curve R, one of NOISE_MODELS: "constant" (plain least squares), "binomial" (R(1 - R), pass
    rates only), "multiplicative" (R^2) or "auto" (the most likely of these given the residuals; the one used
    is in the fit's `noise`). bootstrap: wild-bootstrap resamples for predict_interval and A_lo/A_hi (0 for
    none: no interval), A's interval being the hull of the bootstrap's and the profile likelihood's (the second
    follows a higher A reached more slowly, which the first misses on curves that creep after their bend);
    intervals are widened by the residuals' estimated autocorrelation (`rho`; lag 2 as well, see
    _autocorrelation_inflation). max_ci_width: an
    interval on A wider than this, or data that fit as well with A half of it away, mark the fit
    unidentified. upper_level: also compute A_upper, the one-sided profile-likelihood upper bound on A at
    this level (e.g. 0.975): unlike the bootstrap, it stays honest on a curve that has not bent yet, where
    data that only rise are as well explained by a much higher A reached later (it is then the reward
    ceiling, 1). Raises FitError when fewer than 3 usable points or distinct compute values remain, or on
    arguments that cannot describe a fit (r0 not finite, an unknown noise model).
    """
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
    u, center = _log_compute(x)
    free = np.array([True, True, True, r0 is None])
    lower, upper = _bounds(u, center, bounded)
    model = _curve_model(u)
    natural_mean = lambda t: shift + unit * model(t)[0][0]  # noqa: E731
    starts = _grid_starts(u, ys, r0s, bounded)
    # Weights 1 / sd from the noise model, first at the best grid curve (unweighted for "auto"), then once
    # more at the fit (iteratively reweighted least squares); "auto" chooses its model at that point.
    sqrt_w = _noise_sqrt_weights("constant" if noise == "auto" else noise, natural_mean(starts[:1]))
    # A few steps from every start pick the basin; only the best one is then polished.
    theta, cost = levenberg_marquardt(model, starts, ys, sqrt_w, lower, upper, free, max_iter=8)
    best = theta[np.argmin(cost)][None, :]
    used = _likeliest_noise(y, natural_mean(best), bounded) if noise == "auto" else noise
    sqrt_w = _noise_sqrt_weights(used, natural_mean(best))
    best, cost = levenberg_marquardt(model, best, ys, sqrt_w, lower, upper, free)
    theta_hat = best[0]
    if not np.all(np.isfinite(theta_hat)) or not np.isfinite(cost[0]):
        raise FitError("the fit did not converge to finite parameters")
    fitted, jac = model(best)
    fitted, jac = fitted[0], jac[0] * sqrt_w[:, None]
    resid_w = sqrt_w * (ys - fitted)
    n_free = int(free.sum())
    dof = len(ys) - n_free
    rho, inflation = _autocorrelation_inflation(resid_w, jac[:, free])
    se_a = _standard_error_a(jac[:, free], resid_w, dof) * np.sqrt(inflation)
    samples = None
    # Below two points per parameter the resamples refit the same few points almost exactly: an interval
    # from them is far narrower than the truth, so none is given (the reason says why).
    if bootstrap and len(ys) >= 2 * n_free:
        y_star = wild_resamples(fitted, resid_w, sqrt_w, jac[:, free], bootstrap, seed)
        draws, draw_cost = levenberg_marquardt(
            model, np.repeat(best, bootstrap, axis=0), y_star, sqrt_w, lower, upper, free,
            max_iter=60, xtol=1e-7)
        keep = np.isfinite(draw_cost) & np.all(np.isfinite(draws), axis=1)
        # Independent sign flips reproduce the residuals' variance, not their carry-over: widen by it.
        draws = np.clip(theta_hat + np.sqrt(inflation) * (draws[keep] - theta_hat), lower, upper)
        samples = _natural(draws, shift, unit, center)
    sigma2 = float(cost[0]) / dof * inflation if dof > 0 else float("nan")
    profile = _Profile(model, theta_hat, float(cost[0]), sigma2, u, ys, sqrt_w, lower, upper, free)
    alt_offset = 0.5 * max_ci_width / unit  # the identification test's distance from the estimate
    A_upper = float("nan") if upper_level is None else shift + unit * profile.bound(upper_level)
    A, B, C_mid, R0 = _natural(best, shift, unit, center)[0]
    rss = float(np.sum((y - (shift + unit * fitted)) ** 2))
    tss = float(np.sum((y - y.mean()) ** 2)) if np.ptp(y) > 0 else 0.0  # mean() of equal values can round
    r2 = 1.0 - rss / tss if tss > 0 else float("nan")
    if samples is not None and len(samples) >= 2:
        A_lo, A_hi = (float(v) for v in percentile_interval(samples[:, 0], 0.95))
        # The percentile bootstrap resamples around the fitted bend and misses how far a higher A reached more
        # slowly (lower B) still fits: on real runs that creep after their bend it was too narrow above. The
        # profile likelihood follows that ridge; the interval is the hull of the two. (An exact fit has no noise
        # scale for the profile's test: the bootstrap's interval alone.)
        ends, requests = [A_lo, A_hi], []
        for i, side in enumerate((-1, 1) if profile.testable() else ()):
            boot = (ends[i] - shift) / unit
            if side * (boot - (upper[_A] if side > 0 else lower[_A])) >= 0:
                continue  # the bootstrap already reaches A's bound on this side
            scale = max(side * (boot - theta_hat[_A]), 1.96 * se_a)  # the profile grid's unit, fitting units
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
    a_bounds = (shift + unit * lower[_A], shift + unit * upper[_A])
    reason = _unidentified_reason(x, y, A, B, C_mid, R0, n_free, width, how, max_ci_width, tss, a_bounds, A_lo, A_hi)
    # The bootstrap resamples around the fitted bend; on data that has not bent, other asymptotes fit too.
    if not reason and not alt_tested:
        a_alt = profile.not_rejected(alt_offset)
    if not reason and a_alt is not None:
        reason = (f"the data fit as well with A = {shift + unit * a_alt:.4g} "
                  f"(profile likelihood, 95%): the asymptote is not pinned down")
    return SigmoidFit(A=float(A), B=float(B), C_mid=float(C_mid), R0=float(R0), rss=rss, r2=r2,
                      A_lo=A_lo, A_hi=A_hi, n_points=len(y), identified=not reason, reason=reason,
                      samples=samples, A_upper=float(A_upper), noise=used, rho=float(rho))


def _clean(compute, reward, min_compute, bounded) -> tuple[np.ndarray, np.ndarray]:
    # Drops what cannot be fitted (non-finite, negative or below-cut-off compute), then checks what is left.
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
        raise FitError(f"need at least 3 points with finite compute >= {min_compute:g} and finite reward, "
                       f"got {len(x)}")
    distinct = np.unique(x)
    if len(distinct) < 3 or np.count_nonzero(distinct > 0) < 2:
        raise FitError(f"need at least 3 distinct compute values (2 of them > 0), got {len(distinct)}")
    tiny = np.finfo(float).tiny
    if np.any((x > 0) & (x < tiny)):
        raise FitError(f"compute values below {tiny:.3g} (subnormal floats) have lost their precision: "
                       "rescale compute")
    if bounded and (y.min() < 0 or y.max() > 1):
        raise FitError(f"reward outside [0, 1] (min {y.min():g}, max {y.max():g}): "
                       "fit metrics not in [0, 1] unbounded (rlscale fit --unbounded; bounded=False in the API)")
    return x, y


def _log_compute(x) -> tuple[np.ndarray, float]:
    # (ln C - center, center), center the mean ln C of positive compute: the fit's scale is the data's own.
    with np.errstate(divide="ignore"):
        log_x = np.log(x)
    center = float(np.mean(log_x[x > 0]))
    return log_x - center, center


def _standard_units(y) -> tuple[float, float]:
    # (shift, unit) so (y - shift) / unit has mean 0 and sd 1; scaled first so huge values do not overflow.
    size = float(np.max(np.abs(y))) or 1.0
    shift = size * float(np.mean(y / size))
    unit = size * float(np.std(y / size))
    return shift, (unit if unit > 0 and np.isfinite(unit) else size)


def _bounds(u, center, bounded) -> tuple[np.ndarray, np.ndarray]:
    # C_mid may sit well outside the data (that is what "not identified" looks like), but not anywhere.
    pos = u[np.isfinite(u)]
    lo, hi = pos.min(), pos.max()
    span = hi - lo
    reward_lo, reward_hi = (0.0, 1.0) if bounded else (-np.inf, np.inf)
    # C_mid = exp(center + ln C_mid / G) stays a positive, finite float, and may always reach the data.
    cmid_lo = max(lo - 3 * span, min(_LOG_CMID_RANGE[0] - center, lo))
    cmid_hi = min(hi + 3 * span, max(_LOG_CMID_RANGE[1] - center, hi))
    lower = np.array([reward_lo, np.log(1e-3 / span), cmid_lo, reward_lo])
    upper = np.array([reward_hi, np.log(1e4 / span), cmid_hi, reward_hi])
    return lower, upper


def _shape_grid(u, cmid_spans, n_cmid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A (12 B x n_cmid ln C_mid) grid of curve shapes: B and ln C_mid as (12, n_cmid) arrays and the sigmoid
    fraction expit(B (u - ln C_mid)) at every point, (12 * n_cmid, n). ln C_mid runs over `cmid_spans` (lo, hi)
    in units of the data's log-compute span from its smallest value, so the grid is the same for any unit."""
    pos = u[np.isfinite(u)]
    lo, span = pos.min(), pos.max() - pos.min()
    B = _GRID_B / span
    log_cmid = lo + _cmid_fractions(*cmid_spans, n_cmid) * span
    bb, mm = np.repeat(B[:, None], n_cmid, axis=1), np.repeat(log_cmid[None, :], B.size, axis=0)
    return bb, mm, expit(bb.ravel()[:, None] * (u[None, :] - mm.ravel()[:, None]))


_GRID_B = np.geomspace(0.3, 100.0, 12)  # the shape grids' B, in units of 1 / the data's log-compute span


@lru_cache(maxsize=8)
def _cmid_fractions(lo, hi, n) -> np.ndarray:
    fractions = np.linspace(lo, hi, n)
    fractions.flags.writeable = False  # shared between calls
    return fractions


def _grid_starts(u, y, r0, bounded, n_starts=3) -> np.ndarray:
    """Start rows (<= n_starts, 4): local minima of the RSS over a (B, ln C_mid) grid with A, R0 solved exactly."""
    bb, mm, s = _shape_grid(u, (-0.5, 2.5), 25)
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


# Offsets from the estimate at which the profile interval tests A, in units of the interval's scale on that side
# (the bootstrap's half-width, at least the asymptotic 95% half-width), then on by factors of _PROFILE_GROWTH up
# to A's bound: the crossing is interpolated between the last value not rejected and the next.
_PROFILE_OFFSETS = np.array([0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0])
_PROFILE_GROWTH = 1.5


@dataclass(frozen=True)
class _Profile:
    """A fit's likelihood profile in A (fitting units): the F statistic (1, dof) of the best fit with A held at a
    value, every other free parameter refitted, against the fit. sigma2: the noise variance of the weighted
    residuals, widened for their autocorrelation."""

    model: object
    theta_hat: np.ndarray
    cost_hat: float
    sigma2: float
    u: np.ndarray
    y: np.ndarray
    sqrt_w: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    free: np.ndarray

    @property
    def dof(self) -> int:
        return len(self.y) - int(self.free.sum())

    def testable(self) -> bool:
        """Whether there is a noise scale to test against (an exact fit, e.g. every reward 0 so far, has none:
        a higher A reached later fits it as exactly)."""
        return self._testable

    @cached_property
    def _testable(self) -> bool:
        return self.dof > 0 and self.sigma2 > 1e-20 * float(np.mean((self.sqrt_w * self.y) ** 2))

    @cached_property
    def _shapes(self) -> tuple:
        # the start search's grid and its sums over the points: the same for every A tested
        return _shape_sums(self.u, self.y, self.sqrt_w)

    def statistic(self, a, **solver) -> np.ndarray:
        """F statistic at each A in `a`; each fit from two starts (a grid's best shape and the fit's own)."""
        t = self.theta_hat
        starts = np.concatenate([_fixed_a_starts(a, self._shapes, t, self.lower, self.upper, self.free[_R0]),
                                 np.column_stack([a, np.tile(t[1:], (len(a), 1))])])
        _, cost = levenberg_marquardt(self.model, starts, self.y, self.sqrt_w, self.lower, self.upper,
                                      self.free & (np.arange(N_PARAMS) != _A), **solver)
        return (np.minimum(cost[:len(a)], cost[len(a):]) - self.cost_hat) / self.sigma2

    def bound(self, level, side=1, scale=None) -> float:
        """One-sided `level` bound on A, above the estimate for side=1 and below it for side=-1: the farthest A
        the F test does not reject. Tested on a grid from the estimate out to A's bound (denser near the
        estimate; with `scale`, at _PROFILE_OFFSETS x scale, then the bound) and interpolated after the last
        value not rejected, so a local minimum missed at one A cannot make the bound too tight. Returns A's bound
        on that side (1 or 0 for pass rates, +-inf for unbounded metrics) when no value up to it is rejected or
        there is no noise scale to test against; with `scale` (an interval's end) never an infinite one: the
        search's end, 10 x the data's range from the estimate, stands for "not bounded" there."""
        return self.bounds(level, [(side, scale)])[0][0]

    def bounds(self, level, requests, offset=None) -> tuple[list[float], float | None]:
        """`bound(level, side, scale)` for each (side, scale) in `requests`, and `not_rejected(offset)` when an
        offset is given (else None), from as few batched solves as their solver settings allow: the interval's two
        ends and the identification test together. An A value whose cost floor (_cost_floor) the test already
        rejects is not solved unless a crossing interpolates to it: the floor's statistic stands for it."""
        plans = [self._bound_grid(level, side, scale) for side, scale in requests]
        tests = [(a, critical, solver, True) for a, _, critical, solver in
                 (plan for plan in plans if not isinstance(plan, float))]
        alt = self._alternatives(offset) if offset is not None else None
        if alt is not None:
            tests.append((alt, _f_quantile(0.95, self.dof), _TEST_SOLVER, False))
        statistics = [(self._cost_floor(a) * (1.0 - 1e-9) - self.cost_hat) / self.sigma2 for a, *_ in tests]
        solved = [np.zeros(len(a), dtype=bool) for a, *_ in tests]
        # The values the floor does not reject (margins for rounding in the floor and the solver's costs) ...
        self._solve(tests, statistics, solved, [statistic < critical * (1.0 + 1e-9)
                                                for statistic, (_, critical, *_) in zip(statistics, tests)])
        # ... then the one each crossing interpolates to, where the floor stood for it
        self._solve(tests, statistics, solved, [_crossing_row(statistic, critical) if crossing else None
                                                for statistic, (_, critical, _, crossing) in zip(statistics, tests)])
        ends = [plan if isinstance(plan, float) else _crossing(plan[0], statistics.pop(0), plan[2], plan[1],
                                                               self.theta_hat[_A]) for plan in plans]
        a_alt = None
        if alt is not None:
            kept = np.flatnonzero(np.isfinite(statistics[0]) & (statistics[0] < tests[-1][1]))
            a_alt = float(alt[kept[0]]) if kept.size else None
        return ends, a_alt

    def _solve(self, tests, statistics, solved, wanted) -> None:
        # F statistics of the `wanted` A values (a mask or index per test, None for none) not yet solved, written
        # into `statistics`; one batched solve per solver setting
        for solver in {tuple(test[2].items()) for test in tests}:
            rows = []
            for i, test in enumerate(tests):
                mask = np.zeros(len(test[0]), dtype=bool)
                if tuple(test[2].items()) == solver and wanted[i] is not None:
                    mask[wanted[i]] = True
                rows.append(mask & ~solved[i])
            if not any(mask.any() for mask in rows):
                continue
            values = self.statistic(np.concatenate([test[0][mask] for test, mask in zip(tests, rows)]), **dict(solver))
            for i, mask in enumerate(rows):
                statistics[i][mask], values = values[:mask.sum()], values[mask.sum():]
                solved[i] |= mask

    @cached_property
    def _monotone_fits(self) -> tuple[np.ndarray, np.ndarray]:
        # the best non-decreasing and non-increasing sequences through the rewards (weighted least squares)
        w = self.sqrt_w**2
        return (isotonic_regression(self.y, weights=w).x, isotonic_regression(self.y, weights=w, increasing=False).x)

    def _cost_floor(self, a) -> np.ndarray:
        """A lower bound on the weighted RSS of every curve with A held at each value of `a`. At the points (in
        compute order) such a curve runs monotonically from R0 toward A: non-decreasing and at most A when A >= R0,
        non-increasing and at least A when not. The best sequence of either kind is the isotonic regression of the
        rewards clipped at A, so no curve with that A fits better than the better of the two."""
        rising, falling = self._monotone_fits
        w = self.sqrt_w**2
        a = np.asarray(a, dtype=float)[:, None]
        return np.minimum((np.minimum(rising, a) - self.y) ** 2 @ w, (np.maximum(falling, a) - self.y) ** 2 @ w)

    def _bound_grid(self, level, side, scale):
        """The A values `bound` tests: (a, the bound when none is rejected, F critical value, solver settings),
        or the bound itself (a float) when nothing needs testing."""
        t = self.theta_hat
        edge = float(self.upper[_A] if side > 0 else self.lower[_A])
        if not (0.5 < level < 1.0 and self.testable()):
            return edge
        critical = _f_quantile(2.0 * level - 1.0, self.dof)  # two-sided F quantile = one-sided test
        end = edge if np.isfinite(edge) else t[_A] + side * 10.0 * (abs(t[_A] - t[_R0]) + np.ptp(self.y))
        if not side * (end - t[_A]) > 0:
            return float(end)
        if scale is None:
            return t[_A] + (end - t[_A]) * np.linspace(0.0, 1.0, 49)[1:] ** 2, edge, critical, {}
        # an interval's end, not an estimate: a looser solve
        reach = abs(end - t[_A]) / scale
        offsets = _PROFILE_OFFSETS
        if reach > offsets[-1]:
            offsets = np.append(offsets, offsets[-1] * _PROFILE_GROWTH ** np.arange(1, np.ceil(np.log(
                reach / offsets[-1]) / np.log(_PROFILE_GROWTH))))
        a = t[_A] + side * scale * offsets
        return np.append(a[side * (end - a) > 0], end), float(end), critical, _TEST_SOLVER

    def not_rejected(self, offset) -> float | None:
        """The first of A = A_hat + offset, A_hat - offset (kept within A's bounds) that the F test at 95% does
        not reject; None when both are rejected (or there is no noise scale, or A_hat +- offset lies beyond A's
        bounds on both sides)."""
        return self.bounds(0.95, [], offset)[1]

    def _alternatives(self, offset) -> np.ndarray | None:
        # the A values not_rejected tests, None when there are none
        t = self.theta_hat
        if not self.testable():
            return None
        a = np.clip(t[_A] + np.array([offset, -offset]), self.lower[_A], self.upper[_A])
        a = a[np.abs(a - t[_A]) > 0.5 * offset]  # A's bound itself is tested by the bound rule
        return a if a.size else None


# A profile test at an interval's end or at 95%, not an estimate: a looser solve than the fit's.
_TEST_SOLVER = {"max_iter": 40, "xtol": 1e-6}


def _crossing_row(statistic, critical) -> int | None:
    """The index whose exact value _crossing interpolates to besides the last one not rejected: the next one, or
    the first when none is kept; None when the crossing needs none (nothing up to the end is rejected)."""
    kept = np.flatnonzero(~(np.isfinite(statistic) & (statistic >= critical)))
    if kept.size == 0:
        return 0
    return int(kept[-1]) + 1 if kept[-1] < len(statistic) - 1 else None


def _crossing(a, statistic, critical, edge, a_hat) -> float:
    """Where the F statistic, tested at the A values `a` (moving away from the estimate `a_hat`), crosses
    `critical` after the last value not rejected; `edge` when none up to the last is rejected."""
    kept = np.flatnonzero(~(np.isfinite(statistic) & (statistic >= critical)))  # a failed fit: not rejected
    if kept.size == 0:
        return float(a_hat + (a[0] - a_hat) * min(1.0, critical / max(statistic[0], 1e-300)))
    last = kept[-1]
    if last == len(a) - 1:
        return edge  # nothing up to `end` rejected: for unbounded metrics not even `end` bounds A
    s0 = max(statistic[last], 0.0) if np.isfinite(statistic[last]) else 0.0  # a failed fit: taken as 0
    s1 = statistic[last + 1]
    return float(a[last] + (a[last + 1] - a[last]) * (critical - s0) / max(s1 - s0, 1e-300))


@lru_cache(maxsize=1024)
def _f_quantile(q: float, dof: int) -> float:
    """The q quantile of the F(1, dof) distribution (scipy's ppf costs ~0.2 ms a call; fits ask for few values)."""
    return float(stats.f.ppf(q, 1, dof))


def _shape_sums(u, y, sqrt_w) -> tuple:
    """(B, ln C_mid, c, w_rr, w_ss, w_rs, w_ry, w_sy, w_yy) of the fixed-A start grid: the grid's shapes s, and the
    weighted sums over the points that give each (A, shape)'s RSS, with rewards measured from c (see below)."""
    # C_mid beyond the data too: a higher asymptote reached later is exactly what the bound must consider
    bb, mm, s = _shape_grid(u, (-0.5, 4.0), 30)
    w = sqrt_w**2
    # The residual R0 (1 - s) + A s - y is unchanged when R0, A and y all move by c (the weighted mean reward):
    # the sums below stay small. Each (A, shape)'s weighted RSS comes from six weighted sums over the points, so
    # memory grows with len(a) x shapes, not also with the points.
    c = float(w @ y / w.sum())
    yc, rest = y - c, 1.0 - s
    w_rr, w_ss, w_rs = (np.einsum("n,gn,gn->g", w, p, q) for p, q in ((rest, rest), (s, s), (rest, s)))
    return bb.ravel(), mm.ravel(), c, w_rr, w_ss, w_rs, rest @ (w * yc), s @ (w * yc), float(w @ yc**2)


def _fixed_a_starts(a, shapes, theta_hat, lower, upper, r0_free) -> np.ndarray:
    """Start rows (len(a), 4) for fits with A fixed at each value of `a`: the best (B, ln C_mid) of the grid in
    `shapes` (_shape_sums), R0 solved exactly by weighted least squares (or kept at the fit's R0 when it is fixed)."""
    bb, mm, c, w_rr, w_ss, w_rs, w_ry, w_sy, w_yy = shapes
    ac = (a - c)[:, None]
    if r0_free:
        R0 = c + (w_ry[None, :] - ac * w_rs[None, :]) / np.maximum(w_rr, 1e-300)[None, :]
        R0 = np.clip(R0, lower[_R0], upper[_R0])
    else:
        R0 = np.full((len(a), len(bb)), theta_hat[_R0])
    r0c = R0 - c
    rss = r0c**2 * w_rr + ac**2 * w_ss + w_yy + 2.0 * r0c * ac * w_rs - 2.0 * r0c * w_ry - 2.0 * ac * w_sy
    best = np.argmin(rss, axis=1)
    starts = np.column_stack([a, np.log(bb[best]), mm[best], R0[np.arange(len(a)), best]])
    return np.minimum(np.maximum(starts, lower), upper)


def _noise_sqrt_weights(noise, mean) -> np.ndarray:
    # 1 / sd of each reward under `noise`, at the fitted (natural-unit) mean; scaled to mean 1, as only
    # relative weights matter and costs stay O(rss).
    variance = _noise_variance(noise, mean)
    sqrt_w = 1.0 / np.sqrt(variance)
    return sqrt_w / sqrt_w.mean()


def _noise_variance(noise, mean) -> np.ndarray:
    # Variance of a reward around `mean` under `noise`, up to a common factor; floored, never 0.
    if noise == "binomial":
        return np.maximum(mean * (1.0 - mean), _VARIANCE_FLOOR)
    if noise == "multiplicative":
        size = float(np.max(np.abs(mean)))  # in units of the largest |mean|, so huge metrics do not overflow
        relative = mean / size if size > 0 and np.isfinite(size) else np.ones_like(mean)
        return np.maximum(relative**2, _RELATIVE_SD_FLOOR**2)
    return np.ones_like(mean)


def _likeliest_noise(y, mean, bounded) -> str:
    """The noise model of highest Gaussian likelihood for rewards `y` around `mean`, its scale profiled out:
    -n/2 ln(mean(r^2 / v)) - 1/2 sum(ln v) for variance v = scale * v(mean). Constant on an exact fit."""
    resid = y - mean
    if not float(np.max(np.abs(resid))) > 1e-12 * max(float(np.max(np.abs(y))), 1e-300):
        return "constant"
    best, best_ll = "constant", -np.inf
    for noise in ("constant", "binomial", "multiplicative") if bounded else ("constant", "multiplicative"):
        variance = _noise_variance(noise, mean)
        ll = -0.5 * len(y) * np.log(np.mean(resid**2 / variance)) - 0.5 * np.sum(np.log(variance))
        if ll > best_ll:
            best, best_ll = noise, ll
    return best


def _autocorrelation_inflation(resid, jac) -> tuple[float, float]:
    """(rho, inflation): the lag-1 autocorrelation of the noise behind weighted residuals `resid` (compute order)
    of a fit with weighted Jacobian `jac` (n, p), and the factor by which that noise multiplies the variance of A's
    (linearised) estimate over independent noise of the same size.

    Two models of the noise, the larger factor taken: AR(1) with coefficient rho, and evaluation noise plus training
    drift, independent noise with an AR(1) part of coefficient phi and share c of the variance (correlation c phi^l at
    lag l >= 1: slower to fade than AR(1) with the same lag-1 value, as on long real runs, whose policy wanders on its
    plateau). AR(1) matches the residuals' lag-1 autocorrelation; the mixture matches lags 1 and 2. Expectations are
    those of residuals r = (I - P) e, P the fit's projection: a fit takes out slow noise and with it part of the
    residuals' autocorrelation, so the raw values would be biased low. rho is kept in [0, _MAX_RHO], (0, 1) for
    independent noise, as intervals are only ever widened by it."""
    n, p = jac.shape
    denominator = float(resid @ resid)
    if n < 2 * p or not denominator > 0:
        return 0.0, 1.0
    observed = np.array([float(resid[lag:] @ resid[:-lag]) / denominator for lag in (1, 2)])
    q, _ = np.linalg.qr(jac)  # orthonormal basis of what the fit can absorb
    lag_q = np.stack([_lag_times(q, lag) for lag in (1, 2)])  # L q, L the symmetric lag-1 and lag-2 forms
    qlq = np.einsum("np,lnq->lpq", q, lag_q)
    independent = -np.einsum("lpp->l", qlq) / (n - p)  # expected lag-1 and lag-2 ratios under independent noise
    if observed[0] <= independent[0]:  # not above what independent noise gives: no carry-over
        return 0.0, 1.0
    phis = np.linspace(0.0, _MAX_RHO, 19)
    sigma_q = np.stack([_ar1_times(q, phi) for phi in phis])  # Sigma_phi q, Sigma_phi[i, j] = phi^|i-j|
    qsq = np.einsum("np,knq->kpq", q, sigma_q)
    # E[r' L r] and E[r' r] under AR(1) noise of coefficient phi, for each phi on the grid
    lagged = np.stack([(n - lag) * phis**lag for lag in (1, 2)]) - 2.0 * np.einsum("lnp,knp->lk", lag_q, sigma_q) \
        + np.einsum("lpq,kqp->lk", qlq, qsq)
    total = n - np.einsum("kpp->k", qsq)
    rho = float(np.interp(observed[0], lagged[0] / total, phis))  # AR(1): the expected lag-1 ratio rises with rho
    if rho <= 0.0:
        return 0.0, 1.0
    row = np.linalg.pinv(jac)[_A]  # A's estimate is this combination of the rewards (the least-squares map's row)
    plain = float(row @ row)
    inflation = max(float(row @ _ar1_times(row, rho)), plain) / plain
    # Noise plus drift: for each phi, the share c that matches lag 1 (the ratio is linear-fractional in c), then the
    # phi whose lag-2 ratio comes closest; c in (0, 1].
    lagged_white = independent * (n - p)
    with np.errstate(all="ignore"):
        c = (observed[0] * (n - p) - lagged_white[0]) / (lagged[0] - lagged_white[0] - observed[0] * (total - (n - p)))
        lag2 = ((1 - c) * lagged_white[1] + c * lagged[1]) / ((1 - c) * (n - p) + c * total)
    valid = (phis > 0) & (c > 0) & (c <= 1) & np.isfinite(lag2)
    # Only where lag 2 says so: its autocorrelation above what AR(1) at rho gives by more than 1.645 sd (Bartlett's
    # variance of a sample autocorrelation at lag 2 under AR(1)); else AR(1) alone, as the mixture's two parameters
    # from two noisy lags would widen intervals at random.
    expected_lag2 = float(np.interp(rho, phis, lagged[1] / total))
    sd_lag2 = np.sqrt(((1 + rho**2) ** 2 - 4 * rho**4) / n)
    if valid.any() and observed[1] - expected_lag2 > _LAG2_EVIDENCE * sd_lag2:
        best = np.flatnonzero(valid)[np.argmin(np.abs(lag2[valid] - observed[1]))]
        mixed = (1 - c[best]) * plain + c[best] * float(row @ _ar1_times(row, phis[best]))
        inflation = max(inflation, mixed / plain)
    return rho, float(inflation)


def _lag_times(v, lag) -> np.ndarray:
    # L v for the symmetric lag form L[i, i + lag] = L[i + lag, i] = 1/2 (v' L v = sum v_t v_t+lag), v (n, p).
    out = np.zeros_like(v)
    out[:-lag] += 0.5 * v[lag:]
    out[lag:] += 0.5 * v[:-lag]
    return out


def _ar1_times(v, rho) -> np.ndarray:
    # Sigma v for the AR(1) correlation matrix Sigma[i, j] = rho^|i - j|, in O(n): two recursive filters.
    forward = signal.lfilter([1.0], [1.0, -rho], v, axis=0)
    backward = signal.lfilter([1.0], [1.0, -rho], v[::-1], axis=0)[::-1]
    return forward + backward - v


def _standard_error_a(jac, resid_w, dof) -> float:
    # Asymptotic (Jacobian) standard error of A, used for identification when no bootstrap is run.
    if dof <= 0:
        return float("inf")
    sigma2 = float(resid_w @ resid_w) / dof
    try:
        cov = np.linalg.pinv(jac.T @ jac) * sigma2
    except np.linalg.LinAlgError:
        return float("inf")
    se = float(np.sqrt(cov[_A, _A])) if cov[_A, _A] >= 0 else float("inf")
    return se if np.isfinite(se) else float("inf")


def _natural(theta, shift, unit, center) -> np.ndarray:
    # (A, ln B, ln C_mid / G, R0) in fitting units -> (A, B, C_mid, R0) in the caller's units.
    theta = np.atleast_2d(theta)
    return np.column_stack([shift + unit * theta[:, _A], np.exp(theta[:, _LOG_B]),
                            np.exp(theta[:, _LOG_CMID] + center), shift + unit * theta[:, _R0]])


def _unidentified_reason(x, y, A, B, C_mid, R0, n_free, width, how, max_ci_width, tss, a_bounds, A_lo, A_hi) -> str:
    reasons = []
    if len(y) < 2 * n_free:
        # A few points are fitted almost exactly by some bend, and resamples of them agree with it.
        reasons.append(f"{len(y)} points for {n_free} parameters (at least {2 * n_free} needed; no interval below that)")
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
        reasons.append(f"the rise is too sharp for the data: {rising.size} compute values between 10% and 90% "
                       f"of the gain (at least {_MIN_POINTS_IN_RISE} needed)")
    if not width <= max_ci_width:
        reasons.append(f"{how} on A is too wide ({width:.3g} > {max_ci_width:g})")
    for bound in a_bounds:
        if not np.isfinite(bound):
            continue
        if abs(A - bound) <= _AT_BOUND:
            reasons.append(f"A sits at its bound {bound:g}")
        elif np.isfinite(A_lo) and min(abs(A_lo - bound), abs(A_hi - bound)) <= _AT_BOUND:
            reasons.append(f"{how} on A touches A's bound {bound:g}")
    return "; ".join(reasons)
