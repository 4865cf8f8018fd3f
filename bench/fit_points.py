"""Benchmark: which points should the quickstart's runs be fitted on, and does the demo still decide on a slow host?

Reads the records of real `make demo` sweeps (bench/data/quickstart/sweep*_*.csv: B_p 16 x n in {2, 4, 8, 16}, 0.035
measured device-hours a run, validation 384 prompts x 4) and of the same study run with seeds 1, 2 and 3
(seeds_*.csv, each seed read as a sweep of its own). The `make demo` sweeps all ran seed 0: a point's training is
the same step for step in each of them (bench/backtest.py checks it); only the host's timing differs (the measured
device-hours of each step, hence the step a run stopped at). So the sweep files measure how the decision holds up
to the host's speed, and the seeds how it holds up to training noise. Every run is fitted as `recommend` does,
twice: on its record-breaking points (IsoCompute, 0.01 bins) and on every evaluation (ScaleRL). Each run is also
cut to its first 80%, 70% and 50% of compute: a host that many percent slower reaches the same device-hours in that
many fewer steps, and on the log-compute axis of the fit that is the same curve cut short. For each case: fits
identified, A against the end reward (mean over the last 10% of compute), and the decision (`recommend` at the
compute every run reached, as the sweep decides an IsoCompute study; M from the tiny-cpu cost profile, where the
sweep calibrates one on its own records, so M differs from the sweep's). Writes bench/results/fit_points.json.

Run: `.venv/bin/python bench/fit_points.py` (~2 minutes on one core).
"""

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlscale.fitting.laws.optimal_n import fit_optimal_rollouts  # noqa: E402
from rlscale.fitting.rules.recommend import Refusal, fitted, recommend, run_curves  # noqa: E402
from rlscale.planner.cost import TINY_CPU, step_gpu_hours, steps_within  # noqa: E402

DATA = ROOT / "bench" / "data" / "quickstart"
RESULT = ROOT / "bench" / "results" / "fit_points.json"
FRACTIONS = (1.0, 0.8, 0.7, 0.5)
BOOTSTRAP = 100


def steps_for(budget: float, prompts: int, rollouts: int, run: str) -> int:
    return steps_within(budget, step_gpu_hours(TINY_CPU, prompts, rollouts), TINY_CPU.startup_gpu_hours)


def cut(records: pd.DataFrame, fraction: float) -> pd.DataFrame:
    """Each run's records up to `fraction` of its own last compute."""
    last = records.groupby("run")["gpu_hours"].transform("max")
    return records[records["gpu_hours"] <= fraction * last]


def end_reward(records: pd.DataFrame) -> pd.Series:
    """Per run: the mean reward over its last 10% of compute."""
    last = records.groupby("run")["gpu_hours"].transform("max")
    return records[records["gpu_hours"] >= 0.9 * last].groupby("run")["val_reward"].mean()


def case(records: pd.DataFrame, runs: pd.DataFrame, record_breaking: bool, budget: float) -> dict:
    curves, draws = run_curves(records, runs, record_breaking=record_breaking, bootstrap=BOOTSTRAP, seed=0)
    ends = end_reward(records)
    out = {
        "runs": [
            {
                "run": row.run,
                "points": int(row.n_points),
                "A": round(float(row.A), 4),
                "A_lo": round(float(row.A_lo), 4),
                "A_hi": round(float(row.A_hi), 4),
                "identified": bool(row.identified),
                "end_reward": round(float(ends[row.run]), 4),
                "reason": row.reason or "",
            }
            for row in curves.itertuples()
        ]
    }
    out["identified"] = int(curves["identified"].sum())
    try:
        law = fit_optimal_rollouts(fitted(curves), draws=draws, bootstrap=BOOTSTRAP, seed=0)
        rec = recommend(curves, law, budget=budget, steps_for=steps_for, draws=draws, allow_constant_n=True)
    except (Refusal, ValueError) as err:
        out["decision"] = f"not yet: {err}"
    else:
        lo, hi = rec.predicted_interval
        out["decision"] = (
            f"B_p {rec.prompts_per_batch}, n {rec.rollouts}, M {rec.steps}: "
            f"{rec.predicted_reward:.3f} [{lo:.3f}, {hi:.3f}]"
        )
        out["picked_run"] = rec.predicted_from
    return out


def summary(results: dict, names: list[str]) -> dict:
    """Per data group, points and cut: decisions made, fits identified, A - end reward, and the decision's regret
    (the best full run's end reward minus the picked run's: was the n chosen from the cut run the one that won?)."""
    groups = {
        "demo sweeps": [n for n in names if n.startswith("sweep")],
        "seeds": [n for n in names if n.startswith("seeds")],
    }
    table = {}
    for group, members in groups.items():
        for points in ("all", "record_breaking"):
            for fraction in FRACTIONS:
                regrets, decided = [], 0
                for name in members:
                    got = results[f"{name} {fraction:.0%} {points}"]
                    ends = {r["run"]: r["end_reward"] for r in results[f"{name} 100% {points}"]["runs"]}
                    if "picked_run" in got:
                        decided += 1
                        regrets.append(max(ends.values()) - ends[got["picked_run"]])
                full = [results[f"{name} 100% {points}"] for name in members]
                table[f"{group} {points} {fraction:.0%}"] = {
                    "studies": len(members),
                    "decided": decided,
                    "regret_within_0.02": int(sum(r <= 0.02 for r in regrets)),
                    "mean_regret": float(np.mean(regrets)) if regrets else None,
                    "identified_at_100%": int(sum(c["identified"] for c in full)),
                    "runs": int(sum(len(c["runs"]) for c in full)),
                    "A_minus_end_at_100%": float(np.mean([r["A"] - r["end_reward"] for c in full for r in c["runs"]])),
                }
    return table


def sweeps():
    """(name, records) of each `make demo` sweep (seed 0), then of each seed of the seeds sweeps."""
    for path in sorted(DATA.glob("sweep*_*.csv")):
        yield path.stem, pd.read_csv(path)
    for path in sorted(DATA.glob("seeds_*.csv")):
        records = pd.read_csv(path)
        seed = records["run"].str.rsplit("/s", n=1).str[1]
        for value in sorted(seed.unique(), key=int):
            yield f"{path.stem}/s{value}", records[seed == value]


def main() -> None:
    results, names = {}, []
    for name, records in sweeps():
        names.append(name)
        runs = records.drop_duplicates("run")[["run", "prompts_per_batch", "rollouts"]].assign(status="done")
        for fraction in FRACTIONS:
            part = cut(records, fraction)
            evaluated = part[part["val_reward"].notna()]
            budget = float(evaluated.groupby("run")["gpu_hours"].max().min())  # the level every run reached
            for points, record_breaking in (("record_breaking", True), ("all", False)):
                got = case(part, runs, record_breaking, budget)
                results[f"{name} {fraction:.0%} {points}"] = got
                a = [r["A"] for r in got["runs"]]
                ends = [r["end_reward"] for r in got["runs"]]
                print(
                    f"{name:20s} {fraction:4.0%} {points:15s} identified {got['identified']}/{len(a)}  "
                    f"A {min(a):.3f}-{max(a):.3f}  end {min(ends):.3f}-{max(ends):.3f}  "
                    f"A - end {np.mean(np.subtract(a, ends)):+.3f}  -> {got['decision'][:70]}"
                )
    table = summary(results, names)
    for key, row in table.items():
        print(
            f"{key:36s} decided {row['decided']}/{row['studies']}  regret <= 0.02: {row['regret_within_0.02']}  "
            f"mean {row['mean_regret']:.3f}"
        )
    RESULT.write_text(
        json.dumps({"data": names, "bootstrap": BOOTSTRAP, "summary": table, "cases": results}, indent=1) + "\n"
    )
    print(f"wrote {RESULT.relative_to(ROOT)}")


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()  # --help, not a run
    main()
