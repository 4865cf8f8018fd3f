"""Run inside .venv-verl (scripts/checker_envs.sh): verl itself reads rlscale's exported overrides.

stdin: JSON list of {"name", "overrides": [Hydra override strings]}. For each case verl's own Hydra config
(verl/trainer/config/ppo_trainer.yaml) is composed with the overrides (an override of a key verl does not have is
an error), `verl.utils.config.validate_config` runs on it, the rollout config is built, the policy loss and
advantage estimator are looked up in verl's registries, and verl's own loss functions are evaluated on small tensors
to measure what they do.
Writes JSON {"version", "cases": [{"name", "ok", "error", "values"}]} to the file named by argv[1] (verl prints
to stdout).
"""

import json
import math
import os
import sys
import traceback

import torch
import verl
from hydra import compose, initialize_config_dir
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import omega_conf_to_dataclass, validate_config


def _measure(cfg) -> dict:
    actor_cfg = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    loss_fn = core_algos.get_policy_loss_fn(cfg.actor_rollout_ref.actor.policy_loss.loss_mode)
    core_algos.get_adv_estimator_fn(cfg.algorithm.adv_estimator)
    mask = torch.ones(1, 1)
    out = {}
    # the weight a token with a huge ratio (e^6) gets: d loss / d log_prob for advantage +1
    log_prob = torch.tensor([[0.0]], requires_grad=True)
    loss, _ = loss_fn(
        old_log_prob=torch.tensor([[-6.0]]),
        log_prob=log_prob,
        advantages=torch.ones(1, 1),
        response_mask=mask,
        loss_agg_mode="token-mean",
        config=actor_cfg,
    )
    loss.backward()
    out["weight_at_ratio_e6"] = -float(log_prob.grad)
    # the loss of a token with advantage -1 and ratio e^15: a dual clip would cap it at clip_ratio_c
    loss, _ = loss_fn(
        old_log_prob=torch.tensor([[-15.0]]),
        log_prob=torch.tensor([[0.0]]),
        advantages=-torch.ones(1, 1),
        response_mask=mask,
        loss_agg_mode="token-mean",
        config=actor_cfg,
    )
    out["loss_negative_advantage_ratio_e15"] = float(loss)
    # verl's KL estimator, compared with k3 = exp(ref - logp) - (ref - logp) - 1
    logp, ref = torch.tensor([[-1.0]]), torch.tensor([[-1.7]])
    kl = float(core_algos.kl_penalty(logp, ref, cfg.actor_rollout_ref.actor.kl_loss_type))
    out["kl_is_k3"] = math.isclose(kl, math.exp(-0.7) + 0.7 - 1, rel_tol=1e-5)
    # advantages of rewards [1, 0, 0, 0] and [1, 1, 0, 0] (two groups of four) under verl's estimator
    rewards = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0])
    scores = torch.zeros(8, 3)
    scores[:, -1] = rewards
    index = [0, 0, 0, 0, 1, 1, 1, 1]
    estimator = core_algos.get_adv_estimator_fn(cfg.algorithm.adv_estimator)
    kwargs = {
        "token_level_rewards": scores,
        "response_mask": torch.ones(8, 3),
        "index": index,
        "config": omega_conf_to_dataclass(cfg.algorithm),
    }
    if cfg.algorithm.adv_estimator == "grpo":
        kwargs["norm_adv_by_std_in_grpo"] = cfg.algorithm.norm_adv_by_std_in_grpo
    advantages, _ = estimator(**kwargs)
    out["advantages"] = advantages[:, 0].tolist()
    return out


def check(cases: list[dict]) -> list[dict]:
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    results = []
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        for case in cases:
            result = {"name": case["name"], "ok": False, "error": None, "values": {}}
            try:
                cfg = compose(config_name="ppo_trainer", overrides=case["overrides"])
                actor = cfg.actor_rollout_ref.actor
                # the reference policy and critic as main_ppo decides them
                validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
                omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)  # RolloutConfig checks its own fields too
                result["values"] = {
                    "train_batch_size": cfg.data.train_batch_size,
                    "n": cfg.actor_rollout_ref.rollout.n,
                    "ppo_mini_batch_size": actor.ppo_mini_batch_size,
                    "ppo_epochs": actor.ppo_epochs,
                    "total_training_steps": cfg.trainer.total_training_steps,
                    "max_response_length": cfg.data.max_response_length,
                    "loss_mode": actor.policy_loss.loss_mode,
                    "loss_agg_mode": actor.loss_agg_mode,
                    "clip_ratio_low": actor.clip_ratio_low,
                    "clip_ratio_high": actor.clip_ratio_high,
                    "adv_estimator": cfg.algorithm.adv_estimator,
                    "use_kl_loss": actor.use_kl_loss,
                    "use_kl_in_reward": cfg.algorithm.use_kl_in_reward,
                    "kl_loss_coef": actor.kl_loss_coef,
                    "lr": actor.optim.lr,
                    "lr_warmup_steps": actor.optim.lr_warmup_steps,
                    "lr_scheduler_type": actor.optim.lr_scheduler_type,
                    "use_dynamic_bsz": actor.use_dynamic_bsz,
                    "trainer_mode": cfg.trainer.v1.trainer_mode,
                    "parameter_sync_step": cfg.trainer.v1.separate_async.parameter_sync_step,
                    "max_off_policy_threshold": cfg.trainer.v1.sampler.max_off_policy_threshold,
                    "seeds": [cfg.data.seed, actor.data_loader_seed, cfg.actor_rollout_ref.rollout.seed],
                    "filter_groups": cfg.algorithm.filter_groups.enable,
                    "model_path": cfg.actor_rollout_ref.model.path,
                    **_measure(cfg),
                }
                result["ok"] = True
            except BaseException as err:  # Hydra, validate_config and the losses raise anything: report it
                result["error"] = f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=3)}"
            results.append(result)
    return results


if __name__ == "__main__":
    cases = json.load(sys.stdin)
    with open(sys.argv[1], "w") as out:
        json.dump({"version": verl.__version__, "cases": check(cases)}, out)
