"""Generation throughput of the builtin job's vLLM generator against vLLM's own LLM.generate.

Question (issue 39): on the quickstart's prompts and sampling settings, how many tokens per second does the builtin
job's generator produce, and what fraction is that of vLLM's own `LLM.generate` on the same prompts in the same
process setup? Goal: at least 0.8.

Both run in one Ray actor made exactly as the job makes its generator (create_generator: the engine in the actor's
process, its OpenMP threads pinned to the generator's core, the FP32 head, float32 on CPU), alternating, on the same
engine and weights:
    job   Generator.generate as the job's _submit_batch calls it: B_p prompts x n samples, a seed per prompt, the
          sampled tokens' log-probs (the trainer needs them), the interrupt continuation for truncated rollouts
    vllm  LLM.generate(prompts, SamplingParams(n, temperature, max_tokens)): text prompts, one shared sampling
          setting, no log-probs
Tokens are the generated tokens each path returns (the interrupt's forced and answer tokens included for `job`).
The ratio is taken round by round (median), so a busy host slows both sides alike.

    .venv/bin/python bench/generation_throughput.py [--study studies/quickstart.yaml] [--rounds 12]
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULT = Path(__file__).parent / "results" / "generation_throughput.json"
GOAL = 0.8
# vLLM's own call, and with each of the two things the job's call adds (the job itself is "job")
VARIANTS = {
    "job": {},
    "vllm": {},
    "vllm_logprobs": {"logprobs": 0},
    "vllm_seeded": {"seeded": True},
    "vllm_logprobs_no_detok": {"logprobs": 0, "detokenize": False},
}


def bench_generator_class():
    """The job's Generator with one more method: vLLM's own generate on the same engine, timed."""
    from rlscale.runner.builtin.generator import Generator

    class BenchGenerator(Generator):
        def job_path(self, prompts, **kwargs) -> tuple[int, float]:
            started = time.perf_counter()
            generation = self.generate(prompts, **kwargs)
            return generation.tokens, time.perf_counter() - started

        def vllm_path(
            self, prompts, *, n, temperature, max_new_tokens, seed, logprobs=None, seeded=False, detokenize=True
        ) -> tuple[int, float]:
            """vLLM's own generate; `logprobs` 0 asks the sampled tokens' log-probs, `seeded` a seed per prompt
            (the two things the job's call adds); `detokenize` False leaves text (and log-prob tokens) undecoded."""
            from vllm import SamplingParams

            params = [
                SamplingParams(
                    n=n,
                    temperature=temperature,
                    max_tokens=max_new_tokens,
                    logprobs=logprobs,
                    seed=seed + i * n if seeded else None,
                    detokenize=detokenize,
                )
                for i in range(len(prompts))
            ]
            started = time.perf_counter()
            outputs = self.llm.generate(prompts, params if seeded else params[0], use_tqdm=False)
            seconds = time.perf_counter() - started
            return sum(len(sample.token_ids) for output in outputs for sample in output.outputs), seconds

    return BenchGenerator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", default=str(ROOT / "studies" / "quickstart.yaml"))
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import ray
    from rlscale.planner.planning import planned_runs
    from rlscale.planner.study_file import load_study
    from rlscale.runner.builtin.accounting import placement
    from rlscale.runner.builtin.local import resolve_model_dir
    from rlscale.runner.rl.tasks import make_task

    study = load_study(args.study)
    recipes = [run.recipe for run in planned_runs(study)]
    from rlscale.runner.ray_head import connect, disconnect

    head = connect(None, cpus=2)  # rlscale's local head, this host's cores (at least 2)
    recipe = recipes[0]
    where = placement(recipe)
    actor = ray.remote(
        num_cpus=recipe.generator_devices,
        runtime_env={
            "env_vars": {
                "VLLM_CPU_KVCACHE_SPACE": os.environ["VLLM_CPU_KVCACHE_SPACE"],
                "OMP_NUM_THREADS": str(recipe.generator_devices),
            }
        },
    )(bench_generator_class()).remote(
        str(resolve_model_dir(recipe)),
        fp32_head=recipe.fp32_head,
        seed=recipe.seed,
        dtype="float32",
        cpu_cores=where.generator_cores,
        in_process=True,
    )
    task = make_task(recipe)
    rows = []
    for rollouts in sorted({r.rollouts for r in recipes}):  # each run's n at the study's B_p
        job = {"n": rollouts, "temperature": recipe.temperature, "max_new_tokens": recipe.max_new_tokens}
        rates = {name: [] for name in VARIANTS}
        for k in range(args.rounds):
            prompts = [p.text for p in task.train_prompts(recipe.prompts_per_batch)]
            calls = {
                "job": actor.job_path.remote(
                    prompts,
                    **job,
                    length_control=recipe.length_control,
                    end_of_thinking=getattr(task, "end_of_thinking", None),
                    seed=1000 * k,
                )
            }
            for name, extra in VARIANTS.items():
                if name != "job":
                    calls[name] = actor.vllm_path.remote(prompts, **job, seed=1000 * k, **extra)
            done = {name: ray.get(ref) for name, ref in calls.items()}  # the actor runs them one after another
            if k == 0:
                continue  # the first batch of each shape warms the engine's caches for every path
            for name, (tokens, seconds) in done.items():
                rates[name].append(tokens / seconds)
        ratios = [job / raw for job, raw in zip(rates["job"], rates["vllm"])]
        row = {
            "prompts_per_batch": recipe.prompts_per_batch,
            "rollouts": rollouts,
            **{f"{name}_tokens_per_s": statistics.median(values) for name, values in rates.items()},
            "ratio": statistics.median(ratios),
        }
        rows.append(row)
        print(
            f"B_p {row['prompts_per_batch']:3d} n {rollouts:3d}: job {row['job_tokens_per_s']:6.0f} tok/s  "
            f"vLLM {row['vllm_tokens_per_s']:6.0f} (+log-probs {row['vllm_logprobs_tokens_per_s']:6.0f}, "
            f"+seeds {row['vllm_seeded_tokens_per_s']:6.0f}, log-probs undecoded "
            f"{row['vllm_logprobs_no_detok_tokens_per_s']:6.0f})  ratio {row['ratio']:.2f}"
        )
    disconnect(head)
    worst = min(row["ratio"] for row in rows)
    result = {
        "study": args.study,
        "rounds": args.rounds,
        "goal": GOAL,
        "worst_ratio": worst,
        "meets_goal": worst >= GOAL,
        "rows": rows,
        "host": {"cpus": len(os.sched_getaffinity(0)), "machine": platform.machine()},
        "date": time.strftime("%Y-%m-%d"),
    }
    RESULT.write_text(json.dumps(result, indent=1) + "\n")
    print(f"worst ratio {worst:.2f} (goal {GOAL}); wrote {RESULT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
