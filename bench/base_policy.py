"""Benchmark: how far should the tiny base policy's SFT go so that RL on it ends in a plateau (issue 18)?

For each SFT target (the sampled pass rate at temperature 1 where the warm start stops, runner/rl/policy.py
SFT_TARGET_PASS_RATE) this builds the base policy into its own cache and runs the local RL loop on it with the
quickstart's per-step recipe (B_p 16 x n 4, lr 1e-4 at a 512-rollout batch, temperature 1, 1,000 steps, validation
384 prompts x 4 every 10 steps and 6 a decade before that). Each curve is fitted like the sweep fits a run (the
ScaleRL sigmoid on cumulative rollouts; every evaluation and the record-breaking points). Writes
bench/results/base_policy.json and base_policy.png.

Run: `.venv/bin/python bench/base_policy.py [--jobs 2]` (~6 minutes on 2 cores).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from recipe_search import fit_row  # noqa: E402  (the same two fits as the recipe search)

RESULT = ROOT / "bench" / "results" / "base_policy.json"
PLOT = ROOT / "bench" / "results" / "base_policy.png"
TARGETS = (0.5, 0.7, 0.8, 0.9)
RECIPE = {
    "model": "tiny",
    "task": "arithmetic",
    "prompts_per_batch": 16,
    "rollouts": 4,
    "steps": 1000,
    "async": "sync",
    "lr": 1.0e-4,
    "lr_reference_batch": 512,
    "lr_warmup_steps": 20,
    "max_new_tokens": 8,
    "temperature": 1.0,
    "eval_every": 10,
    "eval_early_per_decade": 6,
    "eval_prompts": 384,
    "eval_samples": 4,
}


def one(target: float, out: Path) -> None:
    """In a child process: build the base policy at `target` into a fresh cache, run RL on it, write the records."""
    os.environ["RLSCALE_CACHE"] = tempfile.mkdtemp(prefix=f"base_{target}_")
    import rlscale.runner.rl.policy as policy
    from rlscale.planner.recipe import Recipe
    from rlscale.runner.builtin.local import run_local

    policy.SFT_TARGET_PASS_RATE = target  # the one constant this benchmark varies
    started = time.perf_counter()
    info = json.loads((policy.base_model_dir() / "rlscale_base_model.json").read_text())
    build_seconds = time.perf_counter() - started
    records = run_local(Recipe(**RECIPE), threads=1, device="cpu")
    out.write_text(
        json.dumps(
            {
                "target": target,
                "base": info,
                "build_seconds": build_seconds,
                "records": [{k: r[k] for k in ("step", "rollouts", "gpu_hours", "val_reward")} for r in records],
            }
        )
    )


def summarize(output: dict) -> dict:
    from rlscale.fitting.sigmoid.points import record_breaking_points

    steps = np.array([r["step"] for r in output["records"]])
    rollouts = np.array([r["rollouts"] for r in output["records"]], dtype=float)
    reward = np.array([r["val_reward"] for r in output["records"]], dtype=float)
    keep = record_breaking_points(rollouts, reward, 0.01)

    def window(lo: int, hi: int) -> float:
        return float(reward[(steps >= lo) & (steps <= hi)].mean())

    return {
        "base": output["base"],
        "build_seconds": output["build_seconds"],
        "steps": steps.tolist(),
        "val_reward": reward.tolist(),
        "start": float(reward[0]),
        # a plateau gains little between the two windows; a creeping run keeps gaining
        "mean_steps_100_200": window(100, 200),
        "mean_steps_900_1000": window(900, 1000),
        "fit_all_points": fit_row(rollouts, reward),
        "fit_record_breaking": fit_row(rollouts[keep], reward[keep]),
    }


def plot(results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for target, row in results.items():
        ax.plot(np.maximum(row["steps"], 1), row["val_reward"], marker=".", lw=1, label=f"SFT to {target}")
    ax.set_xscale("log")
    ax.set_xlabel("RL step (B_p 16 x n 4, temperature 1; step 0 drawn at 1)")
    ax.set_ylabel("validation pass rate (384 x 4)")
    ax.set_title("tiny policy: RL from base policies SFT'd to different pass rates")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--one", nargs=2, metavar=("TARGET", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one(float(args.one[0]), Path(args.one[1]))
        return
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="base_policy_"))

    def run(target: float) -> dict:
        out = work / f"{target}.json"
        subprocess.run(
            [sys.executable, __file__, "--one", str(target), str(out)],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return summarize(json.loads(out.read_text()))

    with ThreadPoolExecutor(args.jobs) as pool:
        results = dict(zip((str(t) for t in TARGETS), pool.map(run, TARGETS)))
    for target, row in results.items():
        fit = row["fit_all_points"]
        verdict = "identified" if fit.get("identified") else f"not identified: {fit.get('reason', '')[:70]}"
        print(
            f"SFT to {target}: base {row['base']['sampled_pass_rate']:.3f} ({row['base']['sft_steps']} SFT steps), "
            f"RL start {row['start']:.3f}, steps 100-200 {row['mean_steps_100_200']:.3f}, steps 900-1000 "
            f"{row['mean_steps_900_1000']:.3f}; A {fit.get('A', float('nan')):.3f} "
            f"[{fit.get('A_lo', float('nan')):.3f}, {fit.get('A_hi', float('nan')):.3f}] {verdict}"
        )
    RESULT.write_text(
        json.dumps(
            {"recipe": RECIPE, "targets": results, "seconds": time.perf_counter() - started}, indent=1, allow_nan=True
        )
        + "\n"
    )
    plot(results)
    print(f"wrote {RESULT.relative_to(ROOT)} and {PLOT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
