"""`rlscale backtest`: fit each run on its first part, extrapolate to its end, compare with carry-forward.

Checked on curves whose answer is known: a sigmoid, a flat run, a run that stops rising at the cut."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from helpers import normal_calibration
from rlscale.db.importer import read_run_log
from rlscale.fitting.backtest import PICK_METHODS, RISE, backtest_run, backtest_runs, summarize
from rlscale.fitting.sigmoid import fit_sigmoid, sigmoid
from rlscale.fitting.sigmoid.bootstrap import percentile_interval

from rlscale.views.tables import backtest_summary_lines as summary_lines

A, B, C_MID, R0 = 0.8, 1.5, 30.0, 0.1
COMPUTE = np.linspace(2.5, 100.0, 40)
GAUSSIAN = normal_calibration(1.0, 0.5, 0.08)  # the interval a Gaussian error of the calibrated scale calls for


def noisy_sigmoid(seed: int, sd: float = 0.005):
    rng = np.random.default_rng(seed)
    return np.clip(sigmoid(COMPUTE, A, B, C_MID, R0) + rng.normal(0.0, sd, COMPUTE.size), 0.0, 1.0)


def test_a_sigmoid_seen_to_half_its_compute_predicts_its_end():
    result = backtest_run(COMPUTE, noisy_sigmoid(0), run="s", fraction=0.5, bootstrap=200, seed=0)
    end = COMPUTE >= 90.0
    truth = float(np.mean(sigmoid(COMPUTE[end], A, B, C_MID, R0)))
    assert result.fitted and result.n_part == 20 and result.cut_compute == pytest.approx(50.0)
    assert result.predicted == pytest.approx(truth, abs=0.02)
    assert result.predicted_lo <= truth <= result.predicted_hi
    assert result.A_part_lo <= A <= result.A_part_hi
    assert result.A_inside is True and result.A_full == pytest.approx(A, abs=0.03)
    # the run is still rising at the half, and carrying its last value forward misses the end by far more
    assert result.rising is True
    assert abs(result.error) < 0.02 < abs(result.carry_forward_error)


def test_a_real_run_that_creeps_after_its_bend_has_its_full_run_asymptote_inside_the_half_fits_interval():
    # On a plateau that still creeps, a higher A reached more slowly fits the first half almost as well; the
    # bootstrap's percentile interval alone missed that (full-run A 0.903 above it), the profile likelihood's not.
    records = read_run_log(Path(__file__).parent / "data" / "creeping_run.csv")
    compute, reward = records["compute"].to_numpy(), records["reward"].to_numpy()
    result = backtest_run(compute, reward, run="bp16_n4", fraction=0.5, bootstrap=200, seed=0)
    part = fit_sigmoid(compute[compute <= result.cut_compute], reward[compute <= result.cut_compute], seed=0)
    _, bootstrap_hi = percentile_interval(part.samples[:, 0])
    assert result.A_full > bootstrap_hi + 0.005
    assert result.A_inside is True and result.A_part_lo <= result.A_full <= result.A_part_hi
    assert result.A_part_hi - result.A_part_lo < 0.05  # still a usable interval, not everything


def test_carry_forward_is_the_last_reward_of_the_part_and_observed_the_mean_of_the_last_tenth():
    compute = np.arange(0.0, 101.0, 10.0)  # 0, 10, ..., 100
    reward = np.array([0.1, 0.2, 0.3, 0.35, 0.4, 0.42, 0.5, 0.55, 0.6, 0.64, 0.66])
    result = backtest_run(compute, reward, fraction=0.5, bootstrap=50)
    assert result.carry_forward == 0.42  # the point at compute 50 is the part's last
    assert result.observed == pytest.approx(np.mean([0.64, 0.66]))  # compute >= 90
    assert result.carry_forward_error == pytest.approx(0.42 - result.observed)
    assert result.error == pytest.approx(result.predicted - result.observed)
    # rising: the end window gained more than RISE over the part's own last tenth (compute 45..50: 0.42)
    assert result.rising is (result.observed - 0.42 > RISE)


def test_a_run_flat_after_the_cut_is_not_rising_and_carry_forward_is_exact():
    compute = np.linspace(0.0, 100.0, 21)  # 0, 5, ..., 100: the part ends at 50, where the run reaches 0.5
    reward = np.minimum(0.2 + 0.3 * compute / 50.0, 0.5)
    result = backtest_run(compute, reward, fraction=0.5, bootstrap=50)
    assert result.rising is False
    assert result.carry_forward_error == pytest.approx(0.0, abs=1e-12)


def test_runs_that_cannot_be_fitted_say_why_and_are_left_out_of_the_summary():
    import pandas as pd

    good = pd.DataFrame({"run": "good", "compute": COMPUTE, "reward": noisy_sigmoid(1)})
    short = pd.DataFrame({"run": "short", "compute": [1.0, 2.0, 10.0], "reward": [0.1, 0.2, 0.3]})
    nothing_after = pd.DataFrame({"run": "one", "compute": [0.0, 0.0], "reward": [0.1, 0.1]})
    results = backtest_runs(pd.concat([good, short, nothing_after]), fraction=0.5, bootstrap=50)
    by_run = {r.run: r for r in results}
    assert by_run["good"].fitted
    assert not by_run["short"].fitted and "need at least 3 points" in by_run["short"].reason
    assert not by_run["one"].fitted and "no point with compute > 0" in by_run["one"].reason
    summary = summarize(results, 0.5)
    assert (summary.runs, summary.fitted, summary.A_checked) == (3, 1, 1)
    assert summary.mae_fit == pytest.approx(abs(by_run["good"].error))


def test_a_part_fit_with_fewer_than_two_points_per_parameter_gets_no_interval_and_is_not_checked():
    # 10 evaluations, 5 in the first half: a bootstrap of 5 points for 4 parameters refits them almost
    # exactly and gives an interval far narrower than the truth (the old behaviour: a confident miss).
    compute = np.linspace(10.0, 100.0, 10)
    noise = np.array([0.01, -0.02, 0.015, -0.01, 0.02, -0.015, 0.01, 0.0, -0.01, 0.005])
    reward = sigmoid(compute, 0.8, 1.5, 30.0, 0.1) + noise
    result = backtest_run(compute, reward, run="short", bootstrap=100)
    assert result.fitted and result.n_part == 5 and not result.identified
    assert "5 points for 4 parameters" in result.reason
    assert math.isnan(result.A_part_lo) and math.isnan(result.A_part_hi) and result.A_inside is None
    summary = summarize([result], 0.5)
    assert (summary.A_checked, summary.A_no_interval) == (0, 1)
    assert any("too few points for an interval" in line for line in summary_lines(summary))


def test_summary_compares_fit_and_carry_forward_on_rising_runs_only():
    results = [
        backtest_run(COMPUTE, noisy_sigmoid(seed), run=f"s{seed}", bootstrap=100, seed=seed) for seed in range(4)
    ]
    flat = np.full(COMPUTE.size, 0.4) + np.random.default_rng(9).normal(0, 0.005, COMPUTE.size)
    results.append(backtest_run(COMPUTE, flat, run="flat", bootstrap=100))
    summary = summarize(results, 0.5)
    rising = [r for r in results if r.rising]
    assert [r.run for r in rising] == ["s0", "s1", "s2", "s3"]
    assert summary.rising == 4
    assert summary.mae_fit_rising == pytest.approx(np.mean([abs(r.error) for r in rising]))
    assert summary.mae_carry_forward_rising == pytest.approx(np.mean([abs(r.carry_forward_error) for r in rising]))
    assert summary.fit_beats_carry_forward_rising is True
    assert summary.A_inside == sum(bool(r.A_inside) for r in results if r.A_inside is not None)


def test_fraction_outside_zero_one_is_refused():
    with pytest.raises(ValueError, match="fraction"):
        backtest_run(COMPUTE, noisy_sigmoid(0), fraction=1.0)


def write_runs(path, runs: dict[str, np.ndarray]):
    lines = ["run,compute,reward"]
    for name, reward in runs.items():
        lines += [f"{name},{float(c)!r},{float(r)!r}" for c, r in zip(COMPUTE, reward)]
    path.write_text("\n".join(lines) + "\n")


def test_cli_json_has_one_object_per_run_and_a_summary(cli, tmp_path):
    path = tmp_path / "runs.csv"
    write_runs(path, {"a": noisy_sigmoid(0), "b": noisy_sigmoid(1)})
    code, out, err = cli("backtest", str(path), "--json", "--bootstrap", "50")
    assert (code, err) == (0, "")
    payload = json.loads(out)
    assert set(payload) == {"source", "fraction", "compute_unit", "runs", "summary", "decision"}
    assert payload["decision"]["best"] in ("a", "b") and set(payload["decision"]["regret"]) == set(PICK_METHODS)
    assert payload["fraction"] == 0.5 and [r["run"] for r in payload["runs"]] == ["a", "b"]
    assert set(payload["runs"][0]) == {
        "run",
        "fitted",
        "reason",
        "n_points",
        "n_part",
        "cut_compute",
        "last_compute",
        "predicted",
        "predicted_lo",
        "predicted_hi",
        "observed",
        "error",
        "carry_forward",
        "carry_forward_error",
        "A_part",
        "A_part_lo",
        "A_part_hi",
        "A_full",
        "A_full_identified",
        "A_inside",
        "rising",
        "identified",
        "level",
        "pi_lo",
        "pi_hi",
        "pi_inside",
        "pi_score",
        "sd_parameters",
        "sd_noise",
        "sd_drift",
        "sigma",
        "gain_left",
        "distance",
        "leader",
    }
    assert set(payload["summary"]) == {
        "fraction",
        "runs",
        "fitted",
        "rising",
        "mae_fit_rising",
        "mae_carry_forward_rising",
        "fit_beats_carry_forward_rising",
        "mae_fit",
        "mae_carry_forward",
        "A_checked",
        "A_inside",
        "A_inside_share",
        "A_no_interval",
        "A_checked_identified",
        "A_inside_identified_share",
        "level",
        "pi_checked",
        "pi_inside",
        "pi_coverage",
        "pi_median_width",
        "pi_mean_score",
    }
    assert payload["summary"]["runs"] == 2 and payload["summary"]["fit_beats_carry_forward_rising"] is True


def test_cli_table_and_summary_in_words(cli, tmp_path):
    path = tmp_path / "runs.csv"
    write_runs(path, {"a": noisy_sigmoid(0)})
    code, out, _ = cli("backtest", str(path), "--fraction", "0.6", "--bootstrap", "50")
    assert code == 0
    words = " ".join(out.split())  # the title wraps on a narrow terminal
    assert "fit on the first 60% of compute" in words and "carry-forward" in words
    assert "Full-run A inside the part-fit's 95% interval: 1 of 1 (100%)" in words


def test_cli_a_file_with_no_fittable_run_exits_2_with_the_reasons(cli, tmp_path):
    path = tmp_path / "tiny.csv"
    path.write_text("run,compute,reward\na,1,0.1\na,2,0.2\na,3,0.3\n")
    code, out, err = cli("backtest", str(path))
    assert code == 2 and out == ""
    assert err.startswith(f"error: {path}: no run could be fitted on its first 50% of compute (a: ")
    assert err.count("\n") == 1


@pytest.mark.parametrize("value", ["0", "1", "1.5"])
def test_cli_fraction_must_be_a_share(cli, tmp_path, value):
    path = tmp_path / "runs.csv"
    write_runs(path, {"a": noisy_sigmoid(0)})
    code, _, err = cli("backtest", str(path), "--fraction", value)
    assert code == 2 and err.startswith("error: --fraction: expected a share of compute in (0, 1)")


def test_cli_backtests_a_stored_study(cli, db_url):
    from rlscale.db.store import Store

    with Store(db_url) as store:
        records = [
            {"step": i, "gpu_hours": float(c), "val_reward": float(r)}
            for i, (c, r) in enumerate(zip(COMPUTE, noisy_sigmoid(3)))
        ]
        store.import_runs("s", [("run-a", {"run": "run-a"}, records)])
    code, out, err = cli("backtest", "--study", "s", "--db", db_url, "--json", "--bootstrap", "50")
    assert (code, err) == (0, "")
    payload = json.loads(out)
    assert payload["source"] == "s" and payload["runs"][0]["run"] == "run-a" and payload["runs"][0]["fitted"]


def test_report_includes_the_backtest_table(cli, tmp_path):
    path = tmp_path / "runs.csv"
    write_runs(path, {"a": noisy_sigmoid(0), "b": noisy_sigmoid(1)})
    url = f"sqlite:///{tmp_path / 'store.db'}"
    assert cli("import", str(path), "--study", "imported", "--db", url)[0] == 0
    code, out, err = cli(
        "report", "imported", "--db", url, "--out", str(tmp_path / "rep"), "--bootstrap", "40", "--json"
    )
    assert (code, err) == (0, "")
    backtest = json.loads(out)["backtest"]
    assert [row["run"] for row in backtest["runs"]] == ["a", "b"] and backtest["summary"]["fitted"] == 2
    markdown = (tmp_path / "rep" / "report.md").read_text()
    assert "## Backtest (ScaleRL: fit on the first half, extrapolate)" in markdown
    assert "| a | 50 |" in markdown and "Full-run A inside the part-fit's 95% interval" in markdown
    assert "Backtest (ScaleRL" in (tmp_path / "rep" / "report.html").read_text()
    code, out, _ = cli("report", "imported", "--db", url, "--out", str(tmp_path / "rep"), "--bootstrap", "40")
    assert code == 0 and "carry-forward" in " ".join(out.split())


def test_cli_noise_model_is_passed_to_the_fits_and_checked(cli, tmp_path):
    path = tmp_path / "runs.csv"
    write_runs(path, {"a": noisy_sigmoid(0)})
    code, out, _ = cli("backtest", str(path), "--json", "--bootstrap", "50", "--noise", "constant")
    assert code == 0 and json.loads(out)["runs"][0]["fitted"]
    code, _, err = cli("backtest", str(path), "--noise", "gaussian")
    assert code == 2 and err.startswith("error: --noise: expected one of auto, binomial, constant, multiplicative")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--r0", "2"], "error: --r0: expected a finite reward in [0, 1]"),
        (["--unbounded", "--noise", "binomial"], "error: --noise: binomial noise is for pass rates in [0, 1]"),
    ],
)
def test_cli_checks_r0_and_noise_as_fit_does(cli, tmp_path, args, message):
    # the same one-line errors as `rlscale fit` (before: every run "not fitted", the error about the file)
    path = tmp_path / "runs.csv"
    write_runs(path, {"a": noisy_sigmoid(0)})
    code, out, err = cli("backtest", str(path), *args)
    assert code == 2 and out == "" and err.startswith(message) and err.count("\n") == 1


def study_runs():
    """Three runs cut short: 'fast' leads early on a low plateau, 'twin' just behind it, 'slow' rises later to a
    far higher one."""
    rng = np.random.default_rng(0)
    return {
        "fast": (COMPUTE, sigmoid(COMPUTE, 0.6, 2.0, 10.0, 0.1) + rng.normal(0.0, 0.003, COMPUTE.size)),
        "slow": (COMPUTE, sigmoid(COMPUTE, 0.9, 2.0, 45.0, 0.1) + rng.normal(0.0, 0.003, COMPUTE.size)),
        "twin": (COMPUTE, sigmoid(COMPUTE, 0.59, 2.0, 10.0, 0.1) + rng.normal(0.0, 0.003, COMPUTE.size)),
    }


def decide_study(runs: dict, fraction: float, **kwargs):
    """The pick `rlscale backtest` makes from `runs` ({name: (compute, reward)}) cut at `fraction`."""
    import pandas as pd
    from rlscale.fitting.backtest import cut_pick

    records = pd.concat([pd.DataFrame({"run": name, "compute": c, "reward": r}) for name, (c, r) in runs.items()])
    return cut_pick(backtest_runs(records, fraction=fraction, **kwargs), fraction)


def test_a_decision_leaves_the_leader_for_a_run_surely_ahead():
    half = decide_study(study_runs(), 0.5, calibration=GAUSSIAN, seed=0)
    # at the half the slow run is surely ahead at the end: its lead exceeds the interval of the difference
    assert half.best == "slow" and half.picks["leader"] == "fast"
    gap = half.predicted["slow"] - half.predicted["fast"]
    assert gap > math.hypot(
        half.predicted["slow"] - half.predicted_lo["slow"], half.predicted_hi["fast"] - half.predicted["fast"]
    )
    assert half.picks["prediction"] == "slow" and half.regret["prediction"] == 0.0
    assert half.regret["leader"] == pytest.approx(half.end["slow"] - half.end["fast"]) and half.regret["leader"] > 0.1
    # at the quarter the slow run has not bent: the gain it has left makes its interval wide, yet it holds its end
    quarter = decide_study(study_runs(), 0.25, calibration=GAUSSIAN, seed=0)
    widths = {run: quarter.predicted_hi[run] - quarter.predicted_lo[run] for run in quarter.end}
    assert widths["slow"] > 5 * widths["fast"]
    assert quarter.predicted_lo["slow"] <= quarter.end["slow"] <= quarter.predicted_hi["slow"]


def test_a_run_is_surely_beaten_when_the_gap_exceeds_the_interval_of_the_difference():
    from rlscale.fitting.backtest import surely_beaten

    predicted = {"a": 0.70, "b": 0.65, "c": 0.60}
    lo = {run: p - 0.03 for run, p in predicted.items()}
    hi = {run: p + 0.03 for run, p in predicted.items()}
    # b's interval overlaps a's, yet a gap of 0.05 exceeds hypot(0.03, 0.03) = 0.042
    assert surely_beaten("b", predicted, lo, hi) and surely_beaten("c", predicted, lo, hi)
    assert not surely_beaten("a", predicted, lo, hi)
    hi["b"] = math.inf  # a run without an interval is never ruled out
    assert not surely_beaten("b", predicted, lo, hi)


def test_interval_score_is_the_width_plus_twenty_times_a_miss_at_90pct():
    from rlscale.fitting.backtest import interval_score

    assert interval_score(0.4, 0.6, 0.5, 0.9) == pytest.approx(0.2)
    assert interval_score(0.4, 0.6, 0.7, 0.9) == pytest.approx(0.2 + 20 * 0.1)
    assert interval_score(0.4, 0.6, 0.35, 0.5) == pytest.approx(0.2 + 4 * 0.05)


def test_cli_level_sets_the_prediction_intervals_level_and_a_bad_one_is_refused(cli, tmp_path):
    path = tmp_path / "runs.csv"
    write_runs(path, {"a": noisy_sigmoid(0), "b": noisy_sigmoid(1)})
    code, out, _ = cli("backtest", str(path), "--json", "--bootstrap", "50", "--level", "0.5")
    assert code == 0
    narrow = json.loads(out)["runs"][0]
    code, out, _ = cli("backtest", str(path), "--json", "--bootstrap", "50")
    wide = json.loads(out)["runs"][0]
    assert narrow["level"] == 0.5 and wide["level"] == 0.9
    assert narrow["pi_hi"] - narrow["pi_lo"] < wide["pi_hi"] - wide["pi_lo"]
    code, out, err = cli("backtest", str(path), "--level", "1")
    assert code == 2 and out == "" and "--level" in err
