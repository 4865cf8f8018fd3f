"""The optimal-n law on synthetic IsoCompute studies whose n*(C) is known."""

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from rlscale.fitting.curves import run_curves
from rlscale.fitting.laws.optimal_n import fit_law, fit_optimal_rollouts, frontier, optimal_rollouts_law

_spec = importlib.util.spec_from_file_location(
    "optimal_n_recovery", Path(__file__).parents[1] / "bench" / "optimal_n_recovery.py"
)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def _law_for(truth, c_obs, seed=0, bootstrap=20):
    runs, records = bench.synthetic_study(truth, c_obs, seed=seed, prompts=(16, 32))
    curves, draws = run_curves(records, runs, bootstrap=bootstrap, seed=seed)
    return fit_optimal_rollouts(curves, draws=draws, bootstrap=bootstrap, seed=seed)


def test_law_formula_rises_from_lo_to_hi():
    c = np.array([1e-6, 1.0, 1e6])
    values = optimal_rollouts_law(c, 3.0, 9.0, 2.0, 0.0)
    assert values[0] == pytest.approx(3.0, abs=1e-6)
    assert values[1] == pytest.approx(6.0)  # the midpoint sits at ln C = c0
    assert values[2] == pytest.approx(9.0, abs=1e-6)


def test_the_printed_law_reads_as_one_sign_for_a_midpoint_below_one_unit_of_compute():
    from rlscale.views.wording import law_formula

    law = {"lo": 1.0, "hi": 3.0, "k": 2.0}
    assert law_formula(law | {"c0": -7.4}).endswith("(ln C + 7.40)))")  # GPU-hours of a small study: ln C < 0
    assert law_formula(law | {"c0": 7.4}).endswith("(ln C - 7.40)))")


def test_fit_law_recovers_known_parameters_from_the_curve():
    compute = np.geomspace(1, 1e4, 50)
    truth = (2.0, 7.0, 1.5, np.log(100.0))
    lo, hi, k, c0 = fit_law(compute, optimal_rollouts_law(compute, *truth))[0]
    assert (lo, hi, k, c0) == pytest.approx(truth, rel=1e-3, abs=1e-3)


def test_frontier_picks_the_best_run_and_ignores_runs_beyond_their_data():
    curves = pd.DataFrame(
        [
            {
                "run": "fast",
                "prompts_per_batch": 32,
                "rollouts": 4,
                "A": 0.5,
                "B": 2.0,
                "C_mid": 1.0,
                "R0": 0.1,
                "c_max": 100.0,
            },
            {
                "run": "slow",
                "prompts_per_batch": 32,
                "rollouts": 64,
                "A": 0.9,
                "B": 2.0,
                "C_mid": 10.0,
                "R0": 0.1,
                "c_max": 50.0,
            },
        ]
    )
    front = frontier(curves, np.array([0.5, 40.0, 80.0]))
    # early the fast run leads, later the high-ceiling run; past its last point (50) it is not trusted, and the
    # fast run alone there compares with nothing, so 80 is no frontier point
    assert list(front["run"]) == ["fast", "slow"]


def test_a_run_that_overshot_an_isocompute_budget_does_not_lead_the_frontier_alone():
    # equal budgets; n2's last step overshot the most, so only it reaches the last grid point
    curves = pd.DataFrame(
        [
            {
                "run": "n2",
                "prompts_per_batch": 16,
                "rollouts": 2,
                "A": 0.87,
                "B": 1.2,
                "C_mid": 5e-4,
                "R0": 0.78,
                "c_max": 0.0700,
            },
            {
                "run": "n8",
                "prompts_per_batch": 16,
                "rollouts": 8,
                "A": 0.90,
                "B": 0.7,
                "C_mid": 7e-4,
                "R0": 0.77,
                "c_max": 0.0698,
            },
        ]
    )
    front = frontier(curves, np.geomspace(1e-3, 0.0700, 20))
    assert list(front["run"].unique()) == ["n8"]  # before, n2 took the last point and n* "moved" 8 -> 2
    assert front["compute"].max() <= 0.0698


@pytest.mark.parametrize("case", ["saturates_64", "saturates_32"])
def test_law_recovers_known_n_star_within_one_power_of_two_at_4x(case):
    truth, c_obs = bench.CASES[case]
    law = _law_for(truth, c_obs)
    target = 4 * c_obs
    assert law.identified, law.reason
    n_true = bench.true_optimal_rollouts(truth, target)
    assert abs(np.log2(law.predict(target)) - np.log2(n_true)) <= 1.0
    lo, hi = law.predict_interval(target)
    assert lo <= law.predict(target) * 1.0001 and hi >= law.predict(target) * 0.9999


def test_refuses_when_n_star_is_still_rising_at_the_largest_compute():
    truth, c_obs = bench.CASES["still_rising"]
    law = _law_for(truth, c_obs, bootstrap=0)
    assert not law.identified
    assert law.verdict.code in ("n_still_moving", "plateau_unseen")  # the frontier has not bent
    assert law.verdict["compute_hi"] == pytest.approx(law.compute_range[1])


def test_refuses_when_one_n_wins_everywhere():
    truth, c_obs = bench.CASES["no_trend"]
    law = _law_for(truth, c_obs, bootstrap=0)
    assert not law.identified
    assert law.verdict.code in ("frontier_few_n", "n_still_moving", "plateau_unseen")  # the frontier has not bent


def test_needs_two_rollouts_values():
    curves = pd.DataFrame(
        [{"run": "a", "prompts_per_batch": 32, "rollouts": 16, "A": 0.5, "B": 1.0, "C_mid": 1.0, "R0": 0.1}]
    )
    with pytest.raises(ValueError, match="two or more rollouts"):
        fit_optimal_rollouts(curves)
