"""verl 0.9.1: a recipe as Hydra overrides of verl's `ppo_trainer` config (`python3 -m verl.trainer.main_ppo`).
Read from verl/trainer/config/ppo_trainer.yaml, workers/config/actor.py, trainer/ppo/core_algos.py, trainer/ppo/v1/."""

import re

from rlscale.planner.recipe import Recipe

from .common import (
    MODEL_PLACEHOLDER,
    TRAIN_DATA_PLACEHOLDER,
    VAL_DATA_PLACEHOLDER,
    Deployment,
    Mapping,
    common_missing,
    launch_script,
    minibatch_prompts,
)

FRAMEWORK, VERSION = "verl", "0.9.1"
ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"
# dual clip "off": verl clamps the log-ratio to [-20, 20], so a bound above e^20 (4.9e8) never binds; must be > 1
DUAL_CLIP_OFF = 1.0e9
# strings Hydra reads as themselves without quotes (names, paths); anything else is quoted
_PLAIN = re.compile(r"[A-Za-z_/.][A-Za-z0-9_./-]*")
_QUOTE_OR_END = re.compile(r"(\\*)('|$)")

# loss -> (policy_loss.loss_mode, extra actor keys)
LOSSES = {
    "cispo": ("cispo", {}),
    "gspo": ("gspo", {}),
    "dapo": ("vanilla", {"clip_ratio_c": DUAL_CLIP_OFF}),
    "grpo": ("vanilla", {"clip_ratio_c": DUAL_CLIP_OFF}),
}
# loss_agg -> (loss_agg_mode, difference or None when exact)
AGGREGATIONS = {
    "token": ("token-mean", None),
    "sample": ("seq-mean-token-mean", None),
    "prompt": (
        "token-mean",
        "loss_agg: prompt (token mean within each prompt's group, then mean over prompts) has "
        "no verl mode; token-mean weights each group by its token count instead of equally "
        "(the same when every group has as many response tokens)",
    ),
}
# adv_norm -> (algorithm keys, difference or None when exact)
ADVANTAGES = {
    "group": ({"adv_estimator": "grpo", "norm_adv_by_std_in_grpo": True}, None),
    "none": ({"adv_estimator": "grpo", "norm_adv_by_std_in_grpo": False}, None),
    "batch": (
        {"adv_estimator": "reinforce_plus_plus_baseline"},
        "adv_norm: batch -> reinforce_plus_plus_baseline (group mean, batch std): verl whitens (r - group mean) "
        "over the batch's response tokens (token-weighted std, mean re-subtracted); rlscale divides "
        "(r - group mean) by the std of the raw rewards of all B_p x n rollouts",
    ),
}


def verl_mapping(recipe: Recipe, deployment: Deployment | None = None) -> Mapping:
    """The recipe as verl 0.9.1 dotted Hydra keys: Mapping.recipe (same meaning as rlscale's) and
    Mapping.deployment (--gpus/--nodes layout), with what is only the nearest form and what is not expressible."""
    dep = deployment or Deployment()
    m = Mapping(FRAMEWORK, VERSION)
    low, high = recipe.clip_range
    loss_mode, loss_extra = LOSSES[recipe.loss]
    agg_mode, agg_diff = AGGREGATIONS[recipe.loss_agg]
    adv_keys, adv_diff = ADVANTAGES[recipe.adv_norm]
    m.nearest += [d for d in (agg_diff, adv_diff) if d]
    r = m.recipe
    # batch geometry: train_batch_size and ppo_mini_batch_size count prompts (verl multiplies by rollout.n)
    r["data.train_batch_size"] = recipe.prompts_per_batch
    r[f"{ROLLOUT}.n"] = recipe.rollouts
    r["trainer.total_training_steps"] = recipe.steps
    r[f"{ACTOR}.ppo_mini_batch_size"] = minibatch_prompts(recipe, m)  # = B_p: one optimizer update per batch
    r[f"{ACTOR}.ppo_epochs"] = 1
    r["data.max_response_length"] = recipe.max_new_tokens
    r[f"{ROLLOUT}.temperature"] = recipe.temperature
    r[f"{ACTOR}.optim.lr"] = recipe.scaled_lr
    r[f"{ACTOR}.optim.lr_warmup_steps"] = recipe.lr_warmup_steps
    r[f"{ACTOR}.optim.lr_scheduler_type"] = "constant"
    r[f"{ACTOR}.optim.weight_decay"] = recipe.weight_decay
    r[f"{ACTOR}.optim.clip_grad"] = recipe.grad_clip
    r[f"{ACTOR}.grad_clip"] = recipe.grad_clip
    # loss and clip bounds on the importance ratio r: [1 - low, 1 + high]; CISPO truncates its weight there
    r[f"{ACTOR}.policy_loss.loss_mode"] = loss_mode
    r[f"{ACTOR}.clip_ratio_low"] = min(low, 1.0) if recipe.loss == "cispo" else low
    r[f"{ACTOR}.clip_ratio_high"] = high
    r.update({f"{ACTOR}.{key}": value for key, value in loss_extra.items()})
    if "clip_ratio_c" in loss_extra:
        m.nearest.append(
            f"loss: {recipe.loss} -> vanilla PPO clip; verl's dual clip (clip_ratio_c, default 3.0) "
            f"cannot be switched off, so clip_ratio_c is {DUAL_CLIP_OFF:g}, above verl's ratio clamp "
            "e^20: it never binds"
        )
    r[f"{ACTOR}.loss_agg_mode"] = agg_mode
    r.update({f"algorithm.{key}": value for key, value in adv_keys.items()})
    # KL to the reference policy as a k3 loss term (low_var_kl is verl's k3), never as a reward penalty
    r["algorithm.use_kl_in_reward"] = False
    r[f"{ACTOR}.use_kl_loss"] = recipe.kl_coef > 0
    r[f"{ACTOR}.kl_loss_coef"] = recipe.kl_coef
    r[f"{ACTOR}.kl_loss_type"] = "low_var_kl"
    r[f"{ACTOR}.entropy_coeff"] = recipe.entropy_coef
    # zero-variance filter: DAPO's group filter drops all-pass / all-fail groups
    r["algorithm.filter_groups.enable"] = recipe.zero_variance_filter
    if recipe.zero_variance_filter:
        r["algorithm.filter_groups.metric"] = "reward"
        m.nearest.append(
            "zero_variance_filter: true -> algorithm.filter_groups: verl drops the same groups but "
            "generates more prompts until B_p informative groups fill the batch (more generation per "
            "step); rlscale trains on the smaller batch"
        )
    # seeds: verl has no trainer.seed; the data order, the actor's data loader, the generator and FSDP init
    r["data.seed"] = recipe.seed
    r[f"{ACTOR}.data_loader_seed"] = recipe.seed
    r[f"{ACTOR}.fsdp_config.seed"] = recipe.seed
    r[f"{ROLLOUT}.seed"] = recipe.seed
    pipeline = recipe.async_mode == "pipeline"
    r["trainer.v1.trainer_mode"] = "separate_async" if pipeline else "sync"
    if pipeline:
        r["trainer.v1.separate_async.parameter_sync_step"] = 1  # push weights after every update
        # verl drops a trajectory when (trainer step - its prompt's step + 1) > threshold: staleness > k
        r["trainer.v1.sampler.max_off_policy_threshold"] = recipe.max_staleness + 1
        r["trainer.v1.sampler.max_off_policy_strategy"] = "drop"
        m.nearest.append(
            f"async: pipeline (max_staleness {recipe.max_staleness}) -> separate_async with "
            "partial rollouts: a trajectory may span weight versions (rlscale generates each batch with "
            "one version); a batch more than max_staleness steps old is dropped in both"
        )
    if not recipe.recompute_logprobs:
        m.nearest.append(
            "recompute_logprobs: false: verl recomputes the old log-probs with the trainer (as "
            "recompute_logprobs: true); rlscale takes the generator's"
        )

    d = m.deployment
    rollout_gpus = dep.gpus_per_node // 2 if pipeline else 0
    d["trainer.nnodes"] = dep.nodes
    d["trainer.n_gpus_per_node"] = dep.gpus_per_node - rollout_gpus
    if pipeline:  # separate_async: the generator has GPUs of its own
        d[f"{ROLLOUT}.nnodes"] = dep.nodes
        d[f"{ROLLOUT}.n_gpus_per_node"] = rollout_gpus
        d[f"{ROLLOUT}.checkpoint_engine.backend"] = "nccl"
    d[f"{ROLLOUT}.name"] = "vllm"
    d[f"{ROLLOUT}.tensor_model_parallel_size"] = dep.tensor_parallel
    d[f"{ACTOR}.use_dynamic_bsz"] = True  # micro-batches packed to a token budget (rollout/ref log-probs follow)
    d[f"{ACTOR}.ppo_max_token_len_per_gpu"] = dep.tokens_per_gpu(recipe)
    d["data.max_prompt_length"] = dep.max_prompt_tokens
    d["actor_rollout_ref.model.path"] = recipe.model if recipe.model != "tiny" else MODEL_PLACEHOLDER
    d["data.train_files"] = TRAIN_DATA_PLACEHOLDER
    d["data.val_files"] = VAL_DATA_PLACEHOLDER

    m.missing += common_missing(recipe, "verl")
    if recipe.fp32_head:
        m.missing.append("fp32_head: true (LM head and logits in fp32, trainer and generator) has no verl key")
    if pipeline and dep.gpus_per_node < 2:
        m.missing.append(
            "async: pipeline needs separate generator GPUs in verl (separate_async); one GPU per node leaves none"
        )
    return m


# a user's verl setup (frameworks/setup.py): recipe field -> the key it is read from; RUN_KEYS: what each job sets
RECIPE_FROM_KEYS = {
    "prompts_per_batch": "data.train_batch_size",
    "rollouts": f"{ROLLOUT}.n",
    "model": "actor_rollout_ref.model.path",
    "max_new_tokens": "data.max_response_length",
    "lr": f"{ACTOR}.optim.lr",
    "temperature": f"{ROLLOUT}.temperature",
    "entropy_coef": f"{ACTOR}.entropy_coeff",
    "eval_samples": f"{ROLLOUT}.val_kwargs.n",
}
# no trainer.seed in verl: FSDP configs seed fsdp_config, Megatron ones megatron.seed; a job sets those present
PPO_TRAINER_SEEDS = (
    "data.seed",
    f"{ACTOR}.data_loader_seed",
    f"{ACTOR}.fsdp_config.seed",
    "actor_rollout_ref.ref.fsdp_config.seed",
    f"{ROLLOUT}.seed",
)
SEED_KEYS = (*PPO_TRAINER_SEEDS, f"{ACTOR}.megatron.seed", "actor_rollout_ref.ref.megatron.seed")
RUN_KEYS = frozenset(
    {
        *SEED_KEYS,
        "trainer.total_training_steps",
        "trainer.total_epochs",
        "trainer.save_freq",
        "trainer.resume_mode",
        "trainer.resume_from_path",
        "trainer.default_local_dir",
        "trainer.del_local_ckpt_after_load",
        f"{ACTOR}.checkpoint.async_save",
        "trainer.val_before_train",
        "trainer.test_freq",
        "trainer.nnodes",
        "trainer.n_gpus_per_node",
        f"{ROLLOUT}.nnodes",
        f"{ROLLOUT}.n_gpus_per_node",
        "trainer.logger",
        "trainer.project_name",
        "trainer.experiment_name",
    }
)


def recipe_from_keys(keys: dict) -> dict:
    """The recipe fields a user's verl keys set (lr unscaled: the user's lr is the lr; KL only as a loss term)."""
    out = {field: keys[key] for field, key in RECIPE_FROM_KEYS.items() if keys.get(key) is not None}
    if keys.get(f"{ACTOR}.use_kl_loss") and keys.get(f"{ACTOR}.kl_loss_coef") is not None:
        out["kl_coef"] = keys[f"{ACTOR}.kl_loss_coef"]
    if "lr" in out:
        out["lr_scaling"] = "none"
    if keys.get("trainer.total_training_steps") is not None:
        out["max_steps"] = keys["trainer.total_training_steps"]
    # the user's validation and checkpoint cadence, where verl does them at all (-1: never)
    for field, key in (("eval_every", "trainer.test_freq"), ("checkpoint_every", "trainer.save_freq")):
        if isinstance(keys.get(key), int) and not isinstance(keys[key], bool) and keys[key] > 0:
            out[field] = keys[key]
    mode = keys.get("trainer.v1.trainer_mode")
    out["async"] = "pipeline" if mode == "separate_async" else "sync"
    return out


def axis_values(recipe: Recipe) -> dict:
    """The recipe's verl keys that carry its meaning (the mapping's recipe part; layout keys are the user's)."""
    return verl_mapping(recipe).recipe


def hydra_value(value) -> str:
    """A Python value in Hydra's override grammar (strings quoted, so paths with any character stay one value)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(hydra_value(item) for item in value) + "]"
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in ("true", "false", "null", "nan", "inf"):
        return text
    # Hydra's quoting: escape quotes and each backslash in a run ending at a quote; other backslashes are literal
    return "'" + _QUOTE_OR_END.sub(lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), text) + "'"


def verl_overrides(recipe: Recipe, deployment: Deployment | None = None) -> list[str]:
    """`key=value` Hydra overrides for `python3 -m verl.trainer.main_ppo` (recipe keys, then deployment keys)."""
    return [f"{key}={hydra_value(value)}" for key, value in verl_mapping(recipe, deployment).keys().items()]


def render(recipe: Recipe, deployment: Deployment, header: list[str]) -> str:
    """A bash script that launches verl with the recipe's and the deployment's overrides."""
    m = verl_mapping(recipe, deployment)
    return launch_script(
        f"{FRAMEWORK} {VERSION} (Hydra overrides of verl/trainer/config/ppo_trainer.yaml)",
        recipe,
        header,
        m,
        [[f"{k}={hydra_value(v)}"] for k, v in m.recipe.items()],
        deployment,
        [[f"{k}={hydra_value(v)}"] for k, v in m.deployment.items()],
        "verl.trainer.main_ppo",
        "keys",
    )
