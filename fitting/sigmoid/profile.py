"""The profile-likelihood interval on a sigmoid's asymptote A (lmfit's confidence.py): the F statistic of the best fit
with A held at a value, the other free parameters refitted, against the fit; the ends are where it crosses."""

from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np
from rlscale.fitting.sigmoid.curve import N_PARAMS, THETA_A, THETA_R0, shape_grid
from rlscale.fitting.sigmoid.solver import levenberg_marquardt
from scipy import stats
from scipy.optimize import isotonic_regression

# Test offsets from the estimate in the side's interval scale, then growing by _PROFILE_GROWTH up to A's bound.
PROFILE_OFFSETS = np.array([0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0])
_PROFILE_GROWTH = 1.5


@dataclass(frozen=True)
class Profile:
    """A fit's likelihood profile in A (fitting units): F(1, dof) of the best fit with A held, the rest refitted,
    against the fit; sigma2: the weighted residuals' noise variance, widened for their autocorrelation."""

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
        starts = np.concatenate(
            [
                _fixed_a_starts(a, self._shapes, t, self.lower, self.upper, self.free[THETA_R0]),
                np.column_stack([a, np.tile(t[1:], (len(a), 1))]),
            ]
        )
        _, cost = levenberg_marquardt(
            self.model,
            starts,
            self.y,
            self.sqrt_w,
            self.lower,
            self.upper,
            self.free & (np.arange(N_PARAMS) != THETA_A),
            **solver,
        )
        return (np.minimum(cost[: len(a)], cost[len(a) :]) - self.cost_hat) / self.sigma2

    def bound(self, level, side=1, scale=None) -> float:
        """One-sided `level` bound on A (side=1 above the estimate, -1 below): the farthest A the F test does not
        reject, interpolated after the last value kept; A's bound (finite with `scale`) when nothing is rejected."""
        return self.bounds(level, [(side, scale)])[0][0]

    def bounds(self, level, requests, offset=None) -> tuple[list[float], float | None]:
        """(`bound` for each (side, scale) in `requests`, `not_rejected(offset)` or None), in as few batched solves as
        the solver settings allow; A values the cost floor already rejects are not solved."""
        plans = [self._bound_grid(level, side, scale) for side, scale in requests]
        tests = [
            (a, critical, solver, True)
            for a, _, critical, solver in (plan for plan in plans if not isinstance(plan, float))
        ]
        alt = self._alternatives(offset) if offset is not None else None
        if alt is not None:
            tests.append((alt, f_quantile(0.95, self.dof), TEST_SOLVER, False))
        statistics = [(self._cost_floor(a) * (1.0 - 1e-9) - self.cost_hat) / self.sigma2 for a, *_ in tests]
        solved = [np.zeros(len(a), dtype=bool) for a, *_ in tests]
        # Solve what the floor does not reject (with rounding margins), then what each crossing interpolates to.
        self._solve(
            tests,
            statistics,
            solved,
            [statistic < critical * (1.0 + 1e-9) for statistic, (_, critical, *_) in zip(statistics, tests)],
        )
        self._solve(
            tests,
            statistics,
            solved,
            [
                _crossing_row(statistic, critical) if crossing else None
                for statistic, (_, critical, _, crossing) in zip(statistics, tests)
            ],
        )
        ends = [
            plan
            if isinstance(plan, float)
            else _crossing(plan[0], statistics.pop(0), plan[2], plan[1], self.theta_hat[THETA_A])
            for plan in plans
        ]
        a_alt = None
        if alt is not None:
            kept = np.flatnonzero(np.isfinite(statistics[0]) & (statistics[0] < tests[-1][1]))
            a_alt = float(alt[kept[0]]) if kept.size else None
        return ends, a_alt

    def _solve(self, tests, statistics, solved, wanted) -> None:
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
                statistics[i][mask], values = values[: mask.sum()], values[mask.sum() :]
                solved[i] |= mask

    @cached_property
    def _monotone_fits(self) -> tuple[np.ndarray, np.ndarray]:
        w = self.sqrt_w**2
        return (isotonic_regression(self.y, weights=w).x, isotonic_regression(self.y, weights=w, increasing=False).x)

    def _cost_floor(self, a) -> np.ndarray:
        rising, falling = self._monotone_fits
        w = self.sqrt_w**2
        a = np.asarray(a, dtype=float)[:, None]
        return np.minimum((np.minimum(rising, a) - self.y) ** 2 @ w, (np.maximum(falling, a) - self.y) ** 2 @ w)

    def _bound_grid(self, level, side, scale):
        t = self.theta_hat
        edge = float(self.upper[THETA_A] if side > 0 else self.lower[THETA_A])
        if not (0.5 < level < 1.0 and self.testable()):
            return edge
        critical = f_quantile(2.0 * level - 1.0, self.dof)  # two-sided F quantile = one-sided test
        end = edge if np.isfinite(edge) else t[THETA_A] + side * 10.0 * (abs(t[THETA_A] - t[THETA_R0]) + np.ptp(self.y))
        if not side * (end - t[THETA_A]) > 0:
            return float(end)
        if scale is None:
            return t[THETA_A] + (end - t[THETA_A]) * np.linspace(0.0, 1.0, 49)[1:] ** 2, edge, critical, {}
        # an interval's end, not an estimate: a looser solve
        reach = abs(end - t[THETA_A]) / scale
        offsets = PROFILE_OFFSETS
        if reach > offsets[-1]:
            offsets = np.append(
                offsets,
                offsets[-1]
                * _PROFILE_GROWTH ** np.arange(1, np.ceil(np.log(reach / offsets[-1]) / np.log(_PROFILE_GROWTH))),
            )
        a = t[THETA_A] + side * scale * offsets
        return np.append(a[side * (end - a) > 0], end), float(end), critical, TEST_SOLVER

    def not_rejected(self, offset) -> float | None:
        """The first of A_hat + offset, A_hat - offset (clipped to A's bounds) the 95% F test does not reject; None
        when both are rejected, there is no noise scale, or both lie beyond A's bounds."""
        return self.bounds(0.95, [], offset)[1]

    def _alternatives(self, offset) -> np.ndarray | None:
        t = self.theta_hat
        if not self.testable():
            return None
        a = np.clip(t[THETA_A] + np.array([offset, -offset]), self.lower[THETA_A], self.upper[THETA_A])
        a = a[np.abs(a - t[THETA_A]) > 0.5 * offset]  # A's bound itself is tested by the bound rule
        return a if a.size else None


# A profile test at an interval's end or at 95%, not an estimate: a looser solve than the fit's.
TEST_SOLVER = {"max_iter": 40, "xtol": 1e-6}


def _crossing_row(statistic, critical) -> int | None:
    kept = np.flatnonzero(~(np.isfinite(statistic) & (statistic >= critical)))
    if kept.size == 0:
        return 0
    return int(kept[-1]) + 1 if kept[-1] < len(statistic) - 1 else None


def _crossing(a, statistic, critical, edge, a_hat) -> float:
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
def f_quantile(q: float, dof: int) -> float:
    """The q quantile of the F(1, dof) distribution (scipy's ppf costs ~0.2 ms a call; fits ask for few values)."""
    return float(stats.f.ppf(q, 1, dof))


def _shape_sums(u, y, sqrt_w) -> tuple:
    # C_mid beyond the data too: a higher asymptote reached later is exactly what the bound must consider
    bb, mm, s = shape_grid(u, (-0.5, 4.0), 30)
    w = sqrt_w**2
    # Sums about the weighted mean c stay small; six per shape keep memory at len(a) x shapes, not also x points.
    c = float(w @ y / w.sum())
    yc, rest = y - c, 1.0 - s
    w_rr, w_ss, w_rs = (np.einsum("n,gn,gn->g", w, p, q) for p, q in ((rest, rest), (s, s), (rest, s)))
    return bb.ravel(), mm.ravel(), c, w_rr, w_ss, w_rs, rest @ (w * yc), s @ (w * yc), float(w @ yc**2)


def _fixed_a_starts(a, shapes, theta_hat, lower, upper, r0_free) -> np.ndarray:
    bb, mm, c, w_rr, w_ss, w_rs, w_ry, w_sy, w_yy = shapes
    ac = (a - c)[:, None]
    if r0_free:
        R0 = c + (w_ry[None, :] - ac * w_rs[None, :]) / np.maximum(w_rr, 1e-300)[None, :]
        R0 = np.clip(R0, lower[THETA_R0], upper[THETA_R0])
    else:
        R0 = np.full((len(a), len(bb)), theta_hat[THETA_R0])
    r0c = R0 - c
    rss = r0c**2 * w_rr + ac**2 * w_ss + w_yy + 2.0 * r0c * ac * w_rs - 2.0 * r0c * w_ry - 2.0 * ac * w_sy
    best = np.argmin(rss, axis=1)
    starts = np.column_stack([a, np.log(bb[best]), mm[best], R0[np.arange(len(a)), best]])
    return np.minimum(np.maximum(starts, lower), upper)
