"""Benchmark: `rlscale backtest` on real RL runs (bench/data/, provenance in bench/data/README.md).

Each run is fitted on its first half of compute and extrapolated to its end (ScaleRL's protocol), with the
settings `rlscale backtest` uses by default. Writes bench/results/backtest.json: per data set and over all runs,
the mean |error| of the half-fit vs carrying the half's last reward forward on the runs still rising at the
half, and the share of runs whose full-run A falls inside the half-fit's 95% interval.
Issue 17 goals: the fit beats carry-forward on the rising runs; full-run A inside the interval on >= 90%.
Run: `.venv/bin/python bench/backtest.py`.
"""

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlscale.db.importer import read_run_log  # noqa: E402
from rlscale.fitting.backtest import backtest_runs, summarize, summary_lines  # noqa: E402

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
}


def tiny_runs_csv() -> Path:
    """bench/data/tiny/tiny_runs.csv from the `rlscale run --local --json` outputs beside it (one run per file)."""
    rows = []
    for path in sorted((DATA / "tiny").glob("*.json")):
        for record in json.loads(path.read_text())["records"]:
            rows.append({"run": path.stem, "step": record["step"], "gpu_hours": record["gpu_hours"],
                         "reward": record["val_reward"], "rollouts": record["rollouts"], "tokens": record["tokens"]})
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


def quickstart_runs_csv() -> Path:
    """bench/data/quickstart/quickstart_runs.csv from the `make demo` sweeps' records beside it: one run per
    (sweep, run), named `sweepK.bp16_n8`; rollouts = B_p x n x step (cumulative, load-free)."""
    frames = []
    for path in sorted((DATA / "quickstart").glob("sweep*_*.csv")):
        sweep = pd.read_csv(path)
        frames.append(pd.DataFrame({
            "run": path.stem.split("_")[0] + "." + sweep["run"].str.replace(",", "_"),
            "step": sweep["step"], "compute": sweep["gpu_hours"], "reward": sweep["val_reward"],
            "rollouts": sweep["step"] * sweep["prompts_per_batch"] * sweep["rollouts"]}))
    pd.concat(frames).to_csv(QUICKSTART_CSV, index=False)
    return QUICKSTART_CSV


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fraction", type=float, default=0.5)
    parser.add_argument("--bootstrap", type=int, default=200)
    parser.add_argument("--noise", default="auto")
    args = parser.parse_args()

    tiny_runs_csv()
    quickstart_runs_csv()
    fit = dict(bootstrap=args.bootstrap, noise=args.noise, seed=0)
    started = time.perf_counter()
    datasets, everything, fallen = {}, [], set()
    for name, (path, compute_col) in DATASETS.items():
        records = read_run_log(path)  # the parser `rlscale backtest FILE` uses
        results = backtest_runs(records, fraction=args.fraction, run_col="run", compute_col=compute_col,
                                reward_col="reward", **fit)
        peaks = records.groupby("run", sort=False)["reward"].max()
        fell = {r.run for r in results if r.fitted and r.observed < peaks[r.run] - FELL}
        if compute_col == "compute":  # the overall figures count each run once
            everything += results
            fallen |= {(name, run) for run in fell}
        summary = summarize(results, args.fraction)
        misses = {r.run: miss_cause(r, peaks[r.run]) for r in results if r.A_inside is False}
        datasets[name] = {"file": str(path.relative_to(ROOT)), "compute": compute_col, "summary": summary.to_dict(),
                          "runs_that_fell": sorted(fell), "A_outside": misses, "runs": [r.to_dict() for r in results]}
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
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    result = {
        "protocol": "fit each run on its points at compute <= fraction x its last compute; score the fit's mean reward "
                    "over the run's last 10% of compute against the observed mean there; carry-forward = the part's last "
                    "reward; rising = gained > 0.02 from the part's last 10% to the run's last 10%",
        "settings": {"fraction": args.fraction, **fit},
        "goal": {
            "fit_beats_carry_forward_on_rising_runs": overall.fit_beats_carry_forward_rising,
            "A_inside_share_at_least_0.9": bool(overall.A_inside_share >= 0.9),
        },
        "all": overall.to_dict(),
        # the same without the runs whose end is FELL below their best evaluation (collapses a sigmoid cannot describe)
        "all_without_runs_that_fell": {"excluded": sorted(fallen_runs), **standing.to_dict()},
        "datasets": datasets,
        "seconds": seconds,
        "commit": commit,
        # the fit code measured, when it differed from that commit (other work in progress in the same tree)
        "uncommitted_fitting_files": subprocess.run(["git", "diff", "--name-only", "HEAD", "--", "fitting/", "rlscale/base/"],
                                                    capture_output=True, text=True, cwd=ROOT).stdout.split(),
        "machine": {"platform": platform.platform()},
    }
    RESULT.write_text(json.dumps(result, indent=2, allow_nan=False, default=str) + "\n")
    print(f"wrote {RESULT.relative_to(ROOT)} in {seconds:.0f} s")


if __name__ == "__main__":
    main()
