"""Prediction of the reward at a target compute (fitting/laws/predict.py) and `rlscale fit --at`.

Checked on synthetic curves whose answer is known: ScaleRL sigmoids observed with evaluation noise whose plateau wanders
as a random walk in log compute, the walk's step in proportion to the run's noise (as the interval's drift assumes);
the runs differ in noise tenfold. The interval is calibrated on one set of such runs and judged on another."""

import json
import math

import numpy as np
import pytest
from helpers import bench_module, normal_calibration
from rlscale.fitting.laws.predict import Calibration, conformal_quantile, predict_at
from rlscale.fitting.sigmoid import fit_sigmoid, sigmoid
from scipy import stats

COMPUTE = np.linspace(2.5, 100.0, 40)
PART, END = COMPUTE <= 50.0, COMPUTE >= 90.0
WANDER = 1.5  # the plateau's random-walk step per unit noise and sqrt(ln compute)
GAUSSIAN = normal_calibration(1.0, 0.5, 0.08)
calibrate_interval = bench_module("prediction_intervals").calibrate_interval  # it writes the shipped interval.json


def wandering_curve(seed: int, noise: float):
    """A sigmoid plus a random walk in ln(compute) of step WANDER x noise, plus independent noise of sd `noise`."""
    rng = np.random.default_rng(seed)
    curve = sigmoid(
        COMPUTE, rng.uniform(0.5, 0.9), rng.uniform(1.0, 2.5), rng.uniform(8.0, 20.0), rng.uniform(0.05, 0.3)
    )
    log_c = np.log(COMPUTE)
    walk = np.cumsum(rng.normal(0.0, 1.0, COMPUTE.size) * np.sqrt(np.diff(log_c, prepend=log_c[0])))
    return curve + WANDER * noise * walk + rng.normal(0.0, noise, COMPUTE.size)


def backtested(seeds):
    """For each seed (noise 0.004 or 0.04 by parity): the half-fit's prediction of the end's mean and the observed."""
    rows = []
    for seed in seeds:
        noise = 0.004 if seed % 2 else 0.04
        reward = wandering_curve(seed, noise)
        fit = fit_sigmoid(COMPUTE[PART], reward[PART], bootstrap=50, seed=0, bounded=False)
        p = predict_at(
            fit, COMPUTE[PART], reward[PART], 100.0, window_compute=COMPUTE[END], calibration=GAUSSIAN, bounded=False
        )
        rows.append((noise, p, float(np.mean(reward[END]))))
    return rows


@pytest.fixture(scope="module")
def judged():
    """Calibrated on 120 runs, then the held-out 80 runs' (noise, prediction, observed) with that calibration."""
    train = backtested(range(1000, 1120))
    calibration = calibrate_interval(
        [p.predicted - obs for _, p, obs in train],
        [p.sd_parameters for _, p, _ in train],
        [p.sigma for _, p, _ in train],
        [p.gain_left for _, p, _ in train],
        [p.distance for _, p, _ in train],
    )
    held = []
    for noise, p, observed in backtested(range(80)):
        scale = math.sqrt(sum(part**2 for part in calibration.parts(p.sd_parameters, p.sigma, p.gain_left, p.distance)))
        half = calibration.quantile(0.9) * scale
        held.append((noise, p.predicted - half, p.predicted + half, observed))
    return held


def test_the_calibrated_interval_holds_held_out_end_rewards_near_its_level(judged):
    assert 0.82 <= np.mean([lo <= obs <= hi for _, lo, hi, obs in judged]) <= 0.97


def test_the_interval_is_narrow_where_the_run_is_smooth_and_wide_where_it_wanders(judged):
    smooth = np.median([hi - lo for noise, lo, hi, _ in judged if noise < 0.01])
    noisy = np.median([hi - lo for noise, lo, hi, _ in judged if noise > 0.01])
    # tenfold noise: the width follows it (a scale from the total gain alone would give both the same width)
    assert noisy / smooth > 4.0
    assert smooth < 0.05


def test_conformal_quantile_holds_a_new_exchangeable_score_at_its_level():
    rng = np.random.default_rng(0)
    covered = []
    for _ in range(2000):
        scores = np.abs(rng.standard_normal(40))
        covered.append(abs(rng.standard_normal()) <= conformal_quantile(scores, np.ones(40), 0.9))
    # split conformal: at least the level, at most level + 1 / (n + 1)
    assert 0.89 <= np.mean(covered) <= 0.93


def test_conformal_quantile_counts_a_training_recorded_twice_once():
    scores, weights = [0.5, 1.0, 2.0, 3.0], [1.0, 1.0, 1.0, 1.0]
    split = conformal_quantile([0.5, 1.0, 1.0, 2.0, 3.0], [1.0, 0.5, 0.5, 1.0, 1.0], 0.6)
    assert split == conformal_quantile(scores, weights, 0.6) == 2.0
    # past what 4 scores support, the largest one grows as the normal quantile does
    assert conformal_quantile(scores, weights, 0.99) > 3.0


def test_calibrate_interval_recovers_known_coefficients():
    rng = np.random.default_rng(0)
    n = 4000
    sd_par, sigma = rng.uniform(0.0, 0.02, n), rng.uniform(0.003, 0.03, n)
    gain, distance = rng.uniform(0.0, 0.4, n), rng.uniform(0.3, 1.5, n)
    scale = np.sqrt(sd_par**2 + (1.2 * sigma) ** 2 + distance * ((0.6 * sigma) ** 2 + (0.1 * gain) ** 2))
    c = calibrate_interval(rng.laplace(0.0, scale), sd_par, sigma, gain, distance)
    # the run's noise at one unit of distance (its share inside the data and its drift trade off over 0.3-1.5)
    assert math.hypot(c.noise_share, c.drift_per_noise) == pytest.approx(math.hypot(1.2, 0.6), rel=0.1)
    assert c.drift_per_gain == pytest.approx(0.1, rel=0.15)
    assert c.quantile(0.9) == pytest.approx(-math.log(0.1), rel=0.1)  # Laplace errors of that scale


def test_the_interval_widens_past_the_data_and_with_its_level():
    reward = wandering_curve(1, 0.01)
    fit = fit_sigmoid(COMPUTE[PART], reward[PART], seed=0)
    inside = predict_at(fit, COMPUTE[PART], reward[PART], 40.0, calibration=GAUSSIAN)
    near = predict_at(fit, COMPUTE[PART], reward[PART], 100.0, calibration=GAUSSIAN)
    far = predict_at(fit, COMPUTE[PART], reward[PART], 1000.0, calibration=GAUSSIAN)
    assert inside.distance == 0.0 and inside.sd_drift == 0.0
    assert inside.width < near.width < far.width
    assert predict_at(fit, COMPUTE[PART], reward[PART], 100.0, level=0.5, calibration=GAUSSIAN).width < near.width
    assert near.predicted == pytest.approx(
        float(np.mean(fit.predict(np.linspace(90.0, 100.0, near.n_window)))), abs=0.01
    )
    assert near.width == pytest.approx(2 * near.quantile * math.hypot(near.sd_parameters, near.sd_noise, near.sd_drift))


def test_a_run_that_has_not_bent_gets_more_drift_than_a_saturated_one():
    rng = np.random.default_rng(3)
    noise = rng.normal(0.0, 0.01, COMPUTE.size)
    saturated = sigmoid(COMPUTE, 0.8, 2.0, 8.0, 0.1) + noise
    rising = sigmoid(COMPUTE, 0.8, 2.0, 45.0, 0.1) + noise
    drift = {}
    for name, reward in (("saturated", saturated), ("rising", rising)):
        fit = fit_sigmoid(COMPUTE[PART], reward[PART], seed=0)
        p = predict_at(fit, COMPUTE[PART], reward[PART], 100.0, calibration=GAUSSIAN)
        drift[name] = (p.gain_left, p.sd_drift)
    assert drift["saturated"][0] < 0.02 < 0.1 < drift["rising"][0]
    assert drift["rising"][1] > 2 * drift["saturated"][1]


def test_a_pass_rate_interval_stays_in_zero_one_and_an_unbounded_one_does_not():
    compute = np.linspace(1.0, 50.0, 30)
    reward = sigmoid(compute, 0.995, 2.0, 5.0, 0.2) + np.random.default_rng(0).normal(0.0, 0.02, compute.size)
    fit = fit_sigmoid(compute, reward, bounded=False, seed=0)
    wide = normal_calibration(3.0, 3.0, 1.0)
    assert predict_at(fit, compute, reward, 500.0, calibration=wide).hi == 1.0
    assert predict_at(fit, compute, reward, 500.0, calibration=wide, bounded=False).hi > 1.0


def test_a_run_too_short_for_a_bootstrap_still_gets_an_interval():
    compute = np.array([0.0, 10.0, 20.0, 30.0, 40.0, 50.0])
    reward = np.array([0.1, 0.3, 0.5, 0.6, 0.64, 0.66])
    fit = fit_sigmoid(compute, reward, seed=0)
    assert fit.samples is None
    p = predict_at(fit, compute, reward, 100.0, calibration=GAUSSIAN)
    assert math.isfinite(p.sd_parameters) and p.lo < p.predicted < p.hi


def test_the_shipped_calibration_gives_a_finite_interval_at_every_level():
    shipped = Calibration.load()
    assert min(shipped.noise_share, shipped.drift_per_noise, shipped.drift_per_gain) >= 0.0
    assert 1.0 < shipped.quantile(0.9) < shipped.quantile(0.99) < 10.0
    assert stats.norm.ppf(0.75) * 0.5 < shipped.quantile(0.5) < shipped.quantile(0.9)


def write_run(path):
    reward = wandering_curve(2, 0.01)
    path.write_text(
        "run,compute,reward\n" + "".join(f"r,{float(c)!r},{float(r)!r}\n" for c, r in zip(COMPUTE[PART], reward[PART]))
    )


def test_fit_at_adds_the_prediction_keys_to_each_run(cli, tmp_path):
    path = tmp_path / "run.csv"
    write_run(path)
    code, out, err = cli("fit", str(path), "--json", "--at", "100", "--level", "0.8")
    assert (code, err) == (0, "")
    [row] = json.loads(out)
    assert row["at"] == 100.0 and row["level"] == 0.8
    assert row["predicted_lo"] < row["predicted"] < row["predicted_hi"]
    code, out, _ = cli("fit", str(path), "--json")
    assert code == 0 and not {"at", "predicted", "predicted_lo", "predicted_hi", "level"} & set(json.loads(out)[0])


@pytest.mark.parametrize("args", [("--at", "-5"), ("--at", "100", "--level", "1.5")])
def test_fit_at_refuses_a_bad_target_or_level(cli, tmp_path, args):
    path = tmp_path / "run.csv"
    write_run(path)
    code, out, err = cli("fit", str(path), "--json", *args)
    assert code == 2 and args[-2] in err and json.loads(out)["field"] == args[-2]


def test_a_target_far_past_the_data_is_predicted_without_listing_its_evaluations():
    reward = wandering_curve(3, 0.01)
    fit = fit_sigmoid(COMPUTE[PART], reward[PART], seed=0)
    p = predict_at(fit, COMPUTE[PART], reward[PART], 1e14, calibration=GAUSSIAN)
    assert p.n_window > 1e11 and math.isfinite(p.predicted) and p.lo < p.predicted < p.hi
