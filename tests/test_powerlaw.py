"""Tan et al. power law across sizes, on synthetic data generated from known parameters."""

import numpy as np
import pytest
from rlscale.fitting.laws.powerlaw import fit_power_law, fit_size, learning_efficiency
from rlscale.fitting.sigmoid import FitError

K_MAX, N0 = 0.35, 3e9  # saturating learning efficiency; half of K_max at 3B parameters
SIZES = np.array([0.5e9, 1.5e9, 3e9, 7e9, 14e9, 32e9])
E = {size: -0.2 + 0.05 * np.log(size / 1e9) for size in SIZES}  # any intercept per size
STEPS = np.geomspace(10, 2000, 25)


def records(noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    n, x = np.meshgrid(SIZES, STEPS, indexing="ij")
    log_loss = -learning_efficiency(n, K_MAX, N0) * np.log(x) + np.vectorize(E.get)(n)
    loss = np.exp(log_loss + noise * rng.standard_normal(log_loss.shape))
    return n.ravel(), x.ravel(), 1.0 - loss.ravel()


def test_efficiency_saturates_at_k_max_and_is_half_at_n0():
    assert learning_efficiency(N0, K_MAX, N0) == pytest.approx(K_MAX / 2)
    assert learning_efficiency(1e15, K_MAX, N0) == pytest.approx(K_MAX, rel=1e-5)


def test_noise_free_parameters_are_recovered():
    fit = fit_power_law(*records())
    assert fit.K_max == pytest.approx(K_MAX, rel=1e-8)
    assert fit.N0 == pytest.approx(N0, rel=1e-8)
    np.testing.assert_allclose(fit.E, [E[s] for s in SIZES], rtol=1e-9)
    assert fit.pass_rate(7e9, 500.0) == pytest.approx(
        1 - np.exp(-learning_efficiency(7e9, K_MAX, N0) * np.log(500) + E[7e9])
    )


def test_noisy_fit_is_close_and_predicts_held_out_steps():
    fit = fit_power_law(*records(noise=0.02, seed=1))
    assert fit.K_max == pytest.approx(K_MAX, rel=0.05)
    assert fit.N0 == pytest.approx(N0, rel=0.15)
    true_loss = np.exp(-learning_efficiency(32e9, K_MAX, N0) * np.log(10_000) + E[32e9])
    assert fit.loss(32e9, 10_000) == pytest.approx(true_loss, rel=0.1)  # 5x beyond the last step


def test_bad_inputs_raise_fit_error():
    with pytest.raises(FitError, match="2 model sizes"):
        fit_power_law([1e9, 1e9], [10, 20], [0.2, 0.3])
    with pytest.raises(FitError, match="2 distinct"):
        fit_size([10, 10], [0.5, 0.4])
    with pytest.raises(FitError, match="does not fall"):
        fit_power_law([1e9, 1e9, 2e9, 2e9], [10, 100, 10, 100], [0.3, 0.2, 0.3, 0.4])
    with pytest.raises(ValueError, match="fitted sizes"):
        fit_power_law(*records()).loss(2e9, 100)


def test_a_size_left_out_of_the_fit_is_predicted_from_k_max_n0_and_the_line_of_E():
    n, x, p = records()
    smaller = n < 32e9  # fit on 0.5B-14B, predict 32B (Tan et al.'s inter-model extrapolation)
    fit = fit_power_law(n[smaller], x[smaller], p[smaller])
    true_loss = np.exp(-learning_efficiency(32e9, K_MAX, N0) * np.log(STEPS) + E[32e9])
    np.testing.assert_allclose(fit.extrapolated_loss(32e9, STEPS), true_loss, rtol=1e-6)
