"""Variants compared across seeds (rules/compare.py): read as the decision reads runs (each run's fitted reward at
the compute every finished run reached), separated only beyond the noise band and the seeds' spread."""

import math

import numpy as np
import pandas as pd
import pytest
from rlscale.fitting.rules.compare import compare_variants, end_reward
from rlscale.fitting.sigmoid.curve import sigmoid
from rlscale.fitting.sigmoid.runs import variant_names

# each run's fitted curve: A = its plateau + 0.01, read at compute 1 (where every run ends)
SHAPE = {"B": 3.0, "C_mid": 0.3, "R0": 0.3}


def fitted_at_end(level: float) -> float:
    """The fitted reward at compute 1 of a run whose plateau is `level` (the curve _study gives it)."""
    return float(sigmoid(1.0, level + 0.01, **SHAPE))


def _study(plateaus: dict[str, list[float]], identified: dict[str, list[bool]] | None = None):
    """Records rising to each seed's plateau (flat over the last half) and per-run fits with A 0.01 above it."""
    records, fits, variant_of = [], [], {}
    compute = np.linspace(0.0, 1.0, 21)
    for variant, levels in plateaus.items():
        for seed, level in enumerate(levels):
            label = f"{variant}/s{seed}"
            variant_of[label] = variant
            reward = np.minimum(level, 0.3 + compute * 2 * (level - 0.3))
            records += [{"run": label, "gpu_hours": c, "val_reward": r} for c, r in zip(compute, reward)]
            ok = True if identified is None else identified[variant][seed]
            fits.append(
                {
                    "run": label,
                    "A": level + 0.01,
                    **SHAPE,
                    "identified": ok,
                    "status": "done",
                    "truncation_rate": 0.0,
                    "c_max": 1.0,
                }
            )
    return pd.DataFrame(fits), pd.DataFrame(records), variant_of


def _compare(plateaus, identified=None):
    curves, records, variant_of = _study(plateaus, identified)
    return compare_variants(curves, records, variant_of=variant_of, compute_col="gpu_hours", reward_col="val_reward")


def test_end_reward_is_the_mean_over_the_last_tenth_of_compute():
    assert end_reward([0, 50, 89, 90, 95, 100], [0.0, 0.5, 0.6, 0.7, 0.8, 0.9]) == pytest.approx(0.8)
    assert math.isnan(end_reward([np.nan], [0.5]))


def test_a_gap_beyond_the_band_and_the_seed_spread_separates_two_variants():
    result = _compare({"cispo": [0.80, 0.81, 0.79], "dapo": [0.70, 0.71, 0.69]})
    assert [row["variant"] for row in result["rows"]] == ["cispo", "dapo"]
    pair = result["pairs"][0]
    assert pair["separated"] and pair["gap"] == pytest.approx(fitted_at_end(0.80) - fitted_at_end(0.70))
    assert pair["end_gap"] == pytest.approx(0.10)  # the observed end, shown beside it
    assert pair["A_compared"] and pair["A_separated"] and pair["A_gap"] == pytest.approx(0.10)
    assert result["compute"] == 1.0 and result["verdict"]["code"] == "variants_separated"
    separated = [{"better": "cispo", "worse": "dapo", "gap": pytest.approx(pair["gap"])}]
    assert result["verdict"]["values"]["pairs"] == separated
    assert [row["within_band"] for row in result["rows"]] == [True, False]


def test_a_gap_inside_the_noise_band_or_the_seed_spread_is_not_a_separation():
    inside_band = _compare({"a": [0.80, 0.80, 0.80], "b": [0.785, 0.785, 0.785]})
    assert not any(p["separated"] or p["A_separated"] for p in inside_band["pairs"])
    assert [row["within_band"] for row in inside_band["rows"]] == [True, True]
    noisy_seeds = _compare({"a": [0.85, 0.75, 0.80], "b": [0.80, 0.70, 0.75]})  # gap 0.05, seed sd 0.05
    gap = fitted_at_end(0.80) - fitted_at_end(0.75)
    sd = float(np.std([fitted_at_end(level) for level in (0.85, 0.75, 0.80)], ddof=1))
    assert noisy_seeds["pairs"][0]["gap"] == pytest.approx(gap) and gap < 2 * sd
    assert not noisy_seeds["pairs"][0]["separated"]
    verdict = noisy_seeds["verdict"]
    assert verdict["code"] == "variants_within_band"
    assert verdict["values"]["widest"] == {"better": "a", "worse": "b", "gap": pytest.approx(gap)}
    assert verdict["values"]["sd_lo"] == pytest.approx(sd) and verdict["values"]["sd_hi"] == pytest.approx(sd)


def test_asymptotes_are_compared_only_when_every_seed_is_identified():
    result = _compare(
        {"a": [0.80, 0.81, 0.80], "b": [0.795, 0.80, 0.80]},
        identified={"a": [True, True, False], "b": [True, True, True]},
    )
    pair = result["pairs"][0]
    assert not pair["A_compared"] and not pair["A_separated"] and math.isnan(pair["A_gap"])
    assert result["verdict"]["values"]["identified"] == [
        {"variant": "a", "identified": 2, "seeds": 3},
        {"variant": "b", "identified": 3, "seeds": 3},
    ]
    assert [row["identified"] for row in result["rows"]] == [2, 3]


def test_one_variant_is_no_comparison():
    assert _compare({"only": [0.8, 0.8]}) is None


def test_variant_names_strip_only_the_sweeps_own_seed_suffix():
    runs = pd.DataFrame({"run": ["loss=dapo/s0", "loss=dapo/s1", "a/s1", "b"], "seed": [0, 1, 0, 0]})
    assert variant_names(runs).tolist() == ["loss=dapo", "loss=dapo", "a/s1", "b"]
    assert variant_names(pd.DataFrame({"run": ["x/s0"]})).tolist() == ["x/s0"]
