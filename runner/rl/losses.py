"""Policy losses, loss aggregation and KL as small pure functions of tensors (after verl's core_algos).
`logp`, `old_logp`, `mask` are [B, T]; `advantages` and `group_index` (the prompt each sequence answers) are [B]."""

from __future__ import annotations

from collections.abc import Callable

import torch


def _safe_div(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    return numerator / denominator.clamp(min=1.0)


# aggregations are fixed per-token weights, so micro-batches summing their rows' share add up to the batch's loss
def token_weights(mask: torch.Tensor, group_index: torch.Tensor | None = None) -> torch.Tensor:
    """Weights [B, T] of the mean over every response token in the batch (DAPO's token-level aggregation)."""
    return _safe_div(mask, mask.sum())


def sample_weights(mask: torch.Tensor, group_index: torch.Tensor | None = None) -> torch.Tensor:
    """Weights [B, T] of the token mean within each sequence, then the mean over sequences that have tokens (GRPO)."""
    lengths = mask.sum(dim=1, keepdim=True)
    return _safe_div(_safe_div(mask, lengths), (lengths > 0).sum())


def prompt_weights(mask: torch.Tensor, group_index: torch.Tensor | None = None) -> torch.Tensor:
    """Weights [B, T] of the token mean within each prompt's group of rollouts, then the mean over prompts (ScaleRL)."""
    if group_index is None:
        raise ValueError("loss_agg 'prompt' needs group_index (the prompt of each sequence)")
    groups = int(group_index.max().item()) + 1 if group_index.numel() else 0
    token_counts = mask.new_zeros(groups).index_add(0, group_index, mask.sum(dim=1))
    return _safe_div(_safe_div(mask, token_counts[group_index][:, None]), (token_counts > 0).sum())


AGGREGATIONS: dict[str, Callable[..., torch.Tensor]] = {
    "prompt": prompt_weights,
    "token": token_weights,
    "sample": sample_weights,
}


def aggregation_weights(name: str, mask: torch.Tensor, group_index: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token weights [B, T] (summing to 1 over a batch with tokens) of aggregation `name` (prompt|token|sample)."""
    if name not in AGGREGATIONS:
        raise ValueError(f"unknown loss_agg {name!r}; expected one of {', '.join(AGGREGATIONS)}")
    return AGGREGATIONS[name](mask, group_index)


def aggregate(
    name: str, per_token: torch.Tensor, mask: torch.Tensor, group_index: torch.Tensor | None = None
) -> torch.Tensor:
    """Scalar from per-token values [B, T] by aggregation mode `name` (prompt | token | sample)."""
    return (per_token * aggregation_weights(name, mask.to(per_token.dtype), group_index)).sum()


def token_mean(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `per_token` over the response tokens."""
    return _safe_div((per_token * mask).sum(), mask.sum())


def ppo_clip_loss(logp, old_logp, advantages, mask, *, clip_low: float, clip_high: float):
    """PPO clip: max(-A r, -A clip(r, 1-low, 1+high)); clipped tokens get no gradient (GRPO, DAPO)."""
    adv = advantages[:, None]
    ratio = torch.exp(logp - old_logp)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    return torch.maximum(unclipped, clipped), (clipped > unclipped) & (mask > 0)


def gspo_loss(logp, old_logp, advantages, mask, *, clip_low: float, clip_high: float):
    """GSPO: PPO clip on the sequence ratio s = exp(mean token log-ratio); each token carries s with grad of s."""
    adv = advantages[:, None]
    mask = mask.to(logp.dtype)
    sequence_log_ratio = _safe_div(((logp - old_logp) * mask).sum(dim=1), mask.sum(dim=1))
    # value s = exp(sequence log-ratio) on every token, gradient s * d logp_t: their sequence-mean is GSPO's gradient
    log_ratio = logp - logp.detach() + sequence_log_ratio.detach()[:, None]
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    return torch.maximum(unclipped, clipped), (clipped > unclipped) & (mask > 0)


def cispo_loss(logp, old_logp, advantages, mask, *, clip_low: float, clip_high: float):
    """CISPO: -sg(clip(r, 1-low, 1+high)) * A * log pi; every token keeps a gradient, with a capped weight."""
    ratio = torch.exp(logp - old_logp).detach()
    lower = max(0.0, 1.0 - clip_low)  # clip_low >= 1: no lower truncation (MiniMax / ScaleRL)
    weight = torch.clamp(ratio, lower, 1.0 + clip_high)
    return -weight * advantages[:, None] * logp, ((ratio > 1.0 + clip_high) | (ratio < lower)) & (mask > 0)


POLICY_LOSSES: dict[str, Callable] = {
    "cispo": cispo_loss,
    "gspo": gspo_loss,
    "dapo": ppo_clip_loss,  # the same loss as grpo; DAPO's asymmetric clip comes from the recipe's clip range
    "grpo": ppo_clip_loss,
}


def policy_loss(
    name: str,
    logp,
    old_logp,
    advantages,
    mask,
    *,
    clip_low: float,
    clip_high: float,
    agg: str,
    group_index=None,
    weights=None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """(scalar loss, stats) for loss `name` aggregated by `agg`, or by `weights` [B, T] (rows' share of a larger batch's
    aggregation_weights); stats: clip_fraction, ratio_mean (token means, 0-dim tensors)."""
    if name not in POLICY_LOSSES:
        raise ValueError(f"unknown loss {name!r}; expected one of {', '.join(POLICY_LOSSES)}")
    per_token, clipped = POLICY_LOSSES[name](logp, old_logp, advantages, mask, clip_low=clip_low, clip_high=clip_high)
    loss = (per_token * weights).sum() if weights is not None else aggregate(agg, per_token, mask, group_index)
    with torch.no_grad():  # 0-dim tensors on logp's device: the caller reads them when it needs them (a GPU sync)
        mask_f = mask.to(logp.dtype)
        stats = {
            "clip_fraction": token_mean(clipped.to(logp.dtype), mask_f),
            "ratio_mean": token_mean(torch.exp(logp - old_logp), mask_f),
        }
    return loss, stats


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || pi_ref): exp(ref - logp) - (ref - logp) - 1 (>= 0, unbiased)."""
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1.0
