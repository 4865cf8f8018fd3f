"""The fit's profile likelihood in A against lmfit's F-test profile (`conf_interval`, the design card's fitting
package) on the same data: the F statistic at fixed A, the one-sided bound A_upper, and the interval ends the
hull interval on A is built from (a coarse grid, interpolated: they agree to a fraction of a grid step).

The data are a sigmoid plus noise of alternating sign, so the residuals carry no lag-1 correlation (rho = 0)
and the fit's F test is plain least squares', as lmfit's is; noise="constant" gives every point weight 1.
"""

import lmfit
import numpy as np
import pytest
from rlscale.fitting.sigmoid import fit as sigmoid_module
from rlscale.fitting.sigmoid import fit_sigmoid, sigmoid
from rlscale.fitting.sigmoid.profile import PROFILE_OFFSETS

TRUE = {"A": 0.7, "B": 1.5, "C_mid": 800.0, "R0": 0.15}


def curve(seed, n=30, sd=0.01):
    """(compute, reward): n evaluations up to 3,000 with noise of sd ~0.01 whose sign alternates."""
    rng = np.random.default_rng(seed)
    compute = np.linspace(100.0, 3000.0, n)
    signs = np.where(np.arange(n) % 2 == 0, 1.0, -1.0)
    return compute, sigmoid(compute, **TRUE) + sd * signs * np.abs(rng.standard_normal(n))


def lmfit_result(compute, reward):
    """lmfit's least-squares fit of the same sigmoid, bounds as the fit's (A and R0 in [0, 1], B and C_mid > 0)."""
    model = lmfit.Model(
        lambda compute, A, B, C_mid, R0: sigmoid(compute, A, B, C_mid, R0), independent_vars=["compute"]
    )
    params = model.make_params(
        A={"value": 0.6, "min": 0.0, "max": 1.0},
        B={"value": 1.0, "min": 1e-3},
        C_mid={"value": 1000.0, "min": 1e-3},
        R0={"value": 0.1, "min": 0.0, "max": 1.0},
    )
    return model.fit(reward, params, compute=compute)


def lmfit_a_interval(result, probability):
    """lmfit's F-test profile interval on A at `probability` (two-sided), as (lo, hi)."""
    ends = result.conf_interval(p_names=["A"], sigmas=[probability])["A"]
    return ends[0][1], ends[-1][1]


@pytest.fixture
def fitted(monkeypatch):
    """fit(seed) -> (fit, its profile, lmfit's result) for the curve of `seed`."""
    profiles = []

    class Recorded(sigmoid_module.Profile):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            profiles.append(self)

    monkeypatch.setattr(sigmoid_module, "Profile", Recorded)

    def fit(seed, **options):
        compute, reward = curve(seed)
        result = fit_sigmoid(compute, reward, noise="constant", **options)
        assert result.rho == 0.0  # the premise: no widening for autocorrelation, as in lmfit's test
        return result, profiles[-1], lmfit_result(compute, reward)

    return fit


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_same_least_squares_fit_as_lmfit(fitted, seed):
    fit, _, reference = fitted(seed, bootstrap=0)
    values = reference.params.valuesdict()
    assert [fit.A, fit.B, fit.C_mid, fit.R0] == pytest.approx([values[k] for k in TRUE], rel=1e-5)
    assert fit.rss == pytest.approx(reference.chisqr, rel=1e-8)


@pytest.mark.parametrize("seed", [0, 1])
def test_f_statistic_at_fixed_a_matches_lmfit(fitted, seed):
    fit, profile, reference = fitted(seed, bootstrap=0)
    dof = reference.ndata - reference.nvarys
    a = fit.A + np.array([-0.04, -0.02, -0.01, 0.01, 0.02, 0.05])
    ours = profile.statistic(a)
    for value, statistic in zip(a, ours):
        params = reference.params.copy()
        params["A"].set(value=value, vary=False)
        refit = reference.model.fit(reference.data, params, compute=reference.userkws["compute"])
        lmfit_f = (refit.chisqr / reference.chisqr - 1.0) * dof  # lmfit.confidence.f_compare's statistic, nfix 1
        assert statistic == pytest.approx(lmfit_f, rel=1e-4), value


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_upper_bound_matches_lmfit_conf_interval(fitted, seed):
    # A_upper at 0.975 one-sided is the upper end of the two-sided 95% F-test interval
    fit, _, reference = fitted(seed, bootstrap=0, upper_level=0.975)
    _, hi = lmfit_a_interval(reference, 0.95)
    assert fit.A_upper == pytest.approx(hi, abs=0.01 * (hi - fit.A))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_interval_ends_agree_with_lmfit_to_the_grid(fitted, seed):
    # The hull interval's profile ends: tested at PROFILE_OFFSETS x scale from the estimate and interpolated in
    # one batched solve. Each lies in the grid step that holds lmfit's end, within 12% of the half-width of it.
    fit, profile, reference = fitted(seed)
    lo, hi = lmfit_a_interval(reference, 0.95)
    scale = 0.6 * (hi - lo)  # off the grid's points, as the bootstrap's half-width generally is
    ours, _ = profile.bounds(0.975, [(-1, scale), (1, scale)])
    for side, end, exact in ((-1, ours[0], lo), (1, ours[1], hi)):
        grid = fit.A + side * scale * PROFILE_OFFSETS
        step = np.searchsorted(side * (grid - fit.A), side * (exact - fit.A))
        assert 0 < step < len(grid)
        assert side * (grid[step - 1] - fit.A) <= side * (end - fit.A) <= side * (grid[step] - fit.A)
        assert end == pytest.approx(exact, abs=0.12 * abs(exact - fit.A))
    # and the fit's interval on A (the hull, its profile ends at its own scale) holds lmfit's to the same tolerance
    assert fit.A_lo <= lo + 0.12 * (fit.A - lo) and fit.A_hi >= hi - 0.12 * (hi - fit.A)
