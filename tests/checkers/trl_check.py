"""Run inside .venv-trl (scripts/checker_envs.sh): TRL's own GRPOConfig reads rlscale's exported YAML.

stdin: JSON list of {"name", "yaml": the exported text}. Each builds a real trl.GRPOConfig (a field TRL does not
have is a TypeError); __post_init__ derives the generation batch. The export targets GPUs: on this CPU-only host
the config is built with bf16 off and use_cpu on, nothing else changed.
Writes JSON {"version", "cases": [{"name", "ok", "error", "values"}]} to the file named by argv[1].
With --parse (argv[2]): each "yaml" is a job config a setup study composed, read as `trl grpo --config FILE` reads
it (trl.scripts.grpo.make_parser), unchanged; values add the optimizer updates per generated batch.
"""

import json
import sys
import tempfile

import trl
import yaml


def check(case: dict, output_dir: str) -> dict:
    fields = yaml.safe_load(case["yaml"])
    config = trl.GRPOConfig(**{**fields, "output_dir": output_dir, "bf16": False, "use_cpu": True})
    return {
        "world_size": config.world_size,
        "num_generations": config.num_generations,
        "per_device_train_batch_size": config.per_device_train_batch_size,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "steps_per_generation": config.steps_per_generation,
        "generation_batch_size": config.generation_batch_size,
        "num_iterations": config.num_iterations,
        "max_steps": config.max_steps,
        "loss_type": config.loss_type,
        "epsilon": config.epsilon,
        "epsilon_high": config.epsilon_high,
        "importance_sampling_level": config.importance_sampling_level,
        "scale_rewards": config.scale_rewards,
        "beta": config.beta,
        "learning_rate": config.learning_rate,
        "lr_scheduler_type": str(getattr(config.lr_scheduler_type, "value", config.lr_scheduler_type)),
        "warmup_steps": config.warmup_steps,
        "max_completion_length": config.max_completion_length,
        "cast_lm_head_to_fp32": config.cast_lm_head_to_fp32,
        "seed": config.seed,
    }


def parse(case: dict, output_dir: str) -> dict:
    from trl.scripts.grpo import make_parser

    path = f"{output_dir}/config.yaml"
    with open(path, "w") as handle:
        handle.write(case["yaml"])
    config = make_parser().parse_args_and_config(["--config", path])[1]
    micro_batches = config.steps_per_generation * config.num_iterations
    return dict(
        num_generations=config.num_generations,
        generation_batch_size=config.generation_batch_size,
        max_steps=config.max_steps,
        lr_scheduler_type=str(getattr(config.lr_scheduler_type, "value", config.lr_scheduler_type)),
        updates_per_generation=micro_batches // config.gradient_accumulation_steps,
    )


if __name__ == "__main__":
    out_path = sys.argv[1]
    read = parse if sys.argv[2:] == ["--parse"] else check
    results = []
    with tempfile.TemporaryDirectory() as output_dir:
        for case in json.load(sys.stdin):
            result = {"name": case["name"], "ok": False, "error": None, "values": {}}
            try:
                result["values"] = read(case, output_dir)
                result["ok"] = True
            except Exception as exc:
                result["error"] = f"{type(exc).__name__}: {exc}"
            results.append(result)
    with open(out_path, "w") as out:
        json.dump({"version": trl.__version__, "cases": results}, out)
