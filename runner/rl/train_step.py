"""One trainer update from one generated batch: `train_step(model, optimizer, batch, recipe) -> metrics`.
ScaleRL's order: zero-variance filter -> advantages -> policy loss + k3 KL + entropy -> clipped gradient step."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from rlscale.runner.rl.advantages import compute_advantages, zero_variance_mask
from rlscale.runner.rl.head import compute_dtype, head_logprobs, resolve_precision
from rlscale.runner.rl.losses import aggregation_weights, kl_k3, policy_loss
from rlscale.runner.rl.sampling import last_hidden

LOGITS_CHUNK_ELEMENTS = 2**28  # logits per LM-head chunk (1 GiB in fp32): the head's memory, whatever the batch


@dataclass
class TrainBatch:
    """A generated batch, B = B_p x n rows with a prompt's n rollouts adjacent (runner/rl/sampling.py layout)."""

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
    head_precision: str = "fp32",
    with_entropy: bool = False,
    entropy_grad: bool = False,
    where: torch.Tensor | None = None,
    chunk_elements: int = LOGITS_CHUNK_ELEMENTS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log pi(token t | < t) [B, L] at `temperature`; entropy [B, L] in nats or None), 0 at position 0 and outside
    `where`; the entropy carries a gradient only with `entropy_grad` (an entropy bonus), else it is a metric."""
    hidden = last_hidden(model, input_ids, attention_mask)
    rows, length = input_ids.shape
    head = model.lm_head
    columns = torch.arange(length, device=input_ids.device)
    wanted = (columns > 0).expand(rows, length) if where is None else (where > 0) & (columns > 0)
    positions = wanted.flatten().nonzero().squeeze(1)  # position t's log-prob comes from hidden state t - 1
    precision = resolve_precision(fp32_head, head_precision, compute_dtype(head.weight))
    token_logp, token_entropy = head_logprobs(
        hidden.flatten(0, 1).index_select(0, positions - 1),
        head.weight,
        head.bias,
        input_ids.flatten().index_select(0, positions),
        temperature=temperature,
        precision=precision,
        chunk_tokens=chunk_elements // head.weight.shape[0],
    )
    logp = _scatter(token_logp, positions, rows, length)
    if not with_entropy:
        return logp, None
    return logp, _scatter(token_entropy if entropy_grad else token_entropy.detach(), positions, rows, length)


def _scatter(values: torch.Tensor, positions: torch.Tensor, rows: int, length: int) -> torch.Tensor:
    return values.new_zeros(rows * length).index_copy(0, positions, values).view(rows, length)


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
    """AdamW at the recipe's sqrt-batch-scaled lr; fused on CUDA (a few kernel launches per step, not per parameter)."""
    on_cuda = model.lm_head.weight.is_cuda
    return torch.optim.AdamW(
        model.parameters(), lr=recipe.scaled_lr, weight_decay=recipe.weight_decay, fused=True if on_cuda else None
    )


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
    `ref_model` is needed only when recipe.kl_coef > 0; ppo_off_policy splits the batch into ppo_minibatches updates."""
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
    low, high = recipe.clip_range
    device = batch.input_ids.device
    # loss, entropy, kl, clipped tokens, ratio sum, tokens: summed on the device, read once
    sums = torch.zeros(6, dtype=torch.float64, device=device)
    for part, columns in micro_batches(batch.attention_mask[rows], recipe.micro_batch_tokens):
        part = torch.tensor(part, device=device)
        index = rows[part]
        input_ids, attention_mask = batch.input_ids[index][:, columns], batch.attention_mask[index][:, columns]
        part_mask, part_weights = mask[part][:, columns], weights[part][:, columns]
        head = dict(_head_knobs(recipe), where=part_mask)  # log-probs of the response tokens alone
        with autocast(recipe, device):
            logp, entropy = token_logprobs(
                model, input_ids, attention_mask, with_entropy=True, entropy_grad=recipe.entropy_coef > 0, **head
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
                ref_logp, _ = token_logprobs(ref_model, input_ids, attention_mask, **head)
            kl = (kl_k3(logp, ref_logp) * part_weights).sum()
        total = loss + recipe.kl_coef * kl - recipe.entropy_coef * entropy_sum
        total.backward()
        tokens = part_mask.sum()
        sums += torch.stack(
            [total, entropy_sum, kl, stats["clip_fraction"] * tokens, stats["ratio_mean"] * tokens, tokens]
        ).detach()
    loss, entropy, kl, clipped, ratios, tokens = sums.tolist()
    tokens = max(tokens, 1.0)
    means = {"clip_fraction": clipped / tokens, "ratio_mean": ratios / tokens}
    return {"loss": loss, "entropy": entropy, "kl": kl} | means


def _head_knobs(recipe) -> dict:
    return {"temperature": recipe.temperature, "fp32_head": recipe.fp32_head, "head_precision": recipe.head_precision}


@torch.no_grad()
def _logprobs_in_micro_batches(model, batch: TrainBatch, recipe) -> torch.Tensor:
    device = batch.input_ids.device
    logp = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=device)
    for part, columns in micro_batches(batch.attention_mask, recipe.micro_batch_tokens):
        index = torch.tensor(part, device=device)
        with autocast(recipe, device):
            part_logp, _ = token_logprobs(
                model,
                batch.input_ids[index][:, columns],
                batch.attention_mask[index][:, columns],
                where=batch.response_mask[index][:, columns],
                **_head_knobs(recipe),
            )
        logp[index, columns] = part_logp
    return logp
