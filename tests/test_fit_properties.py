"""Property tests: no input makes a fit raise anything but FitError, and degenerate data is never 'identified',
whatever the noise model."""

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from rlscale.fitting.sigmoid import NOISE_MODELS, FitError, fit_sigmoid

any_float = st.floats(allow_nan=True, allow_infinity=True, width=64)
pass_rate = st.floats(0.0, 1.0)
noise_model = st.sampled_from(NOISE_MODELS)
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def fit_or_error(compute, reward, **kwargs):
    """The fit, or None when it raised FitError (anything else propagates and fails the test)."""
    try:
        return fit_sigmoid(compute, reward, bootstrap=kwargs.pop("bootstrap", 0), **kwargs)
    except FitError:
        return None


@FAST
@given(
    arrays(np.float64, st.integers(0, 12), elements=any_float),
    arrays(np.float64, st.integers(0, 12), elements=any_float),
    st.booleans(),
    noise_model,
)
def test_arbitrary_arrays_only_ever_raise_fit_error(compute, reward, bounded, noise):
    fit = fit_or_error(compute, reward, bounded=bounded, noise=noise)
    if fit is not None:
        assert fit.n_points >= 3
        if fit.identified:
            assert np.isfinite([fit.A, fit.B, fit.C_mid, fit.R0]).all()


@FAST
@given(st.lists(st.tuples(st.floats(0.0, 1e6), pass_rate), min_size=3, max_size=25), st.integers(0, 30), noise_model)
def test_pass_rate_fits_with_bootstrap_stay_in_bounds(points, n_resamples, noise):
    compute, reward = map(np.array, zip(*points))
    fit = fit_or_error(compute, reward, bootstrap=n_resamples, noise=noise)
    if fit is not None:
        assert 0.0 <= fit.A <= 1.0 and 0.0 <= fit.R0 <= 1.0 and fit.B > 0 and fit.C_mid > 0
        if np.isfinite(fit.A_lo):
            assert 0.0 <= fit.A_lo <= fit.A_hi <= 1.0


@FAST
@given(st.lists(st.floats(1e-3, 1e6), min_size=3, max_size=20, unique=True), pass_rate, noise_model)
def test_constant_reward_is_never_identified(compute, level, noise):
    fit = fit_or_error(compute, np.full(len(compute), level), noise=noise)
    assert fit is None or not fit.identified


@FAST
@given(
    st.lists(st.floats(1e-3, 1e6), min_size=3, max_size=20, unique=True),
    st.floats(0.05, 0.5),
    st.floats(0.0, 0.4),
    noise_model,
)
def test_decreasing_reward_is_never_identified(compute, drop, floor, noise):
    compute = np.sort(compute)
    assume(compute[-1] / compute[0] > 1.5)
    reward = floor + drop * np.linspace(1.0, 0.0, len(compute)) ** 2
    fit = fit_or_error(compute, reward, noise=noise)
    assert fit is None or not fit.identified


@FAST
@given(st.floats(1e-3, 1e6), st.lists(pass_rate, min_size=1, max_size=12), noise_model)
def test_a_single_compute_value_is_a_fit_error(compute, reward, noise):
    assert fit_or_error(np.full(len(reward), compute), reward, noise=noise) is None


@FAST
@given(st.lists(st.tuples(st.floats(1e-3, 1e6), pass_rate), min_size=0, max_size=2), noise_model)
def test_two_points_are_a_fit_error(points, noise):
    compute, reward = (np.array(v) for v in zip(*points)) if points else (np.array([]), np.array([]))
    assert fit_or_error(compute, reward, noise=noise) is None


@FAST
@given(st.lists(st.floats(1.0, 1e4), min_size=3, max_size=8, unique=True), st.integers(2, 5), noise_model)
def test_duplicate_compute_values_fit_or_fail_cleanly(compute, copies, noise):
    x = np.repeat(np.sort(compute), copies)
    y = np.clip(0.2 + 0.5 * (x / x.max()) + np.resize([0.01, -0.01], x.size), 0, 1)
    fit = fit_or_error(x, y, bootstrap=20, noise=noise)
    assert fit is None or fit.n_points == x.size


@FAST
@given(st.lists(st.floats(1.0, 1e6), min_size=8, max_size=20, unique=True), st.floats(-300.0, 300.0), noise_model)
def test_a_rise_fits_alike_at_any_compute_scale(compute, log10_scale, noise):
    # Only ln C enters the fit, shifted by its mean: scaling compute moves C_mid and nothing else.
    compute = np.sort(compute)
    assume(compute[-1] / compute[0] > 3.0)
    reward = 0.1 + 0.6 * np.linspace(0.0, 1.0, len(compute)) ** 2
    scaled_compute = compute * 10.0**log10_scale
    assume(np.isfinite(scaled_compute).all() and (scaled_compute >= np.finfo(float).tiny).all())
    plain, scaled = fit_or_error(compute, reward, noise=noise), fit_or_error(scaled_compute, reward, noise=noise)
    assert (plain is None) == (scaled is None)
    if plain is not None and plain.identified:
        assert scaled.identified
        np.testing.assert_allclose([scaled.A, scaled.R0, scaled.B], [plain.A, plain.R0, plain.B], rtol=1e-5, atol=1e-6)
