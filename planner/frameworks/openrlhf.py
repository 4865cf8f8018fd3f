"""OpenRLHF 0.11.2: a recipe as a `python3 -m openrlhf.cli.train_ppo_ray` command line (dotted flags).
Read from openrlhf cli/train_ppo_ray.py, models/loss.py, trainer/ppo_utils/experience_maker.py, trainer/ray/."""

from rlscale.planner.recipe import Recipe

from .common import (
    MODEL_PLACEHOLDER,
    TRAIN_DATA_PLACEHOLDER,
    VERIFIER_PLACEHOLDER,
    Deployment,
    Mapping,
    common_missing,
    launch_script,
    updates_per_batch,
    warmup_fraction,
)

FRAMEWORK, VERSION = "OpenRLHF", "0.11.2"

# loss -> (--actor.policy_loss_type, difference or None); OpenRLHF's dual clip is off unless --actor.dual_clip
LOSSES = {
    "dapo": ("ppo", None),
    "grpo": ("ppo", None),
    "gspo": ("gspo", None),
    "cispo": ("ppo", None),  # not expressible: named in openrlhf_mapping
}
AGGREGATIONS = {
    "token": ("token-mean", None),
    "sample": ("seq-mean-token-mean", None),
    "prompt": (
        "token-mean",
        "loss_agg: prompt (token mean within each prompt's group, then mean over prompts) has "
        "no OpenRLHF mode; token-mean weights each group by its token count instead of equally",
    ),
}
# adv_norm -> (--algo.advantage.estimator, difference or None)
ADVANTAGES = {
    "group": ("group_norm", None),
    "none": ("dr_grpo", None),
    "batch": (
        "reinforce_baseline",
        "adv_norm: batch -> reinforce_baseline (group mean, then whitened over the batch): OpenRLHF whitens "
        "(r - group mean) over the batch's response tokens (token-weighted, mean re-subtracted); rlscale "
        "divides (r - group mean) by the std of the raw rewards of all B_p x n rollouts",
    ),
}


def openrlhf_mapping(recipe: Recipe, deployment: Deployment | None = None) -> Mapping:
    """The recipe as OpenRLHF flags: {flag: value}; True is a bare switch, a list is several words."""
    dep = deployment or Deployment()
    m = Mapping(FRAMEWORK, VERSION)
    low, high = recipe.clip_range
    policy_loss, _ = LOSSES[recipe.loss]
    agg, agg_diff = AGGREGATIONS[recipe.loss_agg]
    estimator, adv_diff = ADVANTAGES[recipe.adv_norm]
    m.nearest += [d for d in (agg_diff, adv_diff) if d]
    if recipe.loss == "gspo" and recipe.loss_agg != "sample":
        m.nearest.append(
            f"loss_agg: {recipe.loss_agg} with gspo: OpenRLHF's GSPO always averages per sequence (sample)"
        )
    k = updates_per_batch(recipe)
    r = m.recipe
    # batch geometry: --rollout.batch_size counts prompts, --train.batch_size completions per optimizer update
    r["--rollout.batch_size"] = recipe.prompts_per_batch
    r["--rollout.n_samples_per_prompt"] = recipe.rollouts
    r["--train.batch_size"] = recipe.total_batch // k  # B_p x n: one update per generated batch
    r["--train.max_epochs"] = 1
    # OpenRLHF counts episodes over the prompt data: one episode over the first M x B_p prompts is M steps
    r["--train.num_episodes"] = 1
    r["--data.max_samples"] = recipe.steps * recipe.prompts_per_batch
    r["--rollout.max_new_tokens"] = recipe.max_new_tokens
    r["--rollout.temperature"] = recipe.temperature
    # AdamW at torch's defaults (OpenRLHF's own betas are 0.9, 0.95), linear warmup then constant
    r["--actor.adam.lr"] = recipe.scaled_lr
    r["--actor.adam.betas"] = [0.9, 0.999]
    r["--actor.adam.weight_decay"] = recipe.weight_decay
    r["--actor.max_norm"] = recipe.grad_clip
    r["--actor.lr_scheduler"] = "constant_with_warmup"
    r["--actor.lr_warmup_ratio"] = warmup_fraction(recipe)  # ceil(M x k x ratio) = lr_warmup_steps updates
    r["--actor.policy_loss_type"] = policy_loss
    r["--actor.eps_clip_low_high"] = [min(low, 1.0), high]
    r["--actor.loss_agg_mode"] = agg
    r["--algo.advantage.estimator"] = estimator
    # KL: a k3 loss term (never the k1 reward penalty, which is what a nonzero init_coef alone gives)
    r["--algo.kl.init_coef"] = recipe.kl_coef
    if recipe.kl_coef > 0:
        r["--algo.kl.use_loss"] = True
        r["--algo.kl.estimator"] = "k3"
    if recipe.entropy_coef > 0:  # unset: no entropy term (0 would still compute it, for the logs)
        r["--actor.entropy_coef"] = recipe.entropy_coef
    r["--train.seed"] = recipe.seed
    if recipe.zero_variance_filter:  # binary rewards: a group mean strictly inside (0, 1) has variance
        r["--algo.dynamic_filtering_enable"] = True
        r["--algo.dynamic_filtering_range"] = [0.0, 1.0]
        m.nearest.append(
            "zero_variance_filter: true -> dynamic filtering (group mean reward strictly inside (0, 1)): "
            "OpenRLHF generates more prompts until B_p informative groups fill the batch; rlscale "
            "trains on the smaller batch"
        )
    pipeline = recipe.async_mode == "pipeline"
    if pipeline:
        r["--train.async_enable"] = True
        r["--train.async_queue_size"] = max(1, recipe.max_staleness)
        m.nearest.append(
            f"async: pipeline (max_staleness {recipe.max_staleness}) -> async training with a queue of "
            f"{max(1, recipe.max_staleness)} generated batch(es): staleness is bounded by the queue, "
            "not checked and dropped as rlscale does"
        )
    if not recipe.recompute_logprobs:
        m.nearest.append(
            "recompute_logprobs: false: OpenRLHF recomputes the old log-probs with the trainer (as "
            "recompute_logprobs: true); rlscale takes the generator's"
        )

    d = m.deployment
    actor_gpus = dep.gpus_per_node // 2 if pipeline else dep.gpus_per_node  # async: vLLM on GPUs of its own
    vllm_gpus = dep.gpus_per_node - actor_gpus if pipeline else dep.gpus_per_node
    d["--actor.num_nodes"] = dep.nodes
    d["--actor.num_gpus_per_node"] = actor_gpus
    if recipe.kl_coef > 0:
        d["--ref.num_nodes"] = dep.nodes
        d["--ref.num_gpus_per_node"] = actor_gpus
    d["--vllm.num_engines"] = max(1, vllm_gpus * dep.nodes // dep.tensor_parallel)
    d["--vllm.tensor_parallel_size"] = dep.tensor_parallel
    if not pipeline:
        d["--train.colocate_all"] = True
        d["--vllm.enable_sleep"] = True
        d["--ds.enable_sleep"] = True
    d["--train.dynamic_batch_enable"] = True
    d["--train.max_tokens_per_gpu"] = dep.tokens_per_gpu(recipe)
    # prompt + response: OpenRLHF cuts sequences at max_len whatever --rollout.max_new_tokens says
    d["--data.max_len"] = dep.max_prompt_tokens + recipe.max_new_tokens
    d["--actor.model_name_or_path"] = recipe.model if recipe.model != "tiny" else MODEL_PLACEHOLDER
    d["--data.prompt_dataset"] = TRAIN_DATA_PLACEHOLDER
    d["--data.input_key"] = "prompt"
    d["--data.label_key"] = "answer"
    d["--reward.remote_url"] = VERIFIER_PLACEHOLDER

    if recipe.loss == "cispo":
        m.missing.append(
            f"loss: cispo has no OpenRLHF policy_loss_type (ppo, gspo); the nearest, ppo with the ratio "
            f"clipped to [{max(0.0, 1 - low):g}, {1 + high:g}], drops the gradient of clipped tokens where "
            "CISPO keeps it with a truncated weight"
        )
    m.missing += common_missing(recipe, "OpenRLHF")
    if recipe.fp32_head:
        m.missing.append("fp32_head: true (LM head and logits in fp32, trainer and generator) has no OpenRLHF flag")
    return m


def flag_words(mapping: dict) -> list[list[str]]:
    """Each flag with its values as argv words: True -> the bare switch, False -> nothing, a list -> several values."""
    groups = []
    for flag, value in mapping.items():
        if value is True:
            groups.append([flag])
        elif isinstance(value, list):
            groups.append([flag, *(_word(v) for v in value)])
        elif value is not False and value is not None:
            groups.append([flag, _word(value)])
    return groups


def openrlhf_argv(recipe: Recipe, deployment: Deployment | None = None) -> list[str]:
    """The argv after `python3 -m openrlhf.cli.train_ppo_ray` (recipe flags, then deployment flags)."""
    m = openrlhf_mapping(recipe, deployment)
    return [word for group in flag_words(m.recipe) + flag_words(m.deployment) for word in group]


def _word(value) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def render(recipe: Recipe, deployment: Deployment, header: list[str]) -> str:
    """A bash script: the recipe's flags and the deployment's in two arrays, then the launch line."""
    m = openrlhf_mapping(recipe, deployment)
    return launch_script(
        f"{FRAMEWORK} {VERSION} (openrlhf.cli.train_ppo_ray flags)",
        recipe,
        header,
        m,
        flag_words(m.recipe),
        deployment,
        flag_words(m.deployment),
        "openrlhf.cli.train_ppo_ray",
        "flags",
    )
