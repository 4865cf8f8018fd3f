"""A batched Levenberg-Marquardt least-squares solver in numpy (lmfit's minimizer.py): many problems of the same
size solved together in one loop, so a fit's grid of start points and its bootstrap resamples cost one solve each."""

import numpy as np


def levenberg_marquardt(model, theta0, y, sqrt_w, lower, upper, free, *, max_iter=200, xtol=1e-10):
    """Least-squares parameters (k, p) and costs (k,) for k problems; `model(theta) -> (f (k, n), J (k, n, p))` must
    return new arrays (weighted in place). Bounds kept by projection with an active set; `free` (p,): what moves."""
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
    # Only rows still moving are carried on, so a batch of mostly stopped rows costs what its few slow rows cost.
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
            diag = hess.reshape(k, p * p)[:, :: p + 1]  # a view: writing to it writes hess's diagonal
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
