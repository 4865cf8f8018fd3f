"""Early termination rules: the asymptote rule on fitted curves, and Optuna's Hyperband pruner as the sweep uses it."""

import numpy as np

from fitting.early_stop import best_fit_of, should_stop
from fitting.sigmoid import fit_sigmoid, sigmoid
from runner.hyperband import HyperbandStopper

COMPUTE = np.linspace(0.025, 1.0, 40)


def curve(A, C_mid=0.1, B=2.0, R0=0.15, upto=1.0, seed=0):
    rng = np.random.default_rng(seed)
    c = COMPUTE[COMPUTE <= upto]
    return c, rng.binomial(2048, sigmoid(c, A, B, C_mid, R0)) / 2048


def test_a_run_well_past_its_inflection_and_clearly_below_the_best_is_stopped():
    best = fit_sigmoid(*curve(0.80, seed=1))
    worse = fit_sigmoid(*curve(0.50, upto=0.5, seed=2))
    decision = should_stop(worse, best, max_compute=0.5)
    assert decision.stop and "asymptote" in decision.reason


def test_a_run_within_the_noise_band_of_the_best_is_kept():
    best = fit_sigmoid(*curve(0.80, seed=1))
    close = fit_sigmoid(*curve(0.79, upto=0.5, seed=3))
    assert not should_stop(close, best, max_compute=0.5).stop


def test_a_run_before_its_inflection_is_never_judged():
    best = fit_sigmoid(*curve(0.80, seed=1))
    early = fit_sigmoid(*curve(0.40, C_mid=0.3, upto=0.2, seed=4))
    assert not should_stop(early, best, max_compute=0.2).stop


def test_the_reference_is_the_identified_fit_with_the_highest_lower_bound():
    fits = {1: fit_sigmoid(*curve(0.6, seed=5)), 2: fit_sigmoid(*curve(0.8, seed=6)), 3: None}
    assert best_fit_of(fits) is fits[2]


def test_hyperband_prunes_runs_that_trail_at_a_rung_and_keeps_the_leader():
    stopper = HyperbandStopper(steps=40, min_fraction=0.1, eta=3)
    stopped = {}
    for run, asymptote in enumerate([0.8, 0.3, 0.3, 0.3, 0.8, 0.3]):
        evaluations = []
        for step in range(0, 41, 4):
            evaluations.append((step, asymptote * step / 40))
            reason = stopper.check(run, evaluations)
            if reason:
                stopped[run] = step
                break
        else:
            stopper.finish(run, evaluations[-1][1])
    assert 0 not in stopped and stopped  # the first leader runs to the end; some trailing runs are cut
    assert all(step < 40 for step in stopped.values())
