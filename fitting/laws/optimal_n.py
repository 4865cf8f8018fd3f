"""The optimal-n law (IsoCompute Playbook): log2 n*(C) = lo + (hi - lo) / (1 + exp(-k (ln C - c0))) fitted to the
frontier of per-run sigmoid fits; not identified while the frontier has not bent (too few n*, or n* still moving)."""

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from rlscale.fitting.rules.reasons import Reason
from rlscale.fitting.rules.standing import fitted_rewards
from rlscale.fitting.sigmoid.bootstrap import percentile_interval
from scipy.optimize import least_squares

MIN_DISTINCT_ROLLOUTS = 3  # n* values the frontier must visit before the law can be identified


def optimal_rollouts_law(compute, lo, hi, k, c0) -> np.ndarray:
    """log2 of the optimal rollouts per prompt at `compute` (same unit as the runs' compute)."""
    log_c = np.log(np.asarray(compute, dtype=float))
    return lo + (hi - lo) / (1.0 + np.exp(-k * (log_c - c0)))


@dataclass(frozen=True)
class RolloutsLaw:
    """A fitted optimal-n law, its frontier evidence, and bootstrap draws of (lo, hi, k, c0)."""

    lo: float
    hi: float
    k: float
    c0: float
    identified: bool
    verdict: Reason  # why the law is (code "law_identified") or is not identified, with the numbers
    compute_range: tuple[float, float]  # the compute the frontier was observed over
    frontier: pd.DataFrame = field(repr=False)  # compute, reward, rollouts, prompts_per_batch, run
    samples: np.ndarray | None = field(default=None, repr=False)  # (m, 4) law parameter draws

    def log2_rollouts(self, compute) -> np.ndarray:
        """log2 n*(C) from the point estimate."""
        return optimal_rollouts_law(compute, self.lo, self.hi, self.k, self.c0)

    def predict(self, compute) -> np.ndarray:
        """n*(C), rollouts per prompt (continuous; round to a power of two to use it)."""
        return 2.0 ** self.log2_rollouts(compute)

    def predict_interval(self, compute, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
        """(lo, hi) of n*(C) over the bootstrap draws; the point estimate twice when there are none."""
        if self.samples is None or len(self.samples) < 2:
            point = self.predict(compute)
            return point, point
        draws = np.stack([optimal_rollouts_law(compute, *row) for row in self.samples])
        lo, hi = percentile_interval(draws, level, axis=0)
        return 2.0**lo, 2.0**hi

    def extrapolation_factor(self, compute: float) -> float:
        """How far `compute` lies beyond the largest compute observed (1 = inside the data)."""
        return max(1.0, float(compute) / self.compute_range[1])

    def to_dict(self) -> dict:
        """Plain JSON-ready values (no frontier table, no draws)."""
        return {
            "lo": self.lo,
            "hi": self.hi,
            "k": self.k,
            "c0": self.c0,
            "n_low": 2.0**self.lo,
            "n_saturation": 2.0**self.hi,
            "identified": self.identified,
            "verdict": self.verdict.to_dict(),
            "compute_min": self.compute_range[0],
            "compute_max": self.compute_range[1],
            "frontier_rollouts": sorted({int(n) for n in self.frontier["rollouts"]}),
        }


def compute_grid(curves: pd.DataFrame, points: int = 60) -> np.ndarray:
    """A log grid over the compute the runs observed: from the smallest first point to the largest last point."""
    lo = float(curves["c_min"].min()) if "c_min" in curves else float(curves["C_mid"].min()) / 10.0
    hi = float(curves["c_max"].max()) if "c_max" in curves else float(curves["C_mid"].max()) * 10.0
    lo = max(lo, hi * 1e-6)
    return np.geomspace(lo, hi, points)


def frontier(curves: pd.DataFrame, grid: np.ndarray, min_progress: float = 0.1) -> pd.DataFrame:
    """Best fitted reward at each grid compute and the run (B_p, n) reaching it, each curve read only up to its c_max.
    Drops points where the leader made < `min_progress` of its gain (R0 noise decides) or that only one run reached."""
    params = curves[["A", "B", "C_mid", "R0"]].to_numpy(float)
    rewards = fitted_rewards(curves, grid)  # (runs, grid): each run read as every view reads it
    if "c_max" in curves:
        beyond = grid[None, :] > curves["c_max"].to_numpy(float)[:, None] * (1 + 1e-9)
        rewards = np.where(beyond, -np.inf, rewards)
    leader = np.argmax(rewards, axis=0)
    gain = params[leader, 0] - params[leader, 3]
    with np.errstate(divide="ignore", invalid="ignore"):
        progress = (rewards[leader, np.arange(grid.size)] - params[leader, 3]) / gain
    contested = np.isfinite(rewards).sum(axis=0) >= min(2, len(curves))
    keep = contested & (progress >= min_progress)
    best = np.argmax(rewards[:, keep], axis=0)
    rows = curves.iloc[best]
    return pd.DataFrame(
        {
            "compute": grid[keep],
            "reward": rewards[best, np.flatnonzero(keep)],
            "rollouts": rows["rollouts"].to_numpy(int),
            "prompts_per_batch": rows["prompts_per_batch"].to_numpy(int),
            "run": rows["run"].to_numpy(),
        }
    )


def fit_law(compute: np.ndarray, log2_n: np.ndarray, start: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """Least-squares (params, rss) of (lo, hi, k, c0) for log2 n*(C) on the frontier points; multi-start over (c0, k)
    unless `start` (a bootstrap refit's point estimate) is given."""
    log_c = np.log(compute)
    span = log_c[-1] - log_c[0] if len(log_c) > 1 else 1.0
    y_min, y_max = float(log2_n.min()), float(log2_n.max())
    # the plateau may sit a little beyond what was seen, never far: the bounds make "still rising" visible
    lower = [y_min - 2.0, y_min - 2.0, 0.05 / span, log_c[0] - span]
    upper = [y_max + 2.0, y_max + 2.0, 200.0 / span, log_c[-1] + span]

    def residual(theta):
        return optimal_rollouts_law(compute, *theta) - log2_n

    def jacobian(theta):  # analytic: the bootstrap refits it ~100 times, finite differences cost 5x the model
        lo, hi, k, c0 = theta
        s = 1.0 / (1.0 + np.exp(-k * (log_c - c0)))
        slope = (hi - lo) * s * (1.0 - s)
        return np.column_stack([1.0 - s, s, slope * (log_c - c0), -slope * k])

    best = None
    first, last = (
        float(np.mean(log2_n[: max(1, len(log2_n) // 5)])),
        float(np.mean(log2_n[-max(1, len(log2_n) // 5) :])),
    )
    if start is None:
        starts = [
            [first, last, k, c0]
            for c0 in np.linspace(log_c[0], log_c[-1], 5)
            for k in (2.0 / span, 8.0 / span, 30.0 / span)
        ]
    else:  # a bootstrap refit starts from the point estimate alone: its data are the estimate's, perturbed
        starts = [start]
    for theta0 in starts:
        theta0 = np.clip(theta0, np.add(lower, 1e-9), np.subtract(upper, 1e-9))
        sol = least_squares(residual, theta0, jac=jacobian, bounds=(lower, upper), method="trf")
        rss = float(np.sum(sol.fun**2))
        if best is None or rss < best[1] - 1e-12:
            best = (sol.x, rss)
    return best[0], best[1]


def _law_verdict(
    theta: np.ndarray, front: pd.DataFrame, *, min_distinct: int, plateau_tol: float, min_plateau: float
) -> tuple[bool, Reason]:
    distinct = sorted({int(n) for n in front["rollouts"]})
    c_lo, c_hi = float(front["compute"].iloc[0]), float(front["compute"].iloc[-1])
    if len(distinct) < min_distinct:
        return False, Reason(
            "frontier_few_n",
            {"rollouts": distinct, "compute_lo": c_lo, "compute_hi": c_hi, "min_distinct": min_distinct},
        )
    lo, hi, k, c0 = theta
    if hi < lo - 0.5:
        return False, Reason("n_falls", {"n_low": float(2**lo), "n_high": float(2**hi)})
    # saturation must be seen, not inferred: the last n* has to hold over a real stretch of the data
    log_c = np.log(front["compute"].to_numpy(float))
    last = front["rollouts"].to_numpy()
    start_last = log_c[np.flatnonzero(last != last[-1])[-1] + 1] if (last != last[-1]).any() else log_c[0]
    held = (log_c[-1] - start_last) / max(log_c[-1] - log_c[0], 1e-12)
    if held < min_plateau:
        return False, Reason(
            "n_still_moving",
            {"compute_hi": c_hi, "rollouts": int(last[-1]), "held": float(held), "min_plateau": min_plateau},
        )
    log_c_hi = np.log(c_hi)
    gap_end = abs(float(optimal_rollouts_law(c_hi, *theta)) - hi)
    if gap_end > plateau_tol or c0 >= log_c_hi:
        return False, Reason("plateau_unseen", {"compute_hi": c_hi, "n_plateau": float(2**hi)})
    if abs(hi - lo) < 0.5:
        return False, Reason("law_flat")
    return True, Reason("law_identified")


def fit_optimal_rollouts(
    curves: pd.DataFrame,
    *,
    draws: dict | None = None,
    grid_points: int = 60,
    bootstrap: int = 200,
    seed: int = 0,
    min_distinct: int = MIN_DISTINCT_ROLLOUTS,
    plateau_tol: float = 0.35,
    min_plateau: float = 0.2,
    min_progress: float = 0.1,
) -> RolloutsLaw:
    """The optimal-n law of per-run sigmoid fits; `draws` ({run: (m, 4)}) propagate into its interval, else frontier
    points are resampled. plateau_tol: log2 units; min_plateau: share of the log-compute range the last n* holds."""
    usable = curves[["A", "B", "C_mid", "R0", "rollouts"]].notna().all(axis=1)
    curves = curves[usable].reset_index(drop=True)
    if curves["rollouts"].nunique() < 2:
        raise ValueError("the optimal-n law needs fitted runs at two or more rollouts values")
    grid = compute_grid(curves, grid_points)
    front = frontier(curves, grid, min_progress)
    if len(front) < 4:
        raise ValueError("the frontier has fewer than 4 points where any run has risen above its start")
    log2_n = np.log2(front["rollouts"].to_numpy(float))
    theta, _ = fit_law(front["compute"].to_numpy(), log2_n)
    identified, verdict = _law_verdict(
        theta, front, min_distinct=min_distinct, plateau_tol=plateau_tol, min_plateau=min_plateau
    )
    samples = (
        _bootstrap_law(curves, grid, front, draws, bootstrap, seed, theta, min_progress) if bootstrap > 0 else None
    )
    return RolloutsLaw(
        lo=float(theta[0]),
        hi=float(theta[1]),
        k=float(theta[2]),
        c0=float(theta[3]),
        identified=identified,
        verdict=verdict,
        compute_range=(float(front["compute"].iloc[0]), float(front["compute"].iloc[-1])),
        frontier=front,
        samples=samples,
    )


def _bootstrap_law(curves, grid, front, draws, bootstrap, seed, theta_hat, min_progress) -> np.ndarray:
    rng = np.random.default_rng(seed)
    thetas = []
    usable = draws and all(len(np.asarray(draws.get(run, []))) > 0 for run in curves["run"])
    for b in range(bootstrap):
        if usable:
            rows = np.stack([np.asarray(draws[run])[b % len(draws[run])] for run in curves["run"]])
            drawn = curves.copy()
            drawn[["A", "B", "C_mid", "R0"]] = rows
            f = frontier(drawn, grid, min_progress)
            if len(f) < 4:
                continue
        else:
            f = front.iloc[np.sort(rng.integers(0, len(front), len(front)))]
        theta, _ = fit_law(f["compute"].to_numpy(), np.log2(f["rollouts"].to_numpy(float)), start=theta_hat)
        thetas.append(theta)
    return np.array(thetas)


def frontier_segments(front: pd.DataFrame) -> list[dict]:
    """The frontier as runs of constant n*: [{rollouts, prompts_per_batch, run, compute_from, compute_to}]."""
    segments = []
    for row in front.itertuples():
        if segments and segments[-1]["run"] == row.run:
            segments[-1]["compute_to"] = float(row.compute)
        else:
            segments.append(
                {
                    "rollouts": int(row.rollouts),
                    "prompts_per_batch": int(row.prompts_per_batch),
                    "run": str(row.run),
                    "compute_from": float(row.compute),
                    "compute_to": float(row.compute),
                }
            )
    return segments
