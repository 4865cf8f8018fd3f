"""A stand-in for `python3 -m verl.trainer.main_ppo` in the Jobs-API lifecycle tests (no GPU here): it reads the
same Hydra overrides the verl engine passes, resumes from trainer.default_local_dir as verl's resume_mode=auto
does, and writes what verl's FileLogger writes ({"step": N, "data": {...}} lines with verl's metric names, the file
opened "wb" as FileLogger opens it), checkpointing (latest_checkpointed_iteration.txt) before logging a step as
verl's trainer does. It does not train: the val reward follows a fixed saturating curve of the step.

Like verl at start, it checks the cluster: fewer free GPUs than its pools need (trainer.nnodes x
trainer.n_gpus_per_node) fails with verl's ValueError message; otherwise it holds them in a placement group while it
runs, so Ray sees them busy as it would see verl's workers.

STANDIN_STEP_SECONDS: seconds per step (default 0.1). STANDIN_CRASH_FILE: if that file exists and holds a step
number, the job dies (exit 1) at that step once, deleting the file.
"""

import json
import math
import os
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> None:
    overrides = dict(arg.split("=", 1) for arg in argv)
    checkpoints = Path(overrides["trainer.default_local_dir"].strip("'"))
    latest = checkpoints / "latest_checkpointed_iteration.txt"
    step = int(latest.read_text()) if overrides["trainer.resume_mode"] == "auto" and latest.exists() else 0
    total, save_freq = int(overrides["trainer.total_training_steps"]), int(overrides["trainer.save_freq"])
    test_freq, samples = int(overrides["trainer.test_freq"]), int(overrides["actor_rollout_ref.rollout.val_kwargs.n"])
    seconds = float(os.environ.get("STANDIN_STEP_SECONDS", "0.1"))
    crash = Path(os.environ.get("STANDIN_CRASH_FILE", "/nonexistent"))
    metric = f"val-core/rlscale/reward/mean@{samples}"
    hold_gpus(int(overrides["trainer.nnodes"]) * int(overrides["trainer.n_gpus_per_node"]))
    log = open(os.environ["VERL_FILE_LOGGER_PATH"], "wb", buffering=0)

    def write(data: dict) -> None:
        log.write(json.dumps({"step": step, "data": data}).encode() + b"\n")

    def val() -> dict:
        return {metric: 0.2 + 0.6 * (1 - math.exp(-step / 20))}

    if overrides["trainer.val_before_train"] == "true":
        write(val())
    while step < total:
        step += 1
        time.sleep(seconds)
        if crash.exists() and int(crash.read_text()) == step:
            crash.unlink()
            os._exit(1)
        data = {"timing_s/step": seconds, "response_length/mean": 4.0 + step % 3, "response_length/clip_ratio": 0.0,
                "critic/score/mean": 0.5, "actor/entropy": 1.0, "actor/pg_clipfrac": 0.01, "actor/grad_norm": 0.5}
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
