"""Cost model: analytic step costs, calibration that recovers known coefficients, saved profiles."""

import numpy as np
import pandas as pd
import pytest
from rlscale.planner.cost import (
    SCALERL_8B,
    Profile,
    calibrate,
    run_gpu_hours,
    step_gpu_hours,
    steps_within,
)
from rlscale.planner.profiles import known_profiles, load_profile, save_profile

from rlscale.base.errors import UserError

TRUE = {"gpu_hours_per_rollout": 3.0e-6, "step_overhead_gpu_hours": 1.2e-4, "startup_gpu_hours": 0.015}
GEOMETRIES = [(8, 4), (8, 8), (16, 4), (16, 8), (32, 8)]


def synthetic(noise: float, seed: int = 0, eval_every: int = 5, steps: int = 60):
    """Records (cumulative gpu_hours every `eval_every` steps) of runs costing TRUE, with relative noise per
    interval."""
    rng = np.random.default_rng(seed)
    runs, records = [], []
    for run_id, (bp, n) in enumerate(GEOMETRIES, start=1):
        runs.append({"run_id": run_id, "run": f"bp{bp},n{n}", "config": {"prompts_per_batch": bp, "rollouts": n}})
        per_step = TRUE["step_overhead_gpu_hours"] + TRUE["gpu_hours_per_rollout"] * bp * n
        hours = TRUE["startup_gpu_hours"]
        records.append({"run_id": run_id, "step": 0, "gpu_hours": hours})
        for step in range(eval_every, steps + 1, eval_every):
            hours += eval_every * per_step * (1 + noise * rng.standard_normal())
            records.append({"run_id": run_id, "step": step, "gpu_hours": hours})
    return pd.DataFrame(records), pd.DataFrame(runs)


def test_calibration_recovers_exact_coefficients():
    records, runs = synthetic(noise=0.0)
    profile, quality = calibrate(records, runs, name="measured")
    for key, value in TRUE.items():
        assert getattr(profile, key) == pytest.approx(value, rel=1e-9)
    assert quality.r2 == pytest.approx(1.0)
    assert quality.relative_residual < 1e-9
    assert (quality.n_runs, quality.n_intervals) == (5, 5 * 12)
    assert quality.warnings == []


def test_calibration_whose_costs_are_not_linear_in_the_batch_says_so_in_codes():
    # 60% jitter on every interval (a shared, throttled host): B_p * n explains little of the per-step cost
    records, runs = synthetic(noise=0.6, seed=0)
    _, quality = calibrate(records, runs, name="measured")
    assert quality.r2 < 0.9 and "poor_fit" in quality.warnings


def test_a_cost_fitted_below_zero_is_clipped_and_says_so():
    # compute counted from the first evaluation (a log that starts its clock late): the startup comes out negative
    records, runs = synthetic(noise=0.0)
    records["gpu_hours"] -= 2 * TRUE["startup_gpu_hours"]
    profile, quality = calibrate(records, runs, name="measured")
    assert profile.startup_gpu_hours == 0.0 and quality.warnings == ["negative_cost_clipped"]


@pytest.mark.parametrize("seed", range(5))
def test_calibration_recovers_coefficients_within_2_percent_under_noise(seed):
    # 2% jitter on every measured interval, as wall-clock timing gives
    records, runs = synthetic(noise=0.02, seed=seed)
    profile, quality = calibrate(records, runs.sample(frac=1, random_state=seed), name="measured")
    assert profile.gpu_hours_per_rollout == pytest.approx(TRUE["gpu_hours_per_rollout"], rel=0.02)
    assert profile.step_overhead_gpu_hours == pytest.approx(TRUE["step_overhead_gpu_hours"], rel=0.02)
    assert profile.startup_gpu_hours == pytest.approx(TRUE["startup_gpu_hours"], rel=0.02)
    assert quality.r2 > 0.95
    assert quality.relative_residual < 0.05


def test_calibration_ignores_unordered_records_and_runs_without_geometry():
    records, runs = synthetic(noise=0.0)
    runs = pd.concat([runs, pd.DataFrame([{"run_id": 99, "run": "imported", "config": {}}])])
    extra = pd.DataFrame([{"run_id": 99, "step": 5, "gpu_hours": 123.0}, {"run_id": 99, "step": 10, "gpu_hours": 1.0}])
    profile, _ = calibrate(pd.concat([extra, records.iloc[::-1]]), runs, name="measured")
    assert profile.gpu_hours_per_rollout == pytest.approx(TRUE["gpu_hours_per_rollout"], rel=1e-9)


def test_calibration_needs_two_batch_sizes():
    records, runs = synthetic(noise=0.0)
    one = runs["run_id"] == 1
    with pytest.raises(UserError, match="two batch sizes"):
        calibrate(records[records["run_id"] == 1], runs[one], name="measured")
    with pytest.raises(UserError, match="two record-to-record intervals"):
        calibrate(records.iloc[:0], runs, name="measured")


def test_step_and_run_cost():
    # 1 device-second per step plus 1/32 s per rollout, 60 s to start: an 8 x 4 step costs 2 s
    profile = Profile(
        name="hand", gpu_hours_per_rollout=1 / 32 / 3600, step_overhead_gpu_hours=1 / 3600, startup_gpu_hours=60 / 3600
    )
    assert step_gpu_hours(profile, 8, 4) * 3600 == pytest.approx(2.0)
    assert run_gpu_hours(profile, 8, 4, 10) * 3600 == pytest.approx(60 + 20)
    assert run_gpu_hours(SCALERL_8B, 48, 16, 0) == 0


def test_steps_within_is_exact_at_boundaries():
    assert steps_within(1.0, 1 / 3) == 3
    assert steps_within(0.1 * 3, 0.1) == 3
    assert steps_within(1.0, 2.0) == 0
    assert steps_within(1.0, 0.1, startup=2.0) == 0


def test_saved_profile_is_found_by_name(workdir):
    fitted = Profile(name="my-cluster", gpu_hours_per_rollout=0.01, step_overhead_gpu_hours=0.5)
    path = save_profile(fitted)
    assert path.parent == workdir / "cache" / "profiles"
    assert load_profile("my-cluster") == fitted
    assert "my-cluster" in known_profiles()


def test_builtin_profiles_cannot_be_shadowed(workdir):
    with pytest.raises(UserError, match="built-in"):
        save_profile(Profile(name="scalerl-8b", gpu_hours_per_rollout=1.0))
    assert load_profile("scalerl-8b") is SCALERL_8B


def test_unknown_profile_names_the_field_and_known_names(workdir):
    with pytest.raises(UserError) as err:
        load_profile("h100-70b", field="compute.profile", file="s.yaml")
    assert str(err.value).startswith("s.yaml: compute.profile: unknown cost profile 'h100-70b'")
    assert "scalerl-8b" in str(err.value) and "tiny-cpu" in str(err.value)
