"""The TRL job: `python -m rlscale.runner.trl.train SPEC.json` (engine.py submits it through Ray's Jobs API).

It trains the spec's recipe with trl.GRPOTrainer and the spec's GRPOConfig, from the run's last checkpoint if there
is one (resume_from_checkpoint), and stops at the spec's until_step with a checkpoint. A callback writes one JSON
line per rlscale step to the spec's log_file: {"step", "time" (epoch seconds), "val_reward" (None between evals),
"metrics" (TRL's logs of that update)}; step 0 (before any update) is evaluated only on a fresh run. The validation
pass rate is the builtin engine's: eval_samples samples at the recipe's temperature per held-out prompt, the mean
verifier reward. A spec with a "setup" part trains the user's own `trl grpo` YAML instead (setup_train.py). Exit 2
with one line when TRL is missing; exit 3 when the job's GPUs are not there.
"""

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
    from rlscale.runner.rl.tasks import make_task
    from transformers import AutoTokenizer

    from .callback import RecordCallback
    from .data import train_dataset, validation_prompts
    from .reward import task_reward

    model = str(_model_dir(recipe.model))
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


def _model_dir(model: str) -> Path:
    if model == "tiny":
        from rlscale.runner.rl.policy import base_model_dir

        return base_model_dir()
    return Path(model)


if __name__ == "__main__":
    main(sys.argv[1])
