"""A recipe as a production configuration: verl (Hydra YAML), TRL (GRPOConfig YAML), OpenRLHF (CLI), rlscale YAML.

The key map is DESIGN.md section 7. Every target file says, in comments, what the target cannot express
(a `# not expressible:` block), so nobody silently trains a different recipe.
"""

import yaml

from rlscale.planner.recipe import Recipe

FORMATS = ("verl", "trl", "openrlhf", "yaml")


def export_config(recipe: Recipe, fmt: str, *, header: list[str] | None = None) -> str:
    """The text of `recipe` in format `fmt`; `header` lines (provenance) go on top as comments."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    body, missing = {"verl": verl_config, "trl": trl_config, "openrlhf": openrlhf_command, "yaml": rlscale_yaml}[fmt](recipe)
    lines = [f"# {line}" for line in (header or [])]
    if missing:
        lines.append("# not expressible:")
        lines += [f"#   - {item}" for item in missing]
    return "\n".join(lines) + ("\n" if lines else "") + body


def _yaml(data: dict) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def _common_missing(recipe: Recipe, target: str) -> list[str]:
    """ScaleRL knobs none of the production targets has a key for."""
    missing = []
    if recipe.zero_variance_filter:
        missing.append(f"zero_variance_filter: true (drop all-pass/all-fail prompts from the loss) has no {target} key")
    if recipe.no_positive_resampling is not None:
        missing.append(f"no_positive_resampling: {recipe.no_positive_resampling} (retire prompts above this pass rate) "
                       f"has no {target} key; filter the dataset between epochs instead")
    if recipe.async_mode != "sync":
        missing.append(f"async: {recipe.async_mode} (max_staleness {recipe.max_staleness}) is not configured here; "
                       f"this file describes on-policy training")
    if recipe.length_control == "interrupt":
        missing.append(f"length_control: interrupt (append an end-of-thinking marker at the limit) has no {target} key; "
                       f"responses are truncated")
    if recipe.lr_scaling == "sqrt":
        missing.append(f"lr_scaling: sqrt is applied: lr {recipe.lr:g} x sqrt({recipe.total_batch}/{recipe.lr_reference_batch})"
                       f" = {recipe.scaled_lr:.4g}")
    return missing


def verl_config(recipe: Recipe) -> tuple[str, list[str]]:
    """verl Hydra overrides as nested YAML (ppo_trainer keys), and what verl cannot express."""
    low, high = recipe.clip_range
    missing = _common_missing(recipe, "verl")
    loss_mode = {"cispo": "cispo", "gspo": "gspo", "dapo": "vanilla", "grpo": "vanilla"}[recipe.loss]
    agg = {"token": "token-mean", "sample": "seq-mean-token-mean", "prompt": "token-mean"}[recipe.loss_agg]
    if recipe.loss_agg == "prompt":
        missing.append("loss_agg: prompt (token mean per prompt group, then mean over prompts) has no verl mode; "
                       "token-mean (the nearest) is used")
    if recipe.adv_norm == "batch":
        missing.append("adv_norm: batch (divide by the batch std) has no verl key; norm_adv_by_std_in_grpo: false "
                       "(group mean only; the batch std is one scale factor on the step size)")
    if recipe.fp32_head:
        missing.append("fp32_head: true (LM head and logits in fp32) has no verl key")
    actor = {
        "optim": {"lr": recipe.scaled_lr, "weight_decay": recipe.weight_decay},
        "clip_ratio_low": low,
        "clip_ratio_high": high,
        "policy_loss": {"loss_mode": loss_mode},
        "loss_agg_mode": agg,
        "use_kl_loss": recipe.kl_coef > 0,
        "kl_loss_coef": recipe.kl_coef,
        "kl_loss_type": "low_var_kl",  # k3, as rlscale's kl_coef
        "entropy_coeff": recipe.entropy_coef,
        "grad_clip": recipe.grad_clip,
    }
    config = {
        "data": {"train_batch_size": recipe.prompts_per_batch, "max_response_length": recipe.max_new_tokens},
        "actor_rollout_ref": {
            "model": {"path": recipe.model},
            "actor": actor,
            "rollout": {"n": recipe.rollouts, "temperature": recipe.temperature},
        },
        "algorithm": {"adv_estimator": "grpo", "norm_adv_by_std_in_grpo": recipe.adv_norm == "group",
                      "use_kl_in_reward": False},
        "trainer": {"total_training_steps": recipe.steps, "seed": recipe.seed},
    }
    return _yaml(config), missing


def trl_config(recipe: Recipe) -> tuple[str, list[str]]:
    """trl.GRPOConfig keyword arguments as YAML (one process), and what TRL cannot express."""
    low, high = recipe.clip_range
    missing = _common_missing(recipe, "TRL")
    loss_type = {"cispo": "cispo", "dapo": "dapo", "grpo": "grpo", "gspo": "grpo"}[recipe.loss]
    # TRL's loss_type fixes the aggregation: dapo/cispo normalise by all tokens, grpo per sequence
    native_agg = "sample" if loss_type == "grpo" else "token"
    if recipe.loss_agg != native_agg:
        missing.append(f"loss_agg: {recipe.loss_agg} with loss {recipe.loss}: TRL's loss_type {loss_type!r} "
                       f"aggregates by {native_agg}")
    config = {
        "learning_rate": recipe.scaled_lr,
        "max_steps": recipe.steps,
        "num_generations": recipe.rollouts,
        # prompts per step = per_device_train_batch_size x processes / num_generations (one process here:
        # with N processes divide per_device_train_batch_size by N)
        "per_device_train_batch_size": recipe.total_batch,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": 1,
        "loss_type": loss_type,
        "importance_sampling_level": "sequence" if recipe.loss == "gspo" else "token",
        "epsilon": low,
        "epsilon_high": high,
        "scale_rewards": {"batch": "batch", "group": "group", "none": "none"}[recipe.adv_norm],
        "beta": recipe.kl_coef,
        "entropy_coef": recipe.entropy_coef,
        "max_completion_length": recipe.max_new_tokens,
        "temperature": recipe.temperature,
        "cast_lm_head_to_fp32": recipe.fp32_head,
        "max_grad_norm": recipe.grad_clip,
        "weight_decay": recipe.weight_decay,
        "seed": recipe.seed,
    }
    missing.append(f"model: {recipe.model} and task: {recipe.task} are passed to GRPOTrainer (model, train_dataset, "
                   "reward_funcs), not to GRPOConfig")
    return _yaml(config), missing


def openrlhf_command(recipe: Recipe) -> tuple[str, list[str]]:
    """An OpenRLHF `train_ppo_ray` command line (dotted flags), and what OpenRLHF cannot express."""
    low, high = recipe.clip_range
    missing = _common_missing(recipe, "OpenRLHF")
    policy_loss = "gspo" if recipe.loss == "gspo" else "ppo"
    if recipe.loss in ("cispo", "dapo"):
        missing.append(f"loss: {recipe.loss} has no OpenRLHF policy_loss_type; ppo (the nearest) is used")
    if low != high:
        missing.append(f"asymmetric clip ({low:g} low / {high:g} high): --actor.eps_clip takes one value; {low:g} is used")
    if recipe.adv_norm == "batch":
        missing.append("adv_norm: batch has no flag; the group std normalisation default is kept")
    missing.append(f"loss_agg: {recipe.loss_agg} has no flag")
    if recipe.fp32_head:
        missing.append("fp32_head: true (LM head and logits in fp32) has no flag")
    missing.append(f"steps: {recipe.steps} has no flag: OpenRLHF counts episodes over the prompt dataset; one "
                   f"episode of P prompts is P / {recipe.prompts_per_batch} steps, so set "
                   f"--train.num_episodes >= {recipe.steps} x {recipe.prompts_per_batch} / P")
    flags = [
        ("--actor.model_name_or_path", recipe.model),
        ("--rollout.batch_size", recipe.prompts_per_batch),
        ("--rollout.n_samples_per_prompt", recipe.rollouts),
        ("--rollout.max_new_tokens", recipe.max_new_tokens),
        ("--rollout.temperature", recipe.temperature),
        ("--train.num_episodes", 1),
        ("--actor.adam.lr", f"{recipe.scaled_lr:.6g}"),
        ("--actor.eps_clip", low),
        ("--actor.policy_loss_type", policy_loss),
        ("--actor.entropy_coef", recipe.entropy_coef),
        ("--algo.kl.init_coef", recipe.kl_coef),
        ("--seed", recipe.seed),
    ]
    lines = ["python -m openrlhf.cli.train_ppo_ray \\"]
    lines += [f"  {flag} {value} \\" for flag, value in flags]
    if recipe.adv_norm == "none":
        lines.append("  --algo.advantage.no_std_norm \\")
    lines[-1] = lines[-1].rstrip(" \\")
    return "\n".join(lines) + "\n", missing


def rlscale_yaml(recipe: Recipe) -> tuple[str, list[str]]:
    """The full recipe as an rlscale recipe file (every key explicit; `load_recipe` reads it back)."""
    return _yaml(recipe.to_json()), []
