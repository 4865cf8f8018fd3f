"""The TRL job of a study on the user's own `trl grpo` YAML: what `trl grpo --config FILE` does on rlscale's config,
plus rlscale's data loading, eval records, resumes and planned LR decay. A SIGTERM exits so trackers flush."""

import signal
import sys
from pathlib import Path


def train_setup(spec: dict, recipe) -> None:
    """Train the spec's segment; returns when it reached its until_step (checkpointed there)."""
    from rlscale.runner.jobs_api import RunDir
    from trl import get_peft_config, get_quantization_config

    from .callback import EvalRecordCallback
    from .job import last_checkpoint
    from .user_config import parse_file
    from .user_data import load_splits
    from .user_rewards import importable, reward_functions

    setup = spec["setup"]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    script_args, config, model_args, mixture = parse_file(setup["config_file"])
    run_dir = RunDir(Path(config.output_dir).parent)
    funcs = reward_functions(script_args, paths=setup["import_paths"], file=setup["config_file"])
    model_init_kwargs = dict(
        revision=model_args.model_revision,
        trust_remote_code=config.trust_remote_code,
        attn_implementation=model_args.attn_implementation,
        dtype=model_args.dtype,
    )
    config.model_init_kwargs = {**model_init_kwargs, **(config.model_init_kwargs or {})}
    train, held_out = load_splits(script_args, mixture, eval_prompts=int(setup["eval_prompts"]))
    records = EvalRecordCallback(
        recipe,
        Path(spec["log_file"]),
        until_step=int(spec["until_step"]),
        updates=int(setup["updates"]),
        metric=setup["reward_metric"],
    )
    with importable(setup["import_paths"]):  # a reward module may import its siblings while it runs
        trainer = trainer_class(setup.get("lr_decay_updates"))(
            model=model_args.model_name_or_path,
            reward_funcs=funcs,
            args=config,
            train_dataset=train,
            eval_dataset=held_out,
            callbacks=[records],
            quantization_config=get_quantization_config(model_args),
            peft_config=get_peft_config(model_args),
        )
        last = last_checkpoint(run_dir)
        try:
            trainer.train(resume_from_checkpoint=str(last) if last else None)
        finally:
            records.close()
    if hasattr(trainer, "end"):  # transformers >= 5.18: finish the trackers
        trainer.end()


def trainer_class(lr_decay_updates: int | None):
    """GRPOTrainer, its learning-rate schedule decaying over `lr_decay_updates` optimizer updates when given
    (transformers fits it to max_steps; a resumed segment rebuilds it alike, its step restored from the checkpoint)."""
    import trl

    if not lr_decay_updates:
        return trl.GRPOTrainer

    class PlannedScheduleTrainer(trl.GRPOTrainer):
        def create_scheduler(self, num_training_steps: int, optimizer=None):
            return super().create_scheduler(num_training_steps=lr_decay_updates, optimizer=optimizer)

    return PlannedScheduleTrainer
