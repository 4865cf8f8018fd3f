"""Power law across model sizes (Tan et al. 2025): log L = -k(N) log X + E(N), k(N) = K_max / (1 + N0 / N), with
L = 1 - pass@1, X the resource; a line per size, then K_max, N0 and E(N) linear in ln N for sizes not trained."""

from dataclasses import dataclass

import numpy as np
from rlscale.fitting.sigmoid import FitError
from scipy.optimize import least_squares


def learning_efficiency(model_size, K_max, N0) -> np.ndarray:
    """k(N) = K_max / (1 + N0 / N): the log-log slope of loss against the resource at model size N."""
    model_size = np.asarray(model_size, dtype=float)
    return K_max / (1.0 + N0 / model_size)


@dataclass(frozen=True)
class PowerLawFit:
    """K_max, N0 across sizes and the per-size (k, E) they were fitted from (arrays aligned with `sizes`)."""

    K_max: float
    N0: float
    sizes: np.ndarray
    k: np.ndarray
    E: np.ndarray
    E_intercept: float = float("nan")  # E(N) = E_intercept + E_slope ln N across the fitted sizes
    E_slope: float = float("nan")

    def loss(self, model_size, resource) -> np.ndarray:
        """Predicted L = 1 - pass@1 at a fitted model size and resource X: exp(-k(N) log X + E(N))."""
        model_size = np.asarray(model_size, dtype=float)
        known = np.isin(model_size, self.sizes)
        if not np.all(known):
            raise ValueError(f"E(N) is only known at the fitted sizes {self.sizes.tolist()}")
        E = self.E[np.searchsorted(self.sizes, model_size)]
        return np.exp(-learning_efficiency(model_size, self.K_max, self.N0) * np.log(resource) + E)

    def pass_rate(self, model_size, resource) -> np.ndarray:
        """Predicted pass@1 = 1 - L."""
        return 1.0 - self.loss(model_size, resource)

    def extrapolated_loss(self, model_size, resource) -> np.ndarray:
        """L at any size N, fitted or not: k(N) from K_max and N0, E(N) from its line in ln N."""
        model_size = np.asarray(model_size, dtype=float)
        E = self.E_intercept + self.E_slope * np.log(model_size)
        return np.exp(-learning_efficiency(model_size, self.K_max, self.N0) * np.log(resource) + E)


def fit_size(resource, loss) -> tuple[float, float]:
    """(k, E) for one model size: least-squares line log L = -k log X + E over points with X > 0, 0 < L."""
    x = np.asarray(resource, dtype=float).ravel()
    y = np.asarray(loss, dtype=float).ravel()
    if x.shape != y.shape:
        raise FitError(f"resource and loss differ in length: {x.size} vs {y.size}")
    keep = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    if len(np.unique(x[keep])) < 2:
        raise FitError(f"need at least 2 distinct resource values with loss > 0, got {len(np.unique(x[keep]))}")
    slope, intercept = np.polyfit(np.log(x[keep]), np.log(y[keep]), 1)
    return float(-slope), float(intercept)


def fit_power_law(model_size, resource, pass_rate) -> PowerLawFit:
    """Tan et al. power law from (N, X, pass@1) records: per-size (k, E), then K_max and N0 (units of N)."""
    n = np.asarray(model_size, dtype=float).ravel()
    x = np.asarray(resource, dtype=float).ravel()
    p = np.asarray(pass_rate, dtype=float).ravel()
    if not n.shape == x.shape == p.shape:
        raise FitError(f"model_size, resource and pass_rate differ in length: {n.size}, {x.size}, {p.size}")
    sizes = np.unique(n[np.isfinite(n) & (n > 0)])
    if len(sizes) < 2:
        raise FitError(f"need at least 2 model sizes to fit K_max and N0, got {len(sizes)}")
    per_size = [fit_size(x[n == size], 1.0 - p[n == size]) for size in sizes]
    return fit_across_sizes(sizes, np.array([ke[0] for ke in per_size]), np.array([ke[1] for ke in per_size]))


def fit_across_sizes(sizes, k, E) -> PowerLawFit:
    """K_max, N0 and the line of E(N) from per-size lines (k, E) at ascending `sizes`; FitError if a k <= 0."""
    sizes, k, E = (np.asarray(v, dtype=float) for v in (sizes, k, E))
    if np.any(k <= 0):
        raise FitError(f"loss does not fall with the resource at sizes {sizes[k <= 0].tolist()} (k <= 0)")
    # Linear start from 1/k = 1/K_max + (N0/K_max) (1/N), then least squares on k in log N0.
    slope, intercept = np.polyfit(1.0 / sizes, 1.0 / k, 1)
    K0 = 1.0 / intercept if intercept > 0 else k.max()
    N00 = slope * K0 if slope > 0 else sizes.min()
    result = least_squares(
        lambda t: learning_efficiency(sizes, t[0], np.exp(t[1])) - k,
        x0=[K0, np.log(N00)],
        bounds=([0.0, -np.inf], [np.inf, np.inf]),
        x_scale="jac",
        xtol=1e-14,
        ftol=1e-14,
        gtol=1e-14,
    )
    E_slope, E_intercept = np.polyfit(np.log(sizes), E, 1)
    return PowerLawFit(
        K_max=float(result.x[0]),
        N0=float(np.exp(result.x[1])),
        sizes=sizes,
        k=k,
        E=E,
        E_intercept=float(E_intercept),
        E_slope=float(E_slope),
    )


def crossover_resource(k_small: float, E_small: float, k_large: float, E_large: float) -> float:
    """The resource X at which two sizes' losses are equal: ln X = (E_large - E_small) / (k_large - k_small);
    NaN for parallel lines. At equal compute X is the compute, so this is the crossover budget."""
    if k_large == k_small:
        return float("nan")
    return float(np.exp((E_large - E_small) / (k_large - k_small)))
