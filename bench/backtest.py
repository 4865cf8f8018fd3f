"""Benchmark: `rlscale backtest` on real RL runs (bench/data/, provenance in bench/data/README.md).

Each run is fitted on its first half of compute and extrapolated to its end (ScaleRL's protocol), with the
settings `rlscale backtest` uses by default. Writes bench/results/backtest.json: per data set and over all runs,
the mean |error| of the half-fit vs carrying the half's last reward forward on the runs still rising at the
half, and the share of runs whose full-run A falls inside the half-fit's 95% interval; and the same with each
training counted once (`each_training_once`: the five `make demo` sweeps are copies of one seeded training per
point, see bench/data/README.md), on which the goals are judged.
Issue 17 goals: the fit beats carry-forward on the rising runs; full-run A inside the interval on >= 90%.
Issue 41: the prediction interval of the end reward (fitting/laws/predict.py), from the half and the quarter, calibrated
by split-conformal prediction held out by source and judged beside today's method (bench/prediction_intervals.py);
the calibration on every source goes to fitting/laws/interval.json, which `rlscale fit --at`, `recommend` and
`rlscale backtest` use.
Run: `.venv/bin/python bench/backtest.py`.
"""

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import prediction_intervals as intervals  # noqa: E402  (bench/prediction_intervals.py)
from rlscale.db.importer import read_run_log  # noqa: E402
from rlscale.fitting.backtest import backtest_runs, summarize  # noqa: E402
from rlscale.fitting.laws.predict import DEFAULT_LEVEL, INTERVAL_FILE  # noqa: E402

from rlscale.views.tables import backtest_summary_lines as summary_lines  # noqa: E402

DATA = ROOT / "bench" / "data"
RESULT = ROOT / "bench" / "results" / "backtest.json"
TINY_CSV = DATA / "tiny" / "tiny_runs.csv"
QUICKSTART_CSV = DATA / "quickstart" / "quickstart_runs.csv"
# (name, file, compute column): the tiny runs twice, on measured device-hours (which the shared machine's load
# bends) and on cumulative rollouts (B_p x n per step: exact, load-free)
DATASETS = {
    "tiny_policy_cpu": (TINY_CSV, "compute"),
    "tiny_policy_cpu_rollouts": (TINY_CSV, "rollouts"),
    "tiny_policy_quickstart_sweeps": (QUICKSTART_CSV, "compute"),
    "tiny_policy_quickstart_sweeps_rollouts": (QUICKSTART_CSV, "rollouts"),
    "verl_qwen3_grpo_gsm8k": (DATA / "public" / "verl_qwen3_grpo_gsm8k.csv", "compute"),
    "cs336_grpo_qwen2.5_math_1.5b": (DATA / "public" / "cs336_grpo_math_eval_points.csv", "compute"),
    "deep_grpo_qwen2.5_0.5b_gsm8k": (DATA / "public" / "deep_grpo_qwen2.5_0.5b_gsm8k.csv", "compute"),
}


def tiny_runs_csv() -> Path:
    """bench/data/tiny/tiny_runs.csv from the `rlscale run --local --json` outputs beside it (one run per file)."""
    rows = []
    for path in sorted((DATA / "tiny").glob("*.json")):
        for record in json.loads(path.read_text())["records"]:
            rows.append(
                {
                    "run": path.stem,
                    "step": record["step"],
                    "gpu_hours": record["gpu_hours"],
                    "reward": record["val_reward"],
                    "rollouts": record["rollouts"],
                    "tokens": record["tokens"],
                }
            )
    pd.DataFrame(rows).to_csv(TINY_CSV, index=False)
    return TINY_CSV


# A run "fell" when its last tenth is this far below its best evaluation: a collapse no sigmoid describes
FELL = 0.1


def miss_cause(result, peak: float) -> str:
    """Why a run's full-run A is outside its half-fit's interval, in words."""
    if result.observed < peak - FELL:
        return f"the run fell after its peak ({peak:.3f} -> {result.observed:.3f})"
    side = "above" if result.A_full > result.A_part_hi else "below"
    return f"full-run A {result.A_full:.3f} {side} the half's interval [{result.A_part_lo:.3f}, {result.A_part_hi:.3f}]"


def quickstart_runs_csv() -> tuple[Path, dict]:
    """bench/data/quickstart/quickstart_runs.csv from the demo sweeps' records beside it: one run per (sweep, run),
    named `sweepK.bp16_n8` (`make demo`, seed 0) or `seeds.bp16_n8_s1` (the same study with seeds 1-3);
    rollouts = B_p x n x step (cumulative, load-free). Also the check that the seed-0 runs of the five sweeps are
    replicates: the same training step for step (a seeded run is deterministic on CPU), only the measured
    device-hours and the step each run stopped at differ."""
    frames = []
    for path in sorted((DATA / "quickstart").glob("sweep*_*.csv")) + sorted((DATA / "quickstart").glob("seeds_*.csv")):
        sweep = pd.read_csv(path)
        frames.append(
            pd.DataFrame(
                {
                    "run": path.stem.split("_")[0] + "." + sweep["run"].str.replace(r"[,/]", "_", regex=True),
                    "step": sweep["step"],
                    "compute": sweep["gpu_hours"],
                    "reward": sweep["val_reward"],
                    "rollouts": sweep["step"] * sweep["prompts_per_batch"] * sweep["rollouts"],
                }
            )
        )
    runs = pd.concat(frames)
    runs.to_csv(QUICKSTART_CSV, index=False)
    by_step = runs.assign(trajectory=runs["run"].map(trajectory)).pivot_table(
        index=["trajectory", "step"], columns="run", values="reward"
    )
    spread = by_step.max(axis=1) - by_step.min(axis=1)  # over the runs of one trajectory that reached the step
    replicates = {
        "runs": int(runs["run"].nunique()),
        "trajectories": int(runs["run"].map(trajectory).nunique()),
        "max_reward_difference_between_replicates_at_a_step": float(spread.max()),
    }
    return QUICKSTART_CSV, replicates


def trajectory(run: str) -> str:
    """The training a quickstart run is a copy of: its point and seed (`bp16_n8_s0`). The five `make demo` sweeps
    ran seed 0 of the same recipe, so their runs of one point are one training stopped at different steps."""
    name = run.split(".", 1)[1]
    return name if run.startswith("seeds.") else f"{name}_s0"


def training_key(dataset: str, path: Path, run: str) -> str:
    """The key a run is counted under when each training counts once: its training for the quickstart sweeps' copies,
    else the run itself within its data set."""
    return trajectory(run) if path == QUICKSTART_CSV else f"{dataset}.{run}"


def per_trajectory(results: list[tuple[str, object]]) -> dict:
    """The backtest's figures with each training counted once: (key, result) pairs, the copies of one training sharing
    a key; a training's share of 'inside' is the share of its checked copies inside; a training is rising when one of
    its copies is, its errors then the mean over those copies."""
    groups: dict[str, list] = {}
    for key, result in results:
        if result.fitted:
            groups.setdefault(key, []).append(result)
    trainings = len({key for key, _ in results})
    checked = [[r for r in g if r.A_inside is not None] for g in groups.values()]
    checked = [g for g in checked if g]
    inside = sum(sum(bool(r.A_inside) for r in g) / len(g) for g in checked)
    rising = [[r for r in g if r.rising] for g in groups.values()]
    rising = [g for g in rising if g]

    def mae(key):
        return float(np.mean([np.mean([abs(getattr(r, key)) for r in g]) for g in rising])) if rising else float("nan")

    return {
        "trainings": trainings,
        "fitted": len(groups),
        "rising": len(rising),
        "mae_fit_rising": mae("error"),
        "mae_carry_forward_rising": mae("carry_forward_error"),
        "A_checked": len(checked),
        "A_inside": float(inside),
        "A_inside_share": inside / len(checked) if checked else float("nan"),
    }


def estimate_interval(fit: dict) -> dict:
    """Backtest every run (each data set on its compute column) from the half and the quarter, judge the prediction
    interval held out by source beside today's method (bench/prediction_intervals.py), write the calibration on every
    source to fitting/laws/interval.json with its provenance, and return the figures, with the fit's point error against
    carry-forward on the rising runs."""
    backtests, point = [], {}
    for f in intervals.FRACTIONS:
        keyed = []
        for name, (path, compute_col) in DATASETS.items():
            if compute_col != "compute":
                continue
            records = read_run_log(path)
            results = backtest_runs(
                records, fraction=f, run_col="run", compute_col=compute_col, reward_col="reward", **fit
            )
            backtests.append((name, path, compute_col, f, records, results))
            keyed += [(training_key(name, path, r.run), r) for r in results]
        once = per_trajectory(keyed)
        point[f"from_{f:g}"] = {
            k: once[k] for k in ("trainings", "fitted", "rising", "mae_fit_rising", "mae_carry_forward_rising")
        }
    rows = intervals.interval_rows(backtests, training_key, fit)
    figures = intervals.held_out(rows)
    commit = head_commit()
    calibration = intervals.calibrate(
        rows,
        provenance={
            "form": "scale = sqrt(sd_parameters^2 + (noise_share sigma)^2 + distance ((drift_per_noise sigma)^2 + "
            "(drift_per_gain gain_left)^2)); interval = predicted +- conformal quantile of the scores x scale",
            "estimated_on": {
                name: str(path.relative_to(ROOT)) for name, (path, col) in DATASETS.items() if col == "compute"
            },
            "how": "coefficients: the Laplace likelihood of the errors of the end reward (mean over the last 10% of "
            "compute) of every run fitted on its first half and first quarter; scores: |error| / scale; each "
            "training counted once",
            "held_out": figures["new"],
            "command": ".venv/bin/python bench/backtest.py",
            "commit": commit,
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "settings": fit,
        },
    )
    INTERVAL_FILE.write_text(json.dumps(intervals.calibration_dict(calibration), indent=1) + "\n")
    figures["hindsight_mean_interval_score"] = intervals.hindsight_score(rows, calibration)
    figures["alternatives_held_out"] = intervals.alternatives(rows)
    print(f"== prediction intervals ({DEFAULT_LEVEL:.0%}), calibrated held out by source: new / today's method")
    for key, new in figures["new"].items():
        old = figures["today"][key]
        print(
            f"   {key}: coverage {new['coverage']:.1%} / {old['coverage']:.1%} of {new['trainings']:.0f} trainings; "
            f"mean interval score {new['mean_interval_score']:.3f} / {old['mean_interval_score']:.3f}; median "
            f"width {new['median_width']:.3f} / {old['median_width']:.3f}; fit |error| on rising "
            f"{point[key]['mae_fit_rising']:.3f} vs carry-forward {point[key]['mae_carry_forward_rising']:.3f}"
        )
    print(
        "   a floor for this form: each source's own best multiplier in hindsight gives mean interval score "
        + ", ".join(f"{v:.3f} {k}" for k, v in figures["hindsight_mean_interval_score"].items())
    )
    for name, alt in figures["alternatives_held_out"].items():
        print(
            f"   tried: {name}: "
            + "; ".join(
                f"{k} coverage {v['coverage']:.1%}, interval score {v['mean_interval_score']:.3f}"
                for k, v in alt.items()
            )
        )
    for src, per in figures["per_source"].items():
        print(
            f"   {src}: "
            + "; ".join(
                f"{key} coverage {v['coverage']:.0%}, width {v['median_width']:.3f} = "
                f"{v['median_width_over_median_abs_error']:.1f} x median |error| {v['median_abs_error']:.3f}"
                for key, v in per["new"].items()
            )
        )
    print(
        f"   on every source: noise share {calibration.noise_share:.3f}, drift per noise "
        f"{calibration.drift_per_noise:.3f}, drift per gain left {calibration.drift_per_gain:.3f}, 90% quantile "
        f"{calibration.quantile(DEFAULT_LEVEL):.3f} (written to {INTERVAL_FILE.relative_to(ROOT)})"
    )
    coefficients = {
        k: v for k, v in intervals.calibration_dict(calibration).items() if k not in ("scores", "weights", "provenance")
    }
    return {
        **figures,
        "calibration": coefficients,
        "quantile_at_level": calibration.quantile(DEFAULT_LEVEL),
        "point_error_rising": point,
        "calibration_object": calibration,
    }


def head_commit() -> str:
    """The short hash of the checkout's HEAD."""
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()


def prediction_goals(predictions: dict) -> dict:
    """Issue 41's goals for the interval, held out by source (the decision goals are bench/decisions.py's)."""
    new, today = predictions["new"], predictions["today"]
    return {
        "coverage_0.88_to_0.95_from_half_and_quarter": {k: bool(0.88 <= v["coverage"] <= 0.95) for k, v in new.items()},
        "mean_interval_score_at_least_40pct_below_todays": {
            k: bool(v["mean_interval_score"] <= 0.6 * today[k]["mean_interval_score"]) for k, v in new.items()
        },
        "median_width_at_most_0.05_from_half": bool(new["from_0.5"]["median_width"] <= 0.05),
        "median_width_at_most_4x_median_abs_error_on_every_source": {
            src: {k: bool(v["median_width_over_median_abs_error"] <= 4.0) for k, v in per["new"].items()}
            for src, per in predictions["per_source"].items()
        },
        "synthetic_independent_noise_coverage_0.85_to_0.95": bool(
            0.85 <= predictions["synthetic"]["noise"]["constant"]["coverage"] <= 0.95
        ),
        "fit_beats_carry_forward_on_rising_runs": {
            k: bool(v["mae_fit_rising"] < v["mae_carry_forward_rising"])
            for k, v in predictions["point_error_rising"].items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fraction", type=float, default=0.5)
    parser.add_argument("--bootstrap", type=int, default=200)
    parser.add_argument("--noise", default="auto")
    parser.add_argument("--synthetic-runs", type=int, default=200, help="synthetic curves per noise model")
    args = parser.parse_args()

    tiny_runs_csv()
    _, replicates = quickstart_runs_csv()
    fit = dict(bootstrap=args.bootstrap, noise=args.noise, seed=0)
    started = time.perf_counter()
    predictions = estimate_interval(fit)
    calibration = predictions.pop("calibration_object")  # the one just written to fitting/laws/interval.json
    predictions["synthetic"] = intervals.synthetic_coverage(args.synthetic_runs, calibration)
    datasets, everything, fallen, keyed = {}, [], set(), []
    for name, (path, compute_col) in DATASETS.items():
        records = read_run_log(path)  # the parser `rlscale backtest FILE` uses
        results = backtest_runs(
            records,
            fraction=args.fraction,
            run_col="run",
            compute_col=compute_col,
            reward_col="reward",
            calibration=calibration,
            **fit,
        )
        peaks = records.groupby("run", sort=False)["reward"].max()
        fell = {r.run for r in results if r.fitted and r.observed < peaks[r.run] - FELL}
        if compute_col == "compute":  # the overall figures count each run once
            everything += results
            keyed += [(training_key(name, path, r.run), r) for r in results]
            fallen |= {(name, run) for run in fell}
        summary = summarize(results, args.fraction)
        misses = {r.run: miss_cause(r, peaks[r.run]) for r in results if r.A_inside is False}
        datasets[name] = {
            "file": str(path.relative_to(ROOT)),
            "compute": compute_col,
            "summary": summary.to_dict(),
            "runs_that_fell": sorted(fell),
            "A_outside": misses,
            "runs": [r.to_dict() for r in results],
        }
        print(f"== {name} ({path.relative_to(ROOT)})")
        for line in summary_lines(summary):
            print("   " + line)
    seconds = time.perf_counter() - started
    overall = summarize(everything, args.fraction)
    fallen_runs = {run for _, run in fallen}
    standing = summarize([r for r in everything if r.run not in fallen_runs], args.fraction)
    print("== all runs (tiny runs on device-hours)")
    for line in summary_lines(overall):
        print("   " + line)
    print(f"== all runs but the {len(fallen_runs)} that fell by > {FELL} after their peak")
    for line in summary_lines(standing):
        print("   " + line)
    trainings = per_trajectory(keyed)
    print(
        f"== each training once ({replicates['runs']} quickstart runs are {replicates['trajectories']} trainings: "
        f"replicates differ by at most {replicates['max_reward_difference_between_replicates_at_a_step']:.3g} "
        "at a step)"
    )
    print(
        f"   {trainings['trainings']} trainings, {trainings['fitted']} fitted; on the {trainings['rising']} "
        "rising at their half: |error| fit "
        f"{trainings['mae_fit_rising']:.3f}, carry-forward {trainings['mae_carry_forward_rising']:.3f}; full-run A "
        f"inside {trainings['A_inside']:.1f} of {trainings['A_checked']} ({trainings['A_inside_share']:.0%})"
    )
    commit = head_commit()
    result = {
        "protocol": "fit each run on its points at compute <= fraction x its last compute; score the fit's mean "
        "reward over the run's last 10% of compute against the observed mean there; carry-forward = the "
        "part's last reward; rising = gained > 0.02 from the part's last 10% to the run's last 10%",
        "settings": {"fraction": args.fraction, **fit},
        # on each training once: the demo sweeps' copies of one seeded training are not separate evidence
        "goal": {
            "fit_beats_carry_forward_on_rising_runs": bool(
                trainings["mae_fit_rising"] < trainings["mae_carry_forward_rising"]
            ),
            "A_inside_share_at_least_0.9": bool(trainings["A_inside_share"] >= 0.9),
        },
        "each_training_once": trainings,
        # issue 41: the prediction interval of the end reward, calibrated held out by source, beside today's method
        "predictions": predictions,
        "prediction_goals": prediction_goals(predictions),
        "quickstart_replicates": replicates,
        "all": overall.to_dict(),
        # the same without the runs whose end is FELL below their best evaluation (collapses a sigmoid cannot describe)
        "all_without_runs_that_fell": {"excluded": sorted(fallen_runs), **standing.to_dict()},
        "datasets": datasets,
        "seconds": seconds,
        "commit": commit,
        # the fit code measured, when it differed from that commit (other work in progress in the same tree)
        "uncommitted_fitting_files": subprocess.run(
            [
                "git",
                "diff",
                "--name-only",
                "HEAD",
                "--",
                "fitting/",
                "rlscale/base/",
                ":(exclude)fitting/laws/interval.json",
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
        ).stdout.split(),
        "machine": {"platform": platform.platform()},
    }
    RESULT.write_text(json.dumps(result, indent=2, allow_nan=False, default=str) + "\n")
    print(f"wrote {RESULT.relative_to(ROOT)} in {seconds:.0f} s")


if __name__ == "__main__":
    main()
