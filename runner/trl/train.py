"""The TRL job, `python -m rlscale.runner.trl.train SPEC.json`: GRPOTrainer from the run's last checkpoint to the
spec's until_step, a JSON record per rlscale step. Exits 2 when TRL is missing, 3 when the job's GPUs are not there."""

import json
import sys
from pathlib import Path


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    import torch
    from rlscale.planner.recipe import Recipe
    from rlscale.runner.jobs_api import RunDir

    from .job import DEVICES_TAKEN, last_checkpoint

    recipe = Recipe.model_validate(spec["recipe"])
    if not spec.get("use_vllm", spec.get("config", {}).get("use_vllm")):
        sys.modules.setdefault("vllm", None)  # TRL imports an installed vLLM it will not use: half the job's start
    if spec["gpus"]:
        if torch.cuda.device_count() < 1:
            print(DEVICES_TAKEN, file=sys.stderr)
            sys.exit(3)
    else:
        torch.set_num_threads(int(spec["devices"]))  # the CPU cores the job holds
    try:
        import trl
    except ImportError as err:
        print(f"engine: trl needs the package trl ({err})", file=sys.stderr)
        sys.exit(2)
    if "setup" in spec:  # a study on the user's own `trl grpo` YAML
        from .setup_train import train_setup

        return train_setup(spec, recipe)
    from rlscale.runner.rl.policy import model_path
    from rlscale.runner.rl.tasks import make_task
    from transformers import AutoTokenizer

    from .callback import RecordCallback
    from .data import train_dataset, validation_prompts
    from .reward import task_reward

    model = str(Path(model_path(recipe.model)))
    tokenizer = AutoTokenizer.from_pretrained(model)
    task = make_task(recipe)
    config = trl.GRPOConfig(**spec["config"])
    records = RecordCallback(
        recipe,
        task,
        tokenizer,
        validation_prompts(task, recipe),
        Path(spec["log_file"]),
        until_step=int(spec["until_step"]),
    )
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=[task_reward(task)],
        args=config,
        train_dataset=train_dataset(task),
        processing_class=tokenizer,
        callbacks=[records],
    )
    last = last_checkpoint(RunDir(Path(config.output_dir).parent))
    try:
        trainer.train(resume_from_checkpoint=str(last) if last else None)
    finally:
        records.close()


if __name__ == "__main__":
    main(sys.argv[1])
