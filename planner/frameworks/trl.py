"""TRL 1.16.0: a recipe as `trl.GRPOConfig` keyword arguments (YAML; `trl grpo --config FILE` or GRPOConfig(**yaml)).
Read from trl/trainer/grpo_config.py (fields, generation-batch arithmetic) and grpo_trainer.py (_compute_loss)."""

import yaml
from rlscale.planner.recipe import Recipe

from rlscale.base.errors import UserError

from .common import MODEL_PLACEHOLDER, Deployment, Mapping, comment_block, common_missing, lr_note, updates_per_batch

FRAMEWORK, VERSION = "TRL", "1.16.0"

# TRL's loss_type fixes the aggregation too: dapo/cispo over the generation batch's tokens, grpo per-sequence means
LOSS_TYPES = {
    ("cispo", "token"): "cispo",
    ("cispo", "sample"): "cispo",
    ("cispo", "prompt"): "cispo",
    ("dapo", "token"): "dapo",
    ("dapo", "sample"): "grpo",
    ("dapo", "prompt"): "dapo",
    ("grpo", "token"): "dapo",
    ("grpo", "sample"): "grpo",
    ("grpo", "prompt"): "dapo",
    ("gspo", "token"): "dapo",
    ("gspo", "sample"): "grpo",
    ("gspo", "prompt"): "dapo",
}
AGG_OF_LOSS_TYPE = {"dapo": "token", "cispo": "token", "grpo": "sample"}
# adv_norm -> scale_rewards: TRL's batch std is the std of all rewards of the generation batch, as rlscale's
SCALE_REWARDS = {"batch": "batch", "group": "group", "none": "none"}


def _divisor_at_most(n: int, cap: int) -> int:
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


def trl_mapping(recipe: Recipe, deployment: Deployment | None = None) -> Mapping:
    """The recipe as GRPOConfig fields: Mapping.recipe (rlscale's meaning), Mapping.deployment (layout)."""
    dep = deployment or Deployment()
    m = Mapping(FRAMEWORK, VERSION)
    low, high = recipe.clip_range
    loss_type = LOSS_TYPES[(recipe.loss, recipe.loss_agg)]
    if AGG_OF_LOSS_TYPE[loss_type] != recipe.loss_agg:
        m.nearest.append(
            f"loss_agg: {recipe.loss_agg} with loss {recipe.loss}: TRL's loss_type {loss_type!r} "
            f"aggregates by {AGG_OF_LOSS_TYPE[loss_type]} (token: one mean over the generation batch's "
            "tokens; sample: mean of per-sequence token means)"
        )
    k = updates_per_batch(recipe)
    r = m.recipe
    r["num_generations"] = recipe.rollouts
    r["max_steps"] = recipe.steps * k  # TRL counts optimizer steps
    r["num_iterations"] = 1
    r["learning_rate"] = recipe.scaled_lr
    r["lr_scheduler_type"] = "constant_with_warmup"
    r["warmup_steps"] = recipe.lr_warmup_steps
    r["weight_decay"] = recipe.weight_decay
    r["max_grad_norm"] = recipe.grad_clip
    r["loss_type"] = loss_type
    r["importance_sampling_level"] = "sequence" if recipe.loss == "gspo" else "token"
    if recipe.loss == "cispo":
        # TRL's CISPO weight is clamp(ratio, max=epsilon_high): the cap itself, so 1 + clip_high
        r["epsilon_high"] = 1.0 + high
        if low < 1:
            m.missing.append(
                f"CISPO lower truncation at 1 - clip_low = {1 - low:g}: TRL's CISPO clamps the weight from above only"
            )
    else:
        r["epsilon"] = low
        r["epsilon_high"] = high
    r["scale_rewards"] = SCALE_REWARDS[recipe.adv_norm]
    r["beta"] = recipe.kl_coef  # TRL's KL term is k3, added to the per-token loss
    r["entropy_coef"] = recipe.entropy_coef
    r["max_completion_length"] = recipe.max_new_tokens
    r["temperature"] = recipe.temperature
    r["cast_lm_head_to_fp32"] = recipe.fp32_head
    r["seed"] = recipe.seed
    if recipe.lr_warmup_steps:
        m.nearest.append(
            f"lr_warmup_steps {recipe.lr_warmup_steps}: TRL's warmup takes its first update at lr 0 "
            "(lr x u / warmup_steps at update u); rlscale's at lr / (warmup + 1)"
        )
    if recipe.adv_norm != "none":
        m.nearest.append("adv_norm: TRL divides by (std + 1e-4); rlscale by (std + 1e-6)")
    if not recipe.recompute_logprobs:
        m.nearest.append(
            "recompute_logprobs: false: TRL takes the old log-probs from the trainer (as "
            "recompute_logprobs: true); rlscale takes the generator's"
        )

    # generation batch = per_device_train_batch_size x processes x steps_per_generation; an update takes 1/k of it
    d = m.deployment
    world = dep.gpus
    per_update = recipe.total_batch // k
    if per_update % world or recipe.total_batch % k:
        m.missing.append(
            f"deployment: B_p x n / ppo minibatches = {recipe.total_batch}/{k} completions per update do "
            f"not split over {world} processes; choose --gpus/--nodes that divide them"
        )
    micro = _divisor_at_most(max(1, per_update // world), dep.micro_batch_per_gpu)
    accumulation = max(1, per_update // (world * micro))
    d["per_device_train_batch_size"] = micro
    d["gradient_accumulation_steps"] = accumulation
    d["steps_per_generation"] = accumulation * k
    if dep.cpu:  # TRL's CPU path: transformers' generate in the training process, float32
        d["use_vllm"] = False
        d["use_cpu"] = True
        d["bf16"] = False
    else:
        d["use_vllm"] = True
        d["vllm_mode"] = "colocate"
        d["vllm_tensor_parallel_size"] = dep.tensor_parallel
        d["vllm_max_model_length"] = dep.max_prompt_tokens + recipe.max_new_tokens
        d["bf16"] = True
    d["output_dir"] = "/path/to/output"

    m.missing += common_missing(recipe, "TRL")
    if recipe.zero_variance_filter:
        m.missing.append(
            "zero_variance_filter: true has no GRPOConfig key: all-pass / all-fail groups get "
            "advantage 0 but stay in the batch (and in the token count a dapo/cispo loss divides by)"
        )
    if recipe.async_mode == "pipeline":
        m.missing.append(
            f"async: pipeline (max_staleness {recipe.max_staleness}): GRPOConfig trains on-policy; "
            "TRL 1.16's experimental AsyncGRPOConfig has max_staleness but no loss_type, scale_rewards "
            "or beta, so it cannot carry this recipe"
        )
    return m


# a user's TRL setup (frameworks/setup.py): recipe field -> the key it is read from; RUN_KEYS: what each job sets
RECIPE_FROM_KEYS = {
    "rollouts": "num_generations",
    "model": "model_name_or_path",
    "max_new_tokens": "max_completion_length",
    "lr": "learning_rate",
    "temperature": "temperature",
    "kl_coef": "beta",
    "entropy_coef": "entropy_coef",
}
RUN_KEYS = frozenset(
    {
        "max_steps",
        "output_dir",
        "save_strategy",
        "save_steps",
        "save_total_limit",
        "logging_steps",
        "seed",
        "run_name",
        "disable_tqdm",
        "eval_strategy",
    }
)


# TRL 1.16.0 GRPOConfig defaults (trl/trainer/grpo_config.py), copied since the planner must not import TRL
TRL_DEFAULTS = {
    "num_generations": 8,
    "max_completion_length": 512,
    "learning_rate": 1e-6,
    "temperature": 1.0,
    "beta": 0.0,
    "entropy_coef": 0.0,
    "per_device_train_batch_size": 8,
}


# the keys rlscale does batch arithmetic on (recipe_from_keys, updates_per_generated_batch) before TRL's parser runs
BATCH_KEYS = (
    "num_generations",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "steps_per_generation",
    "generation_batch_size",
    "num_iterations",
)


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # YAML's true is an int to Python


def check_batch_keys(keys: dict) -> None:
    """UserError naming the key (the caller names the file) for a set BATCH_KEYS value that is not a positive whole
    number, or a max_steps that is not a whole number (TRL's -1: not set)."""
    for key in BATCH_KEYS:
        value = keys.get(key)
        if value is not None and not (_whole(value) and value > 0):
            raise UserError(f"expected a positive whole number, got {value!r}", field=key)
    steps = keys.get("max_steps")
    if steps is not None and not _whole(steps):
        raise UserError(f"expected a whole number of optimizer steps, got {steps!r}", field="max_steps")


def recipe_from_keys(keys: dict) -> dict:
    """The recipe fields a user's GRPOConfig keys say, TRL's defaults filling the rest; prompts per batch is the
    generation batch over num_generations on one process, and lr is taken unscaled. UserError (check_batch_keys)
    naming a batch key whose value cannot be counted with."""
    check_batch_keys(keys)
    given = {**TRL_DEFAULTS, **{key: value for key, value in keys.items() if value is not None}}
    out = {field: given[key] for field, key in RECIPE_FROM_KEYS.items() if given.get(key) is not None}
    batch = given.get("generation_batch_size")
    if batch is None:
        per_generation = given.get("steps_per_generation") or given.get("gradient_accumulation_steps") or 1
        batch = given["per_device_train_batch_size"] * per_generation
    out["prompts_per_batch"] = max(1, batch // out["rollouts"])
    out["lr_scaling"] = "none"
    if keys.get("max_steps") is not None and keys["max_steps"] > 0:
        out["max_steps"] = keys["max_steps"]
    out["async"] = "sync"  # GRPOTrainer generates and trains in turn
    return out


def updates_per_generated_batch(keys: dict) -> float:
    """Optimizer updates per generated batch that GRPOConfig keys give on one process (GRPOConfig's arithmetic, with
    its defaults: 8 completions per device, one accumulation step, one iteration); UserError as check_batch_keys."""
    check_batch_keys(keys)
    keys = {key: value for key, value in keys.items() if value is not None}  # null: unset, as recipe_from_keys reads it
    per_device, accumulation = keys.get("per_device_train_batch_size", 8), keys.get("gradient_accumulation_steps", 1)
    micro = keys.get("steps_per_generation") or (
        keys["generation_batch_size"] / per_device if keys.get("generation_batch_size") else accumulation
    )
    return micro * keys.get("num_iterations", 1) / accumulation


def accumulation_keeping_updates(user: dict, changed: dict) -> int | None:
    """The gradient_accumulation_steps that keeps the user's updates per generated batch once `changed` (the study's
    values) moves the generation batch; None when it does not need to change."""
    keys = {key: value for key, value in {**user, **changed}.items() if value is not None}
    wanted = updates_per_generated_batch(user)
    if updates_per_generated_batch(keys) == wanted or not wanted:
        return None
    micro = keys.get("steps_per_generation") or keys.get("generation_batch_size", 0) / keys.get(
        "per_device_train_batch_size", 8
    )
    return max(1, round(micro * keys.get("num_iterations", 1) / wanted))


def axis_values(recipe: Recipe) -> dict:
    """The recipe's GRPOConfig keys, plus the generation batch (B_p x n) TRL would otherwise derive from the layout."""
    return {**trl_mapping(recipe).recipe, "generation_batch_size": recipe.total_batch}


def render(recipe: Recipe, deployment: Deployment, header: list[str], run_keys: dict | None = None) -> str:
    """GRPOConfig fields as one flat YAML mapping: the recipe's keys, then the deployment's; `run_keys` (the trl
    engine's output_dir, checkpoints and logging for one run) last, replacing the deployment's placeholders."""
    m = trl_mapping(recipe, deployment)
    run_keys = dict(run_keys or {})
    model = recipe.model if recipe.model != "tiny" else MODEL_PLACEHOLDER
    lines = [f"# target: {FRAMEWORK} {VERSION} (trl.GRPOConfig fields; `trl grpo --config FILE` or GRPOConfig(**yaml))"]
    lines += [f"# {line}" for line in header]
    lines += [
        f"# {lr_note(recipe)}",
        f"# model ({model}), train_dataset and reward_funcs (the {recipe.task} verifier) go to GRPOTrainer, "
        "not GRPOConfig",
        f"# generation batch = per_device_train_batch_size x processes x steps_per_generation = B_p x n = "
        f"{recipe.total_batch}; {updates_per_batch(recipe)} optimizer update(s) per generation batch",
    ]
    lines += comment_block("nearest form (the difference named)", m.nearest)
    lines += comment_block("not expressible", m.missing)
    lines += ["# the recipe: keys with rlscale's meaning"]
    lines += yaml.safe_dump(m.recipe, sort_keys=False, allow_unicode=True).splitlines()
    lines += [f"# deployment choices ({deployment.describe()}): how the job is laid out, not what it trains"]
    lines += yaml.safe_dump(
        {k: v for k, v in m.deployment.items() if k not in run_keys}, sort_keys=False, allow_unicode=True
    ).splitlines()
    if run_keys:
        lines += ["# the run's own keys (engine trl): where its checkpoints and logs go"]
        lines += yaml.safe_dump(run_keys, sort_keys=False, allow_unicode=True).splitlines()
    return "\n".join(lines) + "\n"
