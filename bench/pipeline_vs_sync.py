"""Pipeline (PipelineRL-k) vs sync on one recipe: busy fractions, steps per hour, measured staleness.

Generator and trainer are Ray actors pinned to separate cores (one each on a 2-core host,
rlscale.runner.builtin.accounting.placement).
One vLLM engine serves both runs (base weights reloaded in between). Writes bench/results/pipeline_vs_sync.json.

    .venv/bin/python bench/pipeline_vs_sync.py [--steps 60] [--max-staleness 4]
"""

import argparse
import json
import os
import platform
import time
from pathlib import Path

RESULT = Path(__file__).parent / "results" / "pipeline_vs_sync.json"


def measure(recipe, generator) -> dict:
    """Run one job from scratch; returns its throughput, busy fractions and staleness."""
    from rlscale.runner.builtin import checkpoint
    from rlscale.runner.builtin.job import run_job

    records: list[dict] = []
    run_key = f"bench-{recipe.async_mode}-{os.getpid()}"
    try:
        result = run_job(recipe, run_key=run_key, on_records=records.extend, resume=False, generator=generator)
    finally:
        checkpoint.clear(run_key)
    staleness = [r["metrics"]["staleness"] for r in records if r["step"] > 0]
    evals = [(r["step"], r["val_reward"]) for r in records if r["val_reward"] is not None]
    return {
        "mode": recipe.async_mode,
        "steps": result["steps"],
        "wall_seconds": round(result["wall_seconds"], 2),
        "steps_per_hour": round(result["steps"] / result["wall_seconds"] * 3600, 1),
        "device_hours": round(result["gpu_hours"], 5),
        "generator_busy": round(result["generator_busy"], 3),
        "trainer_busy": round(result["trainer_busy"], 3),
        "staleness_max": max(staleness),
        "staleness_mean": round(sum(staleness) / len(staleness), 2),
        "staleness_bound": recipe.max_staleness if recipe.async_mode == "pipeline" else 0,
        "dropped_batches": result["dropped_batches"],
        "seconds": {key: round(value, 2) for key, value in result["timings"].items()},
        "val_reward": evals,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--max-staleness", type=int, default=4)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    import ray
    from rlscale.planner.recipe import Recipe
    from rlscale.runner.builtin.accounting import placement
    from rlscale.runner.builtin.generator import create_generator

    base = dict(
        prompts_per_batch=32,
        rollouts=8,
        steps=args.steps,
        lr=3e-4,
        lr_reference_batch=256,
        max_new_tokens=8,
        eval_every=args.steps,
        eval_prompts=64,
        eval_samples=2,
        checkpoint_every=args.steps,
        max_staleness=args.max_staleness,
    )
    recipes = [Recipe(**base, **{"async": mode}) for mode in ("sync", "pipeline")]
    from rlscale.runner.ray_head import connect, disconnect

    head = connect(None, cpus=2)  # rlscale's local head, this host's cores (at least 2)
    try:
        where = placement(recipes[0])
        started = time.time()
        generator = create_generator(recipes[0])
        ray.get(generator.ready.remote())
        engine_seconds = time.time() - started
        runs = [measure(recipe, generator) for recipe in recipes]
    finally:
        disconnect(head)
    sync, pipeline = runs
    summary = {
        "recipe": {k: v for k, v in recipes[1].to_json().items() if k in base},  # async: one run per mode
        "host": {
            "cpus": os.cpu_count(),
            "machine": platform.machine(),
            "generator_cores": where.generator_cores,
            "trainer_cores": where.trainer_cores,
            "on_gpu": where.on_gpu,
        },
        "engine_start_seconds": round(engine_seconds, 1),
        "runs": runs,
        "pipeline_speedup": round(pipeline["steps_per_hour"] / sync["steps_per_hour"], 2),
        "pipeline_more_steps_per_hour": pipeline["steps_per_hour"] > sync["steps_per_hour"],
        "pipeline_within_bound": pipeline["staleness_max"] <= pipeline["staleness_bound"],
    }
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(summary, indent=2) + "\n")
    for run in runs:
        print(
            f"{run['mode']:9s} {run['steps_per_hour']:8.0f} steps/h  generator busy {run['generator_busy']:.2f}  "
            f"trainer busy {run['trainer_busy']:.2f}  staleness max {run['staleness_max']} "
            f"(bound {run['staleness_bound']})"
        )
    print(f"pipeline / sync: {summary['pipeline_speedup']}x  -> {RESULT}")


if __name__ == "__main__":
    main()
