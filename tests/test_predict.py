"""Prediction of the reward at a target compute (fitting/predict.py) and `rlscale fit --at`.

Checked on synthetic curves whose answer is known: ScaleRL sigmoids whose plateau drifts as a random walk in log
compute of a known size, observed with evaluation noise; fitted on their first half, predicted over the last tenth."""

import json
import math

import numpy as np
import pytest
from scipy import stats

from rlscale.fitting.predict import NO_DRIFT, Drift, calibrate_drift, predict_at
from rlscale.fitting.sigmoid import fit_sigmoid, sigmoid

COMPUTE = np.linspace(2.5, 100.0, 40)
PART, END = COMPUTE <= 50.0, COMPUTE >= 90.0
DRIFT = 0.085  # per unit gain and sqrt(ln compute): the size bench/backtest.py estimates on real runs
NOISE = 0.01


def drifting_curve(seed: int):
    """(reward, gain): a sigmoid plus drift = DRIFT x gain x a Brownian motion in ln(compute), plus noise."""
    rng = np.random.default_rng(seed)
    A, R0 = rng.uniform(0.5, 0.9), rng.uniform(0.05, 0.3)
    curve = sigmoid(COMPUTE, A, rng.uniform(1.0, 2.5), rng.uniform(10.0, 35.0), R0)
    log_c = np.log(COMPUTE)
    walk = np.cumsum(rng.normal(0.0, 1.0, COMPUTE.size) * np.sqrt(np.diff(log_c, prepend=log_c[0])))
    return curve + DRIFT * abs(A - R0) * walk + rng.normal(0.0, NOISE, COMPUTE.size), abs(A - R0)


@pytest.fixture(scope="module")
def predictions():
    """For 80 drifting curves: (observed end mean, prediction with the true drift, without drift, oracle width)."""
    z = stats.norm.ppf(0.95)
    rows = []
    for seed in range(80):
        reward, gain = drifting_curve(seed)
        fit = fit_sigmoid(COMPUTE[PART], reward[PART], seed=0)
        args = (fit, COMPUTE[PART], reward[PART], 100.0)
        with_drift = predict_at(*args, window_compute=COMPUTE[END], drift=Drift(DRIFT, {}))
        without = predict_at(*args, window_compute=COMPUTE[END], drift=NO_DRIFT)
        # the width an interval needs that knows the truth: the drift from the cut to the window and the noise
        truth_sd = math.hypot(DRIFT * gain * math.sqrt(math.log(95.0 / 50.0)), NOISE / math.sqrt(END.sum()))
        rows.append((float(np.mean(reward[END])), with_drift, without, 2 * z * truth_sd))
    return rows


def coverage(rows, which):
    return float(np.mean([row[which].lo <= row[0] <= row[which].hi for row in rows]))


def test_the_interval_holds_the_end_reward_of_drifting_curves_near_its_level(predictions):
    assert 0.78 <= coverage(predictions, 1) <= 0.97


def test_without_the_drift_term_the_interval_misses_drifting_curves(predictions):
    assert coverage(predictions, 2) < 0.7


def test_the_interval_is_not_made_to_cover_by_being_wide(predictions):
    widths = np.array([row[1].width for row in predictions])
    oracle = np.array([row[3] for row in predictions])
    assert np.median(widths / oracle) < 1.6
    assert np.median(widths) < 0.2


def test_calibrate_drift_recovers_a_known_constant():
    rng = np.random.default_rng(0)
    known = rng.uniform(0.002, 0.01, 4000)
    scale = rng.uniform(0.1, 0.8, 4000)
    errors = rng.normal(0.0, np.sqrt(known**2 + (0.09 * scale) ** 2))
    assert calibrate_drift(errors, known, scale) == pytest.approx(0.09, rel=0.1)
    assert calibrate_drift(errors * 0.01, known, scale) == 0.0  # already covered: no drift


def test_the_interval_widens_past_the_data_and_with_its_level():
    reward, _ = drifting_curve(1)
    fit = fit_sigmoid(COMPUTE[PART], reward[PART], seed=0)
    drift = Drift(DRIFT, {})
    inside = predict_at(fit, COMPUTE[PART], reward[PART], 40.0, drift=drift)
    near = predict_at(fit, COMPUTE[PART], reward[PART], 100.0, drift=drift)
    far = predict_at(fit, COMPUTE[PART], reward[PART], 1000.0, drift=drift)
    assert inside.distance == 0.0 and inside.sd_drift == 0.0
    assert inside.width < near.width < far.width
    assert predict_at(fit, COMPUTE[PART], reward[PART], 100.0, level=0.5, drift=drift).width < near.width
    assert near.predicted == pytest.approx(float(np.mean(fit.predict(np.linspace(90.0, 100.0, near.n_window)))),
                                           abs=0.01)


def test_a_run_too_short_for_a_bootstrap_still_gets_an_interval():
    compute = np.array([0.0, 10.0, 20.0, 30.0, 40.0, 50.0])
    reward = np.array([0.1, 0.3, 0.5, 0.6, 0.64, 0.66])
    fit = fit_sigmoid(compute, reward, seed=0)
    assert fit.samples is None
    p = predict_at(fit, compute, reward, 100.0, drift=Drift(DRIFT, {}))
    assert math.isfinite(p.sd_parameters) and p.lo < p.predicted < p.hi


def write_run(path):
    reward, _ = drifting_curve(2)
    path.write_text("run,compute,reward\n" + "".join(f"r,{float(c)!r},{float(r)!r}\n" for c, r in zip(COMPUTE[PART], reward[PART])))


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
    assert code == 2 and out == "" and args[-2] in err


def test_a_target_far_past_the_data_is_predicted_without_listing_its_evaluations():
    reward, _ = drifting_curve(3)
    fit = fit_sigmoid(COMPUTE[PART], reward[PART], seed=0)
    p = predict_at(fit, COMPUTE[PART], reward[PART], 1e14, drift=Drift(DRIFT, {}))
    assert p.n_window > 1e11 and math.isfinite(p.predicted) and p.lo < p.predicted < p.hi
