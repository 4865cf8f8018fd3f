"""fitting/rules/standing.py, the one measure and rule every view reads: fitted rewards inside each run's data, and the
noise band (with the seeds' spread) as the one separation rule."""

import math

import pandas as pd
import pytest
from rlscale.fitting.curves import reach_of_finished
from rlscale.fitting.rules.standing import beyond_noise, pooled_sd, standing_at
from rlscale.fitting.sigmoid.curve import sigmoid


def _curves(rows):
    base = {"status": "done", "B": 1.5, "R0": 0.1, "truncation_rate": 0.0, "prompts_per_batch": 16, "identified": True}
    return pd.DataFrame(
        [
            {**base, "run": run, "rollouts": n, "A": A, "C_mid": c_mid, "c_max": c_max, **extra}
            for run, n, A, c_mid, c_max, extra in rows
        ]
    )


def test_the_band_and_the_seed_spread_are_one_rule():
    assert beyond_noise(0.02) and not beyond_noise(0.0199) and beyond_noise(-0.03)
    assert not beyond_noise(0.05, spread=0.03) and beyond_noise(0.06, spread=0.03)  # twice the pooled sd
    assert not beyond_noise(float("nan"))
    assert pooled_sd([0.03, 0.04, float("nan")]) == pytest.approx(math.sqrt((0.03**2 + 0.04**2) / 2))


def test_runs_are_read_inside_their_own_data_and_a_short_unidentified_run_is_set_apart():
    curves = _curves(
        [
            ("a", 4, 0.80, 10.0, 100.0, {}),
            ("b", 8, 0.79, 10.0, 100.0, {}),
            ("c", 2, 0.70, 10.0, 100.0, {}),
            ("short", 16, 0.95, 50.0, 20.0, {"identified": False}),
        ]
    )  # an imported log cut short
    assert reach_of_finished(curves) == 100.0  # the identified runs' reach: the short run is not waited for
    standing = standing_at(curves, 100.0)
    assert standing.best["run"] == "a" and standing.within_band == ["a", "b"]
    assert standing.reward("a") == pytest.approx(float(sigmoid(100.0, 0.80, 1.5, 10.0, 0.1)))
    assert standing.ended_before == ({"run": "short", "c_max": 20.0},)
    assert [row["run"] for row in standing.runs] == ["a", "b", "c"]
    # with no identified run, every finished run's reach counts
    assert reach_of_finished(curves.assign(identified=False)) == 20.0
