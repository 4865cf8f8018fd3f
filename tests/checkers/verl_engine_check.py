"""Run inside .venv-verl (scripts/checker_envs.sh): verl 0.9.1 itself reads what rlscale's verl engine generates.

stdin: JSON {"overrides", "modules", "tokenizer", "reward_cases", "logger"} (rlscale's own task), or
{"setup": {"command", "user_command", "tokenizer", "reward_cases"}} (a user's setup). Writes JSON to argv[1]:
- config: verl's Hydra config (ppo_trainer.yaml) composed with the engine's overrides and passed through
  `verl.utils.config.validate_config`; the values the engine relies on read back from it.
- dataset: the train and validation parquet files loaded by verl's RLHFDataset (the tokenizer in "tokenizer"),
  rows as verl's __getitem__ returns them.
- rewards: verl's get_custom_reward_fn loads rlscale's reward function from the config (`modules` on sys.path, as
  the job's py_modules put it there on the cluster) and each reward case is scored as verl's reward loop calls it.
- logged: verl's FileLogger (VERL_FILE_LOGGER_PATH) writes one line per step, with metrics made by verl's own
  functions (compute_data_metrics, compute_timing_metrics, compute_throughout_metrics with the spec's n_gpus, the v1
  trainer's validation metrics) from the given numbers.
- setup_config: the job's command (main_ppo's arguments: --config-path/--config-name, overrides) and the user's own
  command composed by verl's Hydra config, the job's passed through validate_config (reference policy and critic as
  main_ppo decides them); both as flat dotted leaves, with verl's migrate_legacy_reward_impl applied to the user's
  config for its reward block, and the actor's optimizer as verl's dataclass reads it.
- setup_dataset, setup_rewards: as dataset and rewards, on the job's config (the user's parquet and reward function).
"""

import json
import os
import sys
import traceback

import numpy as np
import torch
import verl
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict
from verl import DataProto
from verl.trainer.ppo import metric_utils
from verl.trainer.ppo.metric_utils import compute_data_metrics, compute_throughout_metrics, compute_timing_metrics
from verl.trainer.ppo.reward import get_custom_reward_fn
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import omega_conf_to_dataclass, validate_config
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.utils.tracking import FileLogger

VERL_CONFIG = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")


def _compose(words):
    """verl's config as main_ppo composes it from its arguments (Hydra flags --config-path/--config-name, then
    overrides)."""
    flags = dict(word[2:].split("=", 1) for word in words if word.startswith("--"))
    with initialize_config_dir(config_dir=flags.get("config-path", VERL_CONFIG), version_base=None):
        return compose(
            config_name=flags.get("config-name", "ppo_trainer"),
            overrides=[word for word in words if not word.startswith("--")],
        )


def _validated(cfg):
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    return cfg


def _config(overrides):
    cfg = _validated(_compose(overrides))
    rollout, trainer = cfg.actor_rollout_ref.rollout, cfg.trainer
    values = {
        "model_path": cfg.actor_rollout_ref.model.path,
        "train_files": cfg.data.train_files,
        "val_files": cfg.data.val_files,
        "reward_path": cfg.reward.custom_reward_function.path,
        "reward_name": cfg.reward.custom_reward_function.name,
        "val_n": rollout.val_kwargs.n,
        "val_temperature": rollout.val_kwargs.temperature,
        "val_do_sample": rollout.val_kwargs.do_sample,
        "temperature": rollout.temperature,
        "test_freq": trainer.test_freq,
        "val_before_train": trainer.val_before_train,
        "total_training_steps": trainer.total_training_steps,
        "save_freq": trainer.save_freq,
        "resume_mode": trainer.resume_mode,
        "default_local_dir": trainer.default_local_dir,
        "logger": list(trainer.logger),
        "nnodes": trainer.nnodes,
        "n_gpus_per_node": trainer.n_gpus_per_node,
        "rollout_n_gpus_per_node": rollout.get("n_gpus_per_node"),
        "train_batch_size": cfg.data.train_batch_size,
        "n": rollout.n,
    }
    return cfg, values


def _dataset(cfg, tokenizer_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    out = {"tokenizer": type(tokenizer).__name__}
    for split, files in (("train", cfg.data.train_files), ("val", cfg.data.val_files)):
        dataset = RLHFDataset(data_files=files, tokenizer=tokenizer, config=cfg.data)
        row = dataset[0]
        out[split] = {
            "len": len(dataset),
            "raw_prompt": list(row["raw_prompt"]),
            "data_source": row["data_source"],
            "ground_truth": row["reward_model"]["ground_truth"],
            "ability": row.get("ability"),
            "extra_info": dict(row["extra_info"]),
        }
    return out


def _rewards(cfg, cases):
    fn = get_custom_reward_fn(cfg)
    # as verl's reward loop (experimental/reward_loop/reward_manager/naive.py) calls compute_score: by keyword
    return [
        float(
            fn(
                data_source=c["data_source"],
                solution_str=c["solution_str"],
                ground_truth=c["ground_truth"],
                extra_info=c["extra_info"],
            )
        )
        for c in cases
    ]


def _compiled(relative, name, namespace, cls=None):
    """A function (or `cls`'s method) of one of verl's modules, compiled from its source alone: importing the module
    pulls in the whole training stack (FSDP, vLLM server, peft); it runs with `namespace` in scope."""
    import ast

    path = os.path.join(os.path.dirname(verl.__file__), *relative.split("/"))
    body = ast.parse(open(path).read()).body
    if cls is not None:
        body = next(node for node in body if isinstance(node, ast.ClassDef) and node.name == cls).body
    function = next(node for node in body if isinstance(node, ast.FunctionDef) and node.name == name)
    exec(compile(ast.Module(body=[function], type_ignores=[]), path, "exec"), namespace)
    return namespace[name]


def _trainer_method(name):
    """A method of verl 0.9.1's v1 PPOTrainer (the trainer main_ppo runs), with metric_utils' names in scope."""
    return _compiled("trainer/ppo/v1/trainer_base.py", name, {**vars(metric_utils), "np": np}, cls="PPOTrainer")


def _batch(scores, lengths, max_response, prompt_len=3):
    """A DataProto as the trainer holds it after a step: B responses of `lengths` tokens, rewards `scores`."""
    count = len(scores)
    response_mask = torch.zeros(count, max_response)
    for i, length in enumerate(lengths):
        response_mask[i, :length] = 1
    token_scores = torch.zeros(count, max_response)
    for i, (score, length) in enumerate(zip(scores, lengths)):
        token_scores[i, max(length - 1, 0)] = score
    return DataProto.from_dict(
        tensors={
            "token_level_scores": token_scores,
            "token_level_rewards": token_scores.clone(),
            "advantages": token_scores.clone(),
            "returns": token_scores.clone(),
            "prompts": torch.ones(count, prompt_len, dtype=torch.long),
            "responses": torch.ones(count, max_response, dtype=torch.long),
            "attention_mask": torch.cat([torch.ones(count, prompt_len), response_mask], dim=1).long(),
            "response_mask": response_mask,
        }
    )


def _log(spec):
    os.environ["VERL_FILE_LOGGER_PATH"] = spec["path"]
    logger = FileLogger(project_name="rlscale", experiment_name="check")
    for step in spec["steps"]:
        data = {}
        if step.get("scores"):
            batch = _batch(step["scores"], step["response_lengths"], spec["max_response_length"])
            data.update(compute_data_metrics(batch, use_critic=False))
            data.update(compute_timing_metrics(batch, step["timing"]))
            # the trainer's throughput: tokens / (step seconds x its GPUs), as trainer_base.py logs it
            batch.meta_info["global_token_num"] = batch.batch["attention_mask"].sum(-1).tolist()
            data.update(compute_throughout_metrics(batch, step["timing"], spec.get("n_gpus", 4)))
        data.update(step.get("actor", {}))
        if step.get("val_scores"):
            scores = step["val_scores"]  # prompt-major: each prompt's samples together
            k = spec["val_samples"]
            uids = [f"p{i // k}" for i in range(len(scores))]
            # a float score, as rlscale's compute_score returns: verl's naive reward manager files it as `acc` too
            data.update(
                _trainer_method("_val_metrics_update")(
                    None, [spec["data_source"]] * len(scores), uids, {"reward": scores, "acc": scores}, []
                )
            )
        logger.log(data=data, step=step["step"])
    logger.finish()
    return len(spec["steps"])


def _leaves(cfg):
    """The config's leaves as {dotted key: value}, interpolations as written (a key set through another is not a
    change of its own)."""

    def walk(node, prefix):
        if isinstance(node, dict) and node:
            for key, value in node.items():
                yield from walk(value, f"{prefix}{key}.")
        else:
            yield prefix[:-1], node

    return dict(walk(OmegaConf.to_container(cfg, resolve=False), ""))


def _setup(setup):
    """The job's config and the user's own, as verl composes them; the job's validated."""
    job = _validated(_compose(setup["command"]))
    user = _compose(setup["user_command"])
    migrate = _compiled(
        "experimental/reward_loop/reward_loop.py", "migrate_legacy_reward_impl", {"open_dict": open_dict}
    )
    migrated = migrate(OmegaConf.create(OmegaConf.to_container(user)))
    optim = omega_conf_to_dataclass(job.actor_rollout_ref.actor.optim)
    return {
        "job": _leaves(job),
        "user": _leaves(user),
        "user_reward_migrated": _leaves(migrated.reward),
        "optim": {
            "lr_scheduler_type": optim.lr_scheduler_type,
            "lr_warmup_steps": optim.lr_warmup_steps,
            "lr_warmup_steps_ratio": optim.lr_warmup_steps_ratio,
        },
        "reference_policy": need_reference_policy(job),
        "critic": need_critic(job),
    }


if __name__ == "__main__":
    spec = json.load(sys.stdin)
    result = {"version": verl.__version__}
    if "setup" in spec:
        setup = spec["setup"]
        parts = (
            ("setup_config", lambda: _setup(setup)),
            ("setup_dataset", lambda: _dataset(_compose(setup["command"]), setup["tokenizer"])),
            ("setup_rewards", lambda: _rewards(_compose(setup["command"]), setup["reward_cases"])),
        )
    else:
        sys.path.insert(0, spec["modules"])  # what the job's runtime env py_modules does on the cluster
        parts = (
            ("config", lambda: _config(spec["overrides"])[1]),
            ("dataset", lambda: _dataset(_config(spec["overrides"])[0], spec["tokenizer"])),
            ("rewards", lambda: _rewards(_config(spec["overrides"])[0], spec["reward_cases"])),
            ("logged", lambda: _log(spec["logger"])),
        )
    for name, part in parts:
        try:
            result[name] = part()
        except BaseException as err:  # each part reports its own failure
            result[name + "_error"] = f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=5)}"
    with open(sys.argv[1], "w") as out:
        json.dump(result, out, default=str)
