"""Noise models of a reward around its fitted curve (constant, binomial R(1 - R), multiplicative R^2, or "auto"), and
the widening of intervals that correlated noise calls for."""

import numpy as np
from rlscale.fitting.sigmoid.curve import THETA_A
from scipy import signal

NOISE_MODELS = ("auto", "binomial", "constant", "multiplicative")
# Pass-rate variance R(1-R)/k is floored so points near 0 or 1 do not get unbounded weight.
_VARIANCE_FLOOR = 0.01 * 0.99
# Multiplicative noise: sd floored at this fraction of the largest fitted |R|, for the same reason.
_RELATIVE_SD_FLOOR = 0.05
# Largest AR(1) coefficient of the noise used to widen intervals.
_MAX_RHO = 0.9
# One-sided z (5%) by which the residuals' lag-2 autocorrelation must exceed AR(1)'s for the noise-plus-drift model.
_LAG2_EVIDENCE = 1.645


def noise_sqrt_weights(noise, mean) -> np.ndarray:
    # 1 / sd at the fitted (natural-unit) mean, scaled to mean 1: only relative weights matter and costs stay O(rss).
    variance = noise_variance(noise, mean)
    sqrt_w = 1.0 / np.sqrt(variance)
    return sqrt_w / sqrt_w.mean()


def noise_variance(noise, mean) -> np.ndarray:
    # Variance of a reward around `mean` under `noise`, up to a common factor; floored, never 0.
    if noise == "binomial":
        return np.maximum(mean * (1.0 - mean), _VARIANCE_FLOOR)
    if noise == "multiplicative":
        size = float(np.max(np.abs(mean)))  # in units of the largest |mean|, so huge metrics do not overflow
        relative = mean / size if size > 0 and np.isfinite(size) else np.ones_like(mean)
        return np.maximum(relative**2, _RELATIVE_SD_FLOOR**2)
    return np.ones_like(mean)


def likeliest_noise(y, mean, bounded) -> str:
    """The noise model of highest Gaussian likelihood for rewards `y` around `mean`, its scale profiled out:
    -n/2 ln(mean(r^2 / v)) - 1/2 sum(ln v) for variance v = scale * v(mean). Constant on an exact fit."""
    resid = y - mean
    if not float(np.max(np.abs(resid))) > 1e-12 * max(float(np.max(np.abs(y))), 1e-300):
        return "constant"
    best, best_ll = "constant", -np.inf
    for noise in ("constant", "binomial", "multiplicative") if bounded else ("constant", "multiplicative"):
        variance = noise_variance(noise, mean)
        ll = -0.5 * len(y) * np.log(np.mean(resid**2 / variance)) - 0.5 * np.sum(np.log(variance))
        if ll > best_ll:
            best, best_ll = noise, ll
    return best


def autocorrelation_inflation(resid, jac) -> tuple[float, float]:
    """(rho, inflation): the noise's lag-1 autocorrelation behind weighted residuals `resid` (compute order) of a fit
    with weighted Jacobian `jac`, and the factor (>= 1) it multiplies A's linearised variance by; (0, 1) for none."""
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
    lagged = (
        np.stack([(n - lag) * phis**lag for lag in (1, 2)])
        - 2.0 * np.einsum("lnp,knp->lk", lag_q, sigma_q)
        + np.einsum("lpq,kqp->lk", qlq, qsq)
    )
    total = n - np.einsum("kpp->k", qsq)
    rho = float(np.interp(observed[0], lagged[0] / total, phis))  # AR(1): the expected lag-1 ratio rises with rho
    if rho <= 0.0:
        return 0.0, 1.0
    row = np.linalg.pinv(jac)[THETA_A]  # A's estimate is this combination of the rewards (the least-squares map's row)
    plain = float(row @ row)
    inflation = max(float(row @ _ar1_times(row, rho)), plain) / plain
    # Noise plus drift: per phi the share c in (0, 1] matching lag 1, then the phi whose lag-2 ratio comes closest.
    lagged_white = independent * (n - p)
    with np.errstate(all="ignore"):
        c = (observed[0] * (n - p) - lagged_white[0]) / (lagged[0] - lagged_white[0] - observed[0] * (total - (n - p)))
        lag2 = ((1 - c) * lagged_white[1] + c * lagged[1]) / ((1 - c) * (n - p) + c * total)
    valid = (phis > 0) & (c > 0) & (c <= 1) & np.isfinite(lag2)
    # Only if lag 2 beats AR(1) by 1.645 Bartlett sd: two parameters from two noisy lags would widen at random.
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
