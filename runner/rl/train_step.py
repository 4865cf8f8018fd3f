"""One trainer update from one generated batch: `train_step(model, optimizer, batch, recipe) -> metrics`.

The trainer actor and the local loop both call this. It applies the recipe's knobs in ScaleRL's
order: zero-variance filter -> advantages (batch/group/none) -> policy loss (cispo/gspo/dapo/grpo)
aggregated by prompt/token/sample, plus k3 KL and entropy terms -> clipped gradient step.

Memory is bounded by the recipe, not the batch: each update runs as micro-batches of at most
`micro_batch_tokens` tokens whose gradients accumulate (each sums its rows' share of one batch-wide
aggregation weight, so the loss equals the whole batch's), and the LM head turns hidden states into
log-probs a sequence chunk at a time, never holding the batch's [B, L, V] logits. Every tensor made here
lives on the batch's device; on CUDA the forward passes run under bf16 autocast (recipe.gpu_dtype) while
the weights, gradients and Adam state stay float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from rlscale.runner.rl.advantages import compute_advantages, zero_variance_mask
from rlscale.runner.rl.losses import aggregation_weights, kl_k3, policy_loss
from rlscale.runner.rl.sampling import head_logits, last_hidden
from torch.utils.checkpoint import checkpoint

LOGITS_CHUNK_ELEMENTS = 2**28  # logits per LM-head chunk (1 GiB in fp32): the head's memory, whatever the batch


@dataclass
class TrainBatch:
    """A generated batch, B = B_p x n rows with the n rollouts of a prompt adjacent (rlscale.runner.rl.sampling
    layout)."""

    input_ids: torch.Tensor  # [B, L] long: left-padded prompt, then response
    attention_mask: torch.Tensor  # [B, L]
    response_mask: torch.Tensor  # [B, L] 1 on generated tokens
    old_logp: torch.Tensor  # [B, L] generator (behaviour policy) log-probs at the sampling temperature
    rewards: torch.Tensor  # [B_p, n]

    def rows(self, index: torch.Tensor) -> TrainBatch:
        """The sequences `index` (rewards are not sliced: callers index groups themselves)."""
        return TrainBatch(
            self.input_ids[index],
            self.attention_mask[index],
            self.response_mask[index],
            self.old_logp[index],
            self.rewards,
        )

    def to(self, device) -> TrainBatch:
        """The batch on `device`."""
        return TrainBatch(
            *(
                t.to(device)
                for t in (self.input_ids, self.attention_mask, self.response_mask, self.old_logp, self.rewards)
            )
        )


def autocast(recipe, device) -> torch.autocast:
    """bf16 autocast on CUDA when recipe.gpu_dtype is bfloat16 (weights stay float32); disabled on other devices."""
    device = torch.device(device)
    enabled = device.type == "cuda" and recipe.gpu_dtype == "bfloat16"
    return torch.autocast(
        device.type if device.type in ("cuda", "cpu") else "cpu", dtype=torch.bfloat16, enabled=enabled
    )


def token_logprobs(
    model,
    input_ids,
    attention_mask,
    *,
    temperature: float,
    fp32_head: bool,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    chunk_elements: int = LOGITS_CHUNK_ELEMENTS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log pi(token t | < t) [B, L] at `temperature`, position 0 set to 0; entropy [B, L] in nats or None).

    The entropy carries a gradient only with `entropy_grad` (an entropy bonus); otherwise it is a metric.
    The LM head runs over sequence chunks of at most `chunk_elements` logits; with a gradient and more than one
    chunk, each chunk's logits are recomputed in backward instead of kept.
    """
    hidden = last_hidden(model, input_ids, attention_mask)[:, :-1]
    targets = input_ids[:, 1:]
    rows, positions = targets.shape
    span = max(1, chunk_elements // max(1, rows * model.lm_head.weight.shape[0]))
    recompute = torch.is_grad_enabled() and positions > span
    pieces = []
    for start in range(0, positions, span):
        args = (
            hidden[:, start : start + span],
            targets[:, start : start + span],
            model,
            temperature,
            fp32_head,
            with_entropy,
            entropy_grad,
        )
        pieces.append(checkpoint(_head_logprobs, *args, use_reentrant=False) if recompute else _head_logprobs(*args))
    token = torch.cat([piece[0] for piece in pieces], dim=1)
    logp = torch.cat([token.new_zeros(rows, 1), token], dim=1)
    entropy = None
    if with_entropy:
        ent = torch.cat([piece[1] for piece in pieces], dim=1)
        entropy = torch.cat([ent.new_zeros(rows, 1), ent], dim=1)
    return logp, entropy


def _head_logprobs(hidden, targets, model, temperature, fp32_head, with_entropy, entropy_grad):
    logprobs = torch.log_softmax(head_logits(model, hidden, fp32_head) / temperature, dim=-1)
    token = logprobs.gather(-1, targets[..., None]).squeeze(-1).float()
    if not with_entropy:
        return token, None
    probs_log = (logprobs if entropy_grad else logprobs.detach()).float()
    return token, -(probs_log.exp() * probs_log).sum(dim=-1)


def micro_batches(attention_mask: torch.Tensor, budget_tokens: int) -> list[tuple[list[int], slice]]:
    """Consecutive row ranges of a batch, each with the column span its rows attend to, holding at most
    `budget_tokens` (rows x span) tokens; a row longer than the budget runs alone. [(row indices, columns)]."""
    attended = attention_mask.detach().to("cpu").bool()
    columns = torch.arange(attended.shape[1], device="cpu")
    first = torch.where(attended, columns, attended.shape[1]).min(dim=1).values.tolist()
    last = torch.where(attended, columns, -1).max(dim=1).values.tolist()
    parts: list[tuple[list[int], slice]] = []
    rows: list[int] = []
    low = high = 0
    for row, (start, end) in enumerate(zip(first, last)):
        if end < start:  # nothing attended (an empty row): a one-column span keeps the shapes valid
            start = end = 0
        new_low, new_high = (min(low, start), max(high, end + 1)) if rows else (start, end + 1)
        if rows and (len(rows) + 1) * (new_high - new_low) > budget_tokens:
            parts.append((rows, slice(low, high)))
            rows, (new_low, new_high) = [], (start, end + 1)
        rows.append(row)
        low, high = new_low, new_high
    if rows:
        parts.append((rows, slice(low, high)))
    return parts


def use_activation_checkpointing(model, enabled: bool) -> None:
    """Turn the HF model's per-layer activation checkpointing on or off (it acts in train mode only)."""
    if bool(getattr(model, "is_gradient_checkpointing", False)) == enabled:
        return
    if enabled:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_disable()


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
    into `ppo_minibatches` updates; otherwise one update. Each update accumulates gradients over micro-batches
    of at most recipe.micro_batch_tokens tokens; its loss is that of the whole update's rows at once.
    """
    if recipe.kl_coef > 0 and ref_model is None:
        raise ValueError("recipe.kl_coef > 0 needs a reference model")
    device = batch.input_ids.device
    prompts, n = batch.rewards.shape
    rewards = batch.rewards.to(device)
    keep = (
        zero_variance_mask(rewards)
        if recipe.zero_variance_filter
        else torch.ones(prompts, dtype=torch.bool, device=device)
    )
    metrics = {
        "train_reward": rewards.float().mean().item(),
        "kept_prompts": int(keep.sum().item()),
        "updates": 0,
    }
    if not bool(keep.any()):  # nothing to learn from: every prompt all-right or all-wrong
        return metrics | {"loss": 0.0, "grad_norm": 0.0, "clip_fraction": 0.0, "kl": 0.0}
    kept_groups = keep.nonzero().squeeze(1)
    advantages = compute_advantages(rewards[kept_groups], recipe.adv_norm)  # [G, n]
    chunks = recipe.ppo_minibatches if recipe.async_mode == "ppo_off_policy" else 1
    use_activation_checkpointing(model, recipe.activation_checkpointing)
    old_logp_all = batch.old_logp
    if recipe.recompute_logprobs:  # trust region around the trainer's own log-probs, not the generator's
        old_logp_all = _logprobs_in_micro_batches(model, batch, recipe)
    sums: dict[str, float] = {}
    model.train()
    within_group = torch.arange(n, device=device)
    for groups in torch.tensor_split(torch.arange(len(kept_groups), device=device), min(chunks, len(kept_groups))):
        rows = (kept_groups[groups][:, None] * n + within_group).reshape(-1)
        group_index = torch.arange(len(groups), device=device).repeat_interleave(n)
        mask = batch.response_mask[rows].float()
        weights = aggregation_weights(recipe.loss_agg, mask, group_index)  # the whole update's normalisation
        for group in optimizer.param_groups:
            group["lr"] = warmup_lr(recipe, _updates_done(optimizer))
        optimizer.zero_grad(set_to_none=True)
        update = _accumulate(
            model, batch, old_logp_all, rows, mask, weights, advantages[groups].reshape(-1), recipe, ref_model
        )
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
        optimizer.step()
        for key, value in (update | {"grad_norm": grad_norm.item()}).items():
            sums[key] = sums.get(key, 0.0) + value
        metrics["updates"] += 1
    model.eval()
    return metrics | {key: value / metrics["updates"] for key, value in sums.items()}


def _accumulate(model, batch, old_logp_all, rows, mask, weights, advantages, recipe, ref_model) -> dict[str, float]:
    """Backward of one update's loss over its rows, micro-batch by micro-batch; its metrics (loss, entropy, kl,
    clip_fraction, ratio_mean)."""
    low, high = recipe.clip_range
    device = batch.input_ids.device
    totals = {"loss": 0.0, "entropy": 0.0, "kl": 0.0}
    token_stats = {"clip_fraction": 0.0, "ratio_mean": 0.0}
    tokens_seen = 0.0
    for part, columns in micro_batches(batch.attention_mask[rows], recipe.micro_batch_tokens):
        part = torch.tensor(part, device=device)
        index = rows[part]
        input_ids, attention_mask = batch.input_ids[index][:, columns], batch.attention_mask[index][:, columns]
        part_mask, part_weights = mask[part][:, columns], weights[part][:, columns]
        with autocast(recipe, device):
            logp, entropy = token_logprobs(
                model,
                input_ids,
                attention_mask,
                temperature=recipe.temperature,
                fp32_head=recipe.fp32_head,
                with_entropy=True,
                entropy_grad=recipe.entropy_coef > 0,
            )
        loss, stats = policy_loss(
            recipe.loss,
            logp,
            old_logp_all[index][:, columns],
            advantages[part],
            part_mask,
            clip_low=low,
            clip_high=high,
            agg=recipe.loss_agg,
            weights=part_weights,
        )
        entropy_sum = (entropy * part_weights).sum()
        kl = torch.zeros((), device=device)
        if recipe.kl_coef > 0:
            with torch.no_grad(), autocast(recipe, device):
                ref_logp, _ = token_logprobs(
                    ref_model, input_ids, attention_mask, temperature=recipe.temperature, fp32_head=recipe.fp32_head
                )
            kl = (kl_k3(logp, ref_logp) * part_weights).sum()
        total = loss + recipe.kl_coef * kl - recipe.entropy_coef * entropy_sum
        total.backward()
        tokens = part_mask.sum().item()
        tokens_seen += tokens
        for key, value in (("loss", total), ("entropy", entropy_sum), ("kl", kl)):
            totals[key] += value.item()
        for key in token_stats:
            token_stats[key] += stats[key] * tokens
    return totals | {key: value / max(tokens_seen, 1.0) for key, value in token_stats.items()}


@torch.no_grad()
def _logprobs_in_micro_batches(model, batch: TrainBatch, recipe) -> torch.Tensor:
    """The model's own log-probs [B, L] of every batch token (0 outside the attended span), micro-batch by
    micro-batch."""
    device = batch.input_ids.device
    logp = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=device)
    for part, columns in micro_batches(batch.attention_mask, recipe.micro_batch_tokens):
        index = torch.tensor(part, device=device)
        with autocast(recipe, device):
            part_logp, _ = token_logprobs(
                model,
                batch.input_ids[index][:, columns],
                batch.attention_mask[index][:, columns],
                temperature=recipe.temperature,
                fp32_head=recipe.fp32_head,
            )
        logp[index, columns] = part_logp
    return logp
