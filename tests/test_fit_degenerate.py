"""Degenerate fits (issue 19 item 7): data long before the inflection, compute near the ends of the float
range, A at its bound, a rise sharper than the evaluations: refused or flagged, never 'identified'."""

import math
import warnings

import numpy as np
import pytest
from rlscale.fitting.sigmoid import NOISE_MODELS, FitError, fit_sigmoid, sigmoid

TRUTH = (0.7, 1.5, 1000.0, 0.1)  # A, B, C_mid, R0
COMPUTE = np.arange(50.0, 4001.0, 50.0)


def early_points(n, upto, seed, sd=0.01):
    """n evaluations up to `upto` x C_mid of TRUTH, with normal noise of sd `sd` (clipped to [0, 1])."""
    compute = np.linspace(upto * TRUTH[2] / n, upto * TRUTH[2], n)
    reward = sigmoid(compute, *TRUTH) + np.random.default_rng(seed).normal(0.0, sd, n)
    return compute, np.clip(reward, 0.0, 1.0)


@pytest.mark.parametrize("noise", NOISE_MODELS)
def test_five_noisy_points_long_before_the_inflection_are_never_identified(noise):
    # The case: true A 0.7, five points up to 5% of C_mid, once fitted as A = 0.21 +- 0.0005 on 4 of 8 seeds.
    for seed in range(8):
        fit = fit_sigmoid(*early_points(5, 0.05, seed), noise=noise, bootstrap=100, seed=seed)
        assert not fit.identified and fit.reason, (seed, fit)
        fixed = fit_sigmoid(*early_points(5, 0.05, seed), r0=0.1, noise=noise, bootstrap=100, seed=seed)
        assert not fixed.identified, (seed, fixed)


@pytest.mark.parametrize("n", [12, 20, 40])
def test_many_noisy_points_long_before_the_inflection_are_not_identified(n):
    # Noise fits a sharp step or an early bend as well as a rise that goes on: the bootstrap around that
    # bend agrees with it, so the profile of A and the sharpness of the rise decide.
    for seed in range(10):
        fit = fit_sigmoid(*early_points(n, 0.05, seed), bootstrap=100, seed=seed)
        assert not fit.identified, (seed, fit)


def binomial_curve(scale=1.0, seed=0):
    compute = COMPUTE * scale
    return compute, np.random.default_rng(seed).binomial(2500, sigmoid(COMPUTE, *TRUTH)) / 2500


@pytest.mark.parametrize("scale", [1e-300, 1e-250, 1e250, 1e301, 1e303])
def test_compute_near_the_ends_of_the_float_range_fits_like_the_same_curve_at_1e2(scale):
    reference = fit_sigmoid(*binomial_curve(), bootstrap=50)
    fit = fit_sigmoid(*binomial_curve(scale), bootstrap=50)
    assert reference.identified and fit.identified
    np.testing.assert_allclose(
        [fit.A, fit.B, fit.C_mid / scale, fit.R0, fit.r2],
        [reference.A, reference.B, reference.C_mid, reference.R0, reference.r2],
        rtol=1e-6,
    )
    np.testing.assert_allclose([fit.A_lo, fit.A_hi], [reference.A_lo, reference.A_hi], rtol=1e-6)
    assert abs(fit.A - TRUTH[0]) <= 0.02


def test_subnormal_compute_is_refused():
    compute, reward = binomial_curve()
    with pytest.raises(FitError, match="subnormal"):
        fit_sigmoid(compute * 1e-320, reward)


def test_c_mid_stays_a_finite_float_when_the_data_reach_the_top_of_the_range():
    compute, reward = binomial_curve(1e304)  # C up to 4e307: C_mid may not run off to infinity
    fit = fit_sigmoid(compute, reward, bootstrap=20)
    assert np.isfinite(fit.C_mid) and np.isfinite(fit.samples).all()


def test_a_at_its_bound_is_not_identified_and_the_reason_says_so():
    saturated = np.clip(sigmoid(COMPUTE, 1.1, 1.5, 1000.0, 0.1), 0.0, 1.0)  # the data run into the ceiling
    fit = fit_sigmoid(COMPUTE, saturated, bootstrap=50)
    assert fit.A == 1.0 and not fit.identified and "A sits at its bound 1" in fit.reason


def test_an_interval_touching_the_bound_is_not_identified():
    touched = 0
    for seed in range(6):
        reward = np.random.default_rng(seed).binomial(400, sigmoid(COMPUTE, 0.98, 1.2, 1500.0, 0.3)) / 400
        fit = fit_sigmoid(COMPUTE, reward, bootstrap=100, seed=seed)
        if fit.A_hi >= 1.0 - 1e-9 and fit.A < 1.0:
            touched += 1
            assert not fit.identified and "touches A's bound 1" in fit.reason
    assert touched >= 1  # the case occurs in these draws


def test_a_step_sharper_than_the_evaluations_is_not_identified():
    step = np.where(COMPUTE < 1025.0, 0.1, 0.7)  # all of the rise between two evaluations
    fit = fit_sigmoid(COMPUTE, step, bootstrap=0)
    assert not fit.identified and "rise is too sharp" in fit.reason


def test_fewer_than_two_points_per_parameter_is_not_identified():
    compute = np.array([100.0, 500.0, 1000.0, 2000.0, 4000.0, 8000.0, 16000.0])
    fit = fit_sigmoid(compute, sigmoid(compute, *TRUTH), bootstrap=100)
    assert not fit.identified and "7 points for 4 parameters (at least 8 needed; no interval below that)" in fit.reason
    assert math.isnan(fit.A_lo) and math.isnan(fit.A_hi)  # a bootstrap of 7 points would be far too narrow
    assert fit_sigmoid(compute, sigmoid(compute, *TRUTH), r0=0.1, bootstrap=0).identified  # 3 parameters


@pytest.mark.parametrize(
    "compute,reward",
    [
        ([0.0, 1e-300, 1e308, 1.7e308], [0.0, 0.0, 1.0, 1.0]),
        ([1.0, 2.0, 3.0, 4.0], [0.5, 0.5, 0.5, 0.5]),
        ([1.0, 2.0, np.inf, 4.0, 5.0], [0.0, np.nan, 0.5, 1.0, 1.0]),
        (np.arange(1.0, 30.0), np.r_[np.zeros(28), 1.0]),
    ],
)
@pytest.mark.parametrize("noise", NOISE_MODELS)
def test_degenerate_input_raises_no_runtime_warning(compute, reward, noise):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            fit = fit_sigmoid(compute, reward, noise=noise, bootstrap=20)
        except FitError:
            return
    assert not fit.identified
