"""Cross-engine agreement: one recipe that builtin and trl both express exactly, trained by each for the same steps
on the tiny policy, seeds 1..S; validation curves side by side, end rewards (mean +- sd over seeds), the fitted
asymptote A with its interval (all seeds' evaluations of an engine pooled), seconds per step and job launch overhead.
Goal: the engines agree within ScaleRL's 0.02 noise band.

The recipe: sync, one update per generated batch, group advantage normalisation, token aggregation (TRL's dapo loss
type), clip 0.2 / 0.28, no KL, no zero-variance filter, no resampling, no warmup (TRL's starts at lr 0), the
trainer's own old log-probs (recompute_logprobs), temperature 1, the same lr and batch. builtin runs as rlscale's
own job (vLLM generator and torch trainer on Ray, one core each); trl as TRL 1.16.0 GRPOTrainer jobs submitted to
a local Ray head's Jobs API (one core: generation with transformers in the training process).

    .venv/bin/python bench/engine_agreement.py [--seeds 3] [--steps 60]
Writes bench/results/engine_agreement.json and .png.
"""

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).parent / "results"
NOISE_BAND = 0.02  # ScaleRL: |dA| below this is seed noise
END_FRACTION = 0.25  # end reward: mean of the evaluations in the last quarter of the steps


def recipe_for(steps: int, seed: int, engine: str):
    from rlscale.planner.recipe import Recipe

    return Recipe.model_validate(
        dict(
            engine=engine,
            model="tiny",
            task="arithmetic",
            prompts_per_batch=16,
            rollouts=8,
            steps=steps,
            seed=seed,
            loss="dapo",
            loss_agg="token",
            adv_norm="group",
            clip_low=0.2,
            clip_high=0.28,
            kl_coef=0.0,
            zero_variance_filter=False,
            no_positive_resampling=None,
            length_control="truncate",
            recompute_logprobs=True,
            lr=1e-4,
            lr_reference_batch=512,
            lr_warmup_steps=0,
            temperature=1.0,
            max_new_tokens=8,
            eval_every=10,
            eval_prompts=128,
            eval_samples=4,
            checkpoint_every=steps,
            generator_devices=1,
            trainer_devices=1,
            **{"async": "sync"},
        )
    )


def train(engine, recipe, run_key: str) -> dict:
    """One run from scratch: its evaluations, wall seconds, device-hours and the engine's launch time."""
    records: list[dict] = []
    started = time.perf_counter()
    result = engine.run(recipe, run_key=run_key, on_records=records.extend)
    wall = time.perf_counter() - started
    first = {}
    for record in records:
        first.setdefault(record["step"], record)
    assert result.steps == recipe.steps and sorted(first) == list(range(recipe.steps + 1)), (result, sorted(first))
    evals = [(step, first[step]["val_reward"]) for step in sorted(first) if first[step]["val_reward"] is not None]
    return {
        "seed": recipe.seed,
        "wall_seconds": round(wall, 2),
        "launch_seconds": result.timings.get("launch"),
        "device_hours": round(first[recipe.steps]["gpu_hours"], 6),
        "evals": evals,
        "train_reward": [first[s]["metrics"].get("train_reward") for s in range(1, recipe.steps + 1)],
    }


def end_reward(evals: list, steps: int) -> float:
    return float(np.mean([reward for step, reward in evals if step >= steps * (1 - END_FRACTION)]))


def fitted_asymptote(runs: list[dict], recipe) -> dict:
    """Sigmoid of val reward against rollouts, all seeds' evaluations pooled (step 0 as R0)."""
    from rlscale.fitting.sigmoid import FitError, fit_sigmoid

    points = [(step * recipe.total_batch, reward) for run in runs for step, reward in run["evals"] if step > 0]
    r0 = float(np.mean([run["evals"][0][1] for run in runs]))
    try:
        fit = fit_sigmoid([c for c, _ in points], [r for _, r in points], r0=r0, bootstrap=200)
    except FitError as err:
        return {"error": str(err)}
    return {
        "A": round(fit.A, 4),
        "A_lo": round(fit.A_lo, 4),
        "A_hi": round(fit.A_hi, 4),
        "R0": round(r0, 4),
        "identified": bool(fit.identified),
    }


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for axis, engine, color in zip(axes, ("builtin", "trl"), ("tab:blue", "tab:orange")):
        for run in summary["engines"][engine]["runs"]:
            steps, rewards = zip(*run["evals"])
            axis.plot(steps, rewards, color=color, alpha=0.7, marker="o", ms=3, label=f"seed {run['seed']}")
        fit = summary["engines"][engine]["fit"]
        if "A" in fit:
            axis.axhspan(fit["A_lo"], fit["A_hi"], color=color, alpha=0.12, label=f"A {fit['A']:.3f} interval")
        axis.set_title(
            f"{engine}: end {summary['engines'][engine]['end_reward_mean']:.3f} "
            f"+- {summary['engines'][engine]['end_reward_sd']:.3f}"
        )
        axis.set_xlabel("step (16 prompts x 8 rollouts)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    axes[0].set_ylabel("validation pass rate (128 prompts x 4)")
    fig.suptitle("the same recipe, trained by rlscale's builtin engine and by TRL 1.16 GRPOTrainer")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    from rlscale.runner.builtin.engine import BuiltinEngine
    from rlscale.runner.ray_head import start_head
    from rlscale.runner.rl.policy import base_model_dir
    from rlscale.runner.trl.engine import TrlEngine

    base_model_dir()  # built (or found) before any timing
    temp = Path(tempfile.mkdtemp(prefix="agree", dir="/tmp"))
    head = start_head(cpus=4, gpus=0, env={"RAY_AUTH_MODE": "disabled"})  # rlscale's one local head
    gcs, jobs = head.gcs_address, head.address
    runs = {"builtin": [], "trl": []}
    try:
        builtin = BuiltinEngine(ray_address=gcs)
        trl = TrlEngine(ray_address=jobs, shared_dir=temp / "shared", poll_seconds=0.5)
        for seed in range(1, args.seeds + 1):
            for name, engine in (("builtin", builtin), ("trl", trl)):
                run = train(engine, recipe_for(args.steps, seed, name), f"agree-{name}-{seed}-{os.getpid()}")
                runs[name].append(run)
                print(
                    f"{name:7s} seed {seed}: end {end_reward(run['evals'], args.steps):.3f}  "
                    f"{run['wall_seconds']:.0f} s",
                    flush=True,
                )
        builtin.close()
    finally:
        from rlscale.runner.builtin import checkpoint

        for run in runs["builtin"]:
            checkpoint.clear(f"agree-builtin-{run['seed']}-{os.getpid()}")
        head.stop()
        shutil.rmtree(temp, ignore_errors=True)

    recipe = recipe_for(args.steps, 1, "trl")
    summary = {
        "command": f"bench/engine_agreement.py --seeds {args.seeds} --steps {args.steps}",
        "date": time.strftime("%Y-%m-%d"),
        "host": {"cpus": os.cpu_count(), "machine": platform.machine()},
        "recipe": {k: v for k, v in recipe.to_json().items() if k not in ("engine", "seed")},
        "end_fraction": END_FRACTION,
        "engines": {},
    }
    for name, mine in runs.items():
        ends = [end_reward(run["evals"], args.steps) for run in mine]
        # after the first run the builtin engine reuses its vLLM generator and trainer: its launch is run 1's extra
        later = [run["wall_seconds"] for run in mine[1:]] or [mine[0]["wall_seconds"]]
        launch = (
            [run["launch_seconds"] for run in mine]
            if name == "trl"
            else [mine[0]["wall_seconds"] - float(np.mean(later))]
        )
        train_seconds = (
            [run["wall_seconds"] - (run["launch_seconds"] or 0.0) for run in mine] if name == "trl" else later
        )
        summary["engines"][name] = {
            "runs": mine,
            "end_rewards": [round(e, 4) for e in ends],
            "end_reward_mean": round(float(np.mean(ends)), 4),
            "end_reward_sd": round(float(np.std(ends, ddof=1)) if len(ends) > 1 else 0.0, 4),
            "fit": fitted_asymptote(mine, recipe),
            "seconds_per_step": round(float(np.mean(train_seconds)) / args.steps, 3),
            "launch_seconds": round(float(np.mean(launch)), 1),
            "device_hours_per_step": round(float(np.mean([run["device_hours"] for run in mine])) / args.steps, 7),
        }
    b, t = summary["engines"]["builtin"], summary["engines"]["trl"]
    summary["end_reward_difference"] = round(t["end_reward_mean"] - b["end_reward_mean"], 4)
    summary["agree_within_noise_band"] = abs(summary["end_reward_difference"]) < NOISE_BAND
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "engine_agreement.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot(summary, RESULTS / "engine_agreement.png")
    for name in ("builtin", "trl"):
        e = summary["engines"][name]
        fit = e["fit"]
        a = f"A {fit['A']:.3f} [{fit['A_lo']:.3f}, {fit['A_hi']:.3f}]" if "A" in fit else fit.get("error", "")
        print(
            f"{name:7s} end {e['end_reward_mean']:.3f} +- {e['end_reward_sd']:.3f}  {a}  "
            f"{e['seconds_per_step']:.2f} s/step  launch {e['launch_seconds']:.0f} s"
        )
    print(
        f"difference {summary['end_reward_difference']:+.3f} (band {NOISE_BAND}) -> {RESULTS / 'engine_agreement.json'}"
    )


if __name__ == "__main__":
    main()
