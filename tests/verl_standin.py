"""A stand-in for `python3 -m verl.trainer.main_ppo` in the Jobs-API lifecycle tests (no GPU here): it reads the
same Hydra overrides the verl engine passes, resumes from trainer.default_local_dir as verl's resume_mode=auto
does, and writes what verl's FileLogger writes ({"step": N, "data": {...}} lines with verl's metric names, the file
opened "wb" as FileLogger opens it), checkpointing (latest_checkpointed_iteration.txt) before logging a step as
verl's trainer does. It does not train: the val reward follows a fixed saturating curve of the step.

Like verl at start, it checks the cluster: fewer free GPUs than its pools need (trainer.nnodes x
trainer.n_gpus_per_node) fails with verl's ValueError message; otherwise it holds them in a placement group while it
runs, so Ray sees them busy as it would see verl's workers.

With a user's setup it also reads what verl reads of it: their YAML (--config-path/--config-name, its keys under
the overrides), their parquet files (data.train_files, data.val_files) and their reward function
(reward.custom_reward_function.path/name), which it calls as verl's reward loop does, by keyword, on responses that
are right for a growing share of the validation prompts. Validation metrics are named as verl 0.9.1 names them
(trainer/ppo/v1/trainer_base.py, _val_metrics_update): a float reward is also verl's `acc`, which then is the
val-core variable and the reward val-aux.

STANDIN_STEP_SECONDS: seconds per step (default 0.1). STANDIN_CRASH_FILE: if that file exists and holds a step
number, the job dies (exit 1) at that step once, deleting the file.
"""

import json
import math
import os
import sys
import time
from pathlib import Path


def read_overrides(argv: list[str]) -> dict[str, str]:
    """The config as flat `key: text`: the user's YAML leaves (if any), then the overrides in order."""
    flags = dict(arg[2:].split("=", 1) for arg in argv if arg.startswith("--"))
    overrides = {}
    if "config-path" in flags:
        import yaml

        config = yaml.safe_load((Path(flags["config-path"]) / f"{flags['config-name']}.yaml").read_text())
        overrides.update(flatten({k: v for k, v in config.items() if k not in ("defaults", "hydra")}))
    overrides.update(arg.lstrip("+").split("=", 1) for arg in argv if not arg.startswith(("--", "~")))
    return {key: value.strip("'") for key, value in overrides.items()}


def flatten(data: dict, prefix: str = "") -> dict[str, str]:
    out = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


def curve(step: int) -> float:
    """The share of right answers at `step`: a saturating curve from 0.2."""
    return 0.2 + 0.6 * (1 - math.exp(-step / 20))


def verl_val_metrics(sources: list[str], rewards: list, samples: int) -> dict:
    """verl 0.9.1's mean@n validation metrics of per-response rewards (a float, or a dict with "score")."""
    by_source: dict[str, dict[str, list]] = {}
    for source, reward in zip(sources, rewards):
        values = by_source.setdefault(source, {})
        if isinstance(reward, dict):
            values.setdefault("reward", []).append(float(reward["score"]))
            for key, value in reward.items():
                values.setdefault(key, []).append(float(value))
        else:  # verl's naive reward manager files a float score as `acc` too
            values.setdefault("reward", []).append(float(reward))
            values.setdefault("acc", []).append(float(reward))
    out = {}
    for source, values in by_source.items():
        core = "acc" if "acc" in values else "reward"
        for name, scores in values.items():
            section = "val-core" if name == core else "val-aux"
            out[f"{section}/{source}/{name}/mean@{samples}"] = sum(scores) / len(scores)
    return out


def user_reward(overrides: dict, samples: int):
    """val(step) -> verl's validation metrics from the user's val parquet scored by the user's reward function."""
    import importlib.util

    import pyarrow.parquet as pq

    def rows(key: str) -> list[dict]:
        names = overrides[key].strip("[]").split(",")
        return [row for name in names for row in pq.read_table(name.strip().strip("'\"")).to_pylist()]

    assert all(row["prompt"][0]["content"] for row in rows("data.train_files"))  # verl's dataset reads the prompt
    held_out = rows("data.val_files")
    spec = importlib.util.spec_from_file_location("user_reward", overrides["reward.custom_reward_function.path"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    score = getattr(module, overrides.get("reward.custom_reward_function.name", "compute_score"))

    def val(step: int) -> dict:
        right = curve(step) * len(held_out) * samples
        sources, rewards = [], []
        for index, row in enumerate(held_out):
            truth = row["reward_model"]["ground_truth"]
            for sample in range(samples):
                answer = f"#### {truth}" if index * samples + sample < right else "#### none"
                rewards.append(
                    score(
                        data_source=row["data_source"],
                        solution_str=answer,
                        ground_truth=truth,
                        extra_info=row.get("extra_info") or {},
                    )
                )
                sources.append(row["data_source"])
        return verl_val_metrics(sources, rewards, samples)

    return val


def main(argv: list[str]) -> None:
    overrides = read_overrides(argv)
    checkpoints = Path(overrides["trainer.default_local_dir"].strip("'"))
    latest = checkpoints / "latest_checkpointed_iteration.txt"
    step = int(latest.read_text()) if overrides["trainer.resume_mode"] == "auto" and latest.exists() else 0
    total, save_freq = int(overrides["trainer.total_training_steps"]), int(overrides["trainer.save_freq"])
    test_freq = int(overrides["trainer.test_freq"])
    samples = int(overrides.get("actor_rollout_ref.rollout.val_kwargs.n", 1))
    seconds = float(os.environ.get("STANDIN_STEP_SECONDS", "0.1"))
    crash = Path(os.environ.get("STANDIN_CRASH_FILE", "/nonexistent"))
    hold_gpus(int(overrides["trainer.nnodes"]) * int(overrides["trainer.n_gpus_per_node"]))
    log = open(os.environ["VERL_FILE_LOGGER_PATH"], "wb", buffering=0)

    def write(data: dict) -> None:
        log.write(json.dumps({"step": step, "data": data}).encode() + b"\n")

    reward_file = overrides.get("reward.custom_reward_function.path", "pkg://")
    scored = None if reward_file.startswith("pkg://") else user_reward(overrides, samples)

    def val() -> dict:
        if scored is not None:
            return scored(step)
        return verl_val_metrics(["rlscale"], [curve(step)], samples)  # rlscale's task: its float pass rate

    if overrides["trainer.val_before_train"] == "true":
        write(val())
    while step < total:
        step += 1
        time.sleep(seconds)
        if crash.exists() and int(crash.read_text()) == step:
            crash.unlink()
            os._exit(1)
        data = {
            "timing_s/step": seconds,
            "response_length/mean": 4.0 + step % 3,
            "response_length/clip_ratio": 0.0,
            "critic/score/mean": 0.5,
            "actor/entropy": 1.0,
            "actor/pg_clipfrac": 0.01,
            "actor/grad_norm": 0.5,
        }
        if step % test_freq == 0 or step == total:
            data.update(val())
        if step % save_freq == 0 or step == total:
            checkpoints.mkdir(parents=True, exist_ok=True)
            latest.write_text(str(step))
        write(data)
    log.close()


def hold_gpus(gpus: int) -> None:
    """verl's start-up check (ResourcePoolManager._check_resource_available), then the GPUs held until exit."""
    import ray
    from ray.util.placement_group import placement_group

    ray.init(logging_level="ERROR", log_to_driver=False)
    available = ray.available_resources().get("GPU", 0)
    if available < gpus:
        raise ValueError(f"Total available GPUs {available} is less than total desired GPUs {gpus}")
    group = placement_group([{"GPU": 1}] * gpus, strategy="PACK")
    ray.get(group.ready(), timeout=60)


if __name__ == "__main__":
    main(sys.argv[1:])
