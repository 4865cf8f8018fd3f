"""The ScaleRL curve R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) as the fits see it (lmfit's model.py): theta = (A,
ln B, ln C_mid / G, R0) on u = ln(C / G), G the positive compute's geometric mean, so B, C_mid > 0 by construction."""

from functools import lru_cache

import numpy as np
from scipy.special import expit

N_PARAMS = 4
THETA_A, THETA_LOG_B, THETA_LOG_CMID, THETA_R0 = range(N_PARAMS)  # columns of theta
# C_mid is kept where exp() of its logarithm is a finite, normal float.
LOG_CMID_RANGE = (-708.0, 709.0)


def sigmoid(compute, A, B, C_mid, R0) -> np.ndarray:
    """Reward at `compute` (same unit as C_mid): R0 + (A - R0) / (1 + (C_mid / C)^B); R(0) = R0."""
    compute = np.asarray(compute, dtype=float)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        return R0 + (A - R0) / (1.0 + (C_mid / compute) ** B)


def curve_and_jacobian(theta: np.ndarray, log_compute: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Curve values (k, n) and Jacobian (k, n, 4) w.r.t. (A, ln B, ln C_mid, R0) for k parameter rows."""
    return curve_model(log_compute)(theta)


def curve_model(log_compute: np.ndarray):
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
        jac[..., THETA_A] = s
        np.multiply(gain_slope, z if at_zero is None else np.where(at_zero, 0.0, z), out=jac[..., THETA_LOG_B])
        np.multiply(gain_slope, -B, out=jac[..., THETA_LOG_CMID])
        jac[..., THETA_R0] = rest
        s *= gain
        s += R0
        return s, jac

    return model


def log_compute(x) -> tuple[np.ndarray, float]:
    # (ln C - center, center), center the mean ln C of positive compute: the fit's scale is the data's own.
    with np.errstate(divide="ignore"):
        log_x = np.log(x)
    center = float(np.mean(log_x[x > 0]))
    return log_x - center, center


def parameter_bounds(u, center, bounded) -> tuple[np.ndarray, np.ndarray]:
    # C_mid may sit well outside the data (that is what "not identified" looks like), but not anywhere.
    pos = u[np.isfinite(u)]
    lo, hi = pos.min(), pos.max()
    span = hi - lo
    reward_lo, reward_hi = (0.0, 1.0) if bounded else (-np.inf, np.inf)
    # C_mid = exp(center + ln C_mid / G) stays a positive, finite float, and may always reach the data.
    cmid_lo = max(lo - 3 * span, min(LOG_CMID_RANGE[0] - center, lo))
    cmid_hi = min(hi + 3 * span, max(LOG_CMID_RANGE[1] - center, hi))
    lower = np.array([reward_lo, np.log(1e-3 / span), cmid_lo, reward_lo])
    upper = np.array([reward_hi, np.log(1e4 / span), cmid_hi, reward_hi])
    return lower, upper


def shape_grid(u, cmid_spans, n_cmid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(B, ln C_mid, expit(B (u - ln C_mid)) per point) of a 12 x n_cmid shape grid, ln C_mid over `cmid_spans` in
    units of the data's log-compute span from its smallest value, so the grid is the same for any unit."""
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


def natural_parameters(theta, shift, unit, center) -> np.ndarray:
    # (A, ln B, ln C_mid / G, R0) in fitting units -> (A, B, C_mid, R0) in the caller's units.
    theta = np.atleast_2d(theta)
    return np.column_stack(
        [
            shift + unit * theta[:, THETA_A],
            np.exp(theta[:, THETA_LOG_B]),
            np.exp(theta[:, THETA_LOG_CMID] + center),
            shift + unit * theta[:, THETA_R0],
        ]
    )
