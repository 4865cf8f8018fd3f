"""Bootstrap resamples for curve fits and percentile intervals from the refitted draws."""

import numpy as np


def wild_resamples(fitted, resid_w, sqrt_w, jac_w, n_resamples: int, seed: int = 0) -> np.ndarray:
    """Resampled rewards (n_resamples, n_points): fitted curve + sign-flipped, leverage-corrected weighted residuals;
    wild, so each point keeps its own (heteroscedastic pass-rate) noise level without assuming its form."""
    # Residuals shrink by sqrt(1 - leverage) at the fit; undo it so intervals are not too narrow (HC3-style).
    leverage = np.einsum("np,pq,nq->n", jac_w, np.linalg.pinv(jac_w.T @ jac_w), jac_w)
    adjusted = resid_w / np.sqrt(1.0 - np.clip(leverage, 0.0, 0.9))
    rng = np.random.default_rng(seed)
    signs = rng.choice(np.array([-1.0, 1.0]), size=(n_resamples, len(fitted)))  # Rademacher
    return fitted + signs * (adjusted / sqrt_w)


def percentile_interval(values, level: float = 0.95, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Central `level` percentile interval (lo, hi) of `values` along `axis`, ignoring NaN draws."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    tail = (1.0 - level) / 2.0
    values = np.asarray(values, dtype=float)
    # nanquantile takes a slow path row by row; without NaN, quantile gives the same values at once
    quantile = np.nanquantile if np.isnan(values).any() else np.quantile
    lo, hi = quantile(values, [tail, 1.0 - tail], axis=axis)
    return lo, hi
