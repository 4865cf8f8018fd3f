"""One trainer update from one generated batch: `train_step(model, optimizer, batch, recipe) -> metrics`.

The trainer actor and the local loop both call this. It applies the recipe's knobs in ScaleRL's
order: zero-variance filter -> advantages (batch/group/none) -> policy loss (cispo/gspo/dapo/grpo)
aggregated by prompt/token/sample, plus k3 KL and entropy terms -> clipped gradient step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlscale.runner.rl.advantages import compute_advantages, zero_variance_mask
from rlscale.runner.rl.losses import aggregate, entropy_from_logits, kl_k3, policy_loss
from rlscale.runner.rl.sampling import next_token_logits


@dataclass
class TrainBatch:
    """A generated batch, B = B_p x n rows with the n rollouts of a prompt adjacent (rlscale.runner.rl.sampling layout)."""

    input_ids: torch.Tensor  # [B, L] long: left-padded prompt, then response
    attention_mask: torch.Tensor  # [B, L]
    response_mask: torch.Tensor  # [B, L] 1 on generated tokens
    old_logp: torch.Tensor  # [B, L] generator (behaviour policy) log-probs at the sampling temperature
    rewards: torch.Tensor  # [B_p, n]

    def rows(self, index: torch.Tensor) -> "TrainBatch":
        """The sequences `index` (rewards are not sliced: callers index groups themselves)."""
        return TrainBatch(self.input_ids[index], self.attention_mask[index], self.response_mask[index],
                          self.old_logp[index], self.rewards)


def token_logprobs(model, input_ids, attention_mask, *, temperature: float, fp32_head: bool,
                   with_entropy: bool = False, entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log pi(token t | < t) [B, L] at `temperature`, position 0 set to 0; entropy [B, L] in nats or None).

    The entropy carries a gradient only with `entropy_grad` (an entropy bonus); otherwise it is a metric.
    """
    logits = next_token_logits(model, input_ids, attention_mask, fp32_head)[:, :-1] / temperature
    if not fp32_head:
        logits = logits.to(next(model.parameters()).dtype)  # keep the low-precision path honest
    logprobs = torch.log_softmax(logits, dim=-1)
    token = logprobs.gather(-1, input_ids[:, 1:, None]).squeeze(-1).float()
    logp = torch.cat([token.new_zeros(token.shape[0], 1), token], dim=1)
    entropy = None
    if with_entropy:
        ent = entropy_from_logits(logits if entropy_grad else logits.detach())
        entropy = torch.cat([ent.new_zeros(ent.shape[0], 1), ent], dim=1)
    return logp, entropy


def make_optimizer(model, recipe) -> torch.optim.Optimizer:
    """AdamW at the recipe's sqrt-batch-scaled learning rate."""
    return torch.optim.AdamW(model.parameters(), lr=recipe.scaled_lr, weight_decay=recipe.weight_decay)


def warmup_lr(recipe, updates_done: int) -> float:
    """Learning rate of the next update: scaled_lr, ramped linearly over the first lr_warmup_steps updates."""
    if updates_done >= recipe.lr_warmup_steps:
        return recipe.scaled_lr
    return recipe.scaled_lr * (updates_done + 1) / (recipe.lr_warmup_steps + 1)


def _updates_done(optimizer) -> int:
    # Adam keeps a per-parameter step count: the optimizer is the one place the trainer's progress lives
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state.get(param)
            if state and "step" in state:
                return int(state["step"])
    return 0


def train_step(model, optimizer, batch: TrainBatch, recipe, ref_model=None) -> dict[str, float]:
    """Update `model` from `batch` per `recipe`; returns health metrics (loss, reward, entropy, KL, grad norm, ...).

    `ref_model` is needed only when recipe.kl_coef > 0. With async 'ppo_off_policy' the batch is split
    into `ppo_minibatches` updates; otherwise one update.
    """
    prompts, n = batch.rewards.shape
    keep = zero_variance_mask(batch.rewards) if recipe.zero_variance_filter else torch.ones(prompts, dtype=torch.bool)
    metrics = {
        "train_reward": batch.rewards.float().mean().item(),
        "kept_prompts": int(keep.sum().item()),
        "updates": 0,
    }
    if not bool(keep.any()):  # nothing to learn from: every prompt all-right or all-wrong
        return metrics | {"loss": 0.0, "grad_norm": 0.0, "clip_fraction": 0.0, "kl": 0.0}
    kept_groups = keep.nonzero().squeeze(1)
    advantages = compute_advantages(batch.rewards[kept_groups], recipe.adv_norm)  # [G, n]
    chunks = recipe.ppo_minibatches if recipe.async_mode == "ppo_off_policy" else 1
    low, high = recipe.clip_range
    old_logp_all = batch.old_logp
    if recipe.recompute_logprobs:  # trust region around the trainer's own log-probs, not the generator's
        with torch.no_grad():
            old_logp_all, _ = token_logprobs(model, batch.input_ids, batch.attention_mask,
                                             temperature=recipe.temperature, fp32_head=recipe.fp32_head)
    sums: dict[str, float] = {}
    model.train()
    for groups in torch.tensor_split(torch.arange(len(kept_groups)), min(chunks, len(kept_groups))):
        rows = (kept_groups[groups][:, None] * n + torch.arange(n)).reshape(-1)
        part = batch.rows(rows)
        group_index = torch.arange(len(groups)).repeat_interleave(n)
        logp, entropy = token_logprobs(model, part.input_ids, part.attention_mask, temperature=recipe.temperature,
                                       fp32_head=recipe.fp32_head, with_entropy=True,
                                       entropy_grad=recipe.entropy_coef > 0)
        mask = part.response_mask.float()
        old_logp = old_logp_all[rows]
        loss, stats = policy_loss(recipe.loss, logp, old_logp, advantages[groups].reshape(-1), mask,
                                  clip_low=low, clip_high=high, agg=recipe.loss_agg, group_index=group_index)
        entropy_mean = aggregate(recipe.loss_agg, entropy, mask, group_index)
        kl = torch.zeros(())
        if recipe.kl_coef > 0:
            if ref_model is None:
                raise ValueError("recipe.kl_coef > 0 needs a reference model")
            with torch.no_grad():
                ref_logp, _ = token_logprobs(ref_model, part.input_ids, part.attention_mask,
                                             temperature=recipe.temperature, fp32_head=recipe.fp32_head)
            kl = aggregate(recipe.loss_agg, kl_k3(logp, ref_logp), mask, group_index)
        total = loss + recipe.kl_coef * kl - recipe.entropy_coef * entropy_mean
        for group in optimizer.param_groups:
            group["lr"] = warmup_lr(recipe, _updates_done(optimizer))
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
        optimizer.step()
        for key, value in {"loss": total.item(), "grad_norm": grad_norm.item(), "entropy": entropy_mean.item(),
                           "kl": kl.item(), **stats}.items():
            sums[key] = sums.get(key, 0.0) + value
        metrics["updates"] += 1
    model.eval()
    return metrics | {key: value / metrics["updates"] for key, value in sums.items()}
