"""Policy losses, loss aggregation, KL and entropy as small pure functions of tensors (after verl's core_algos).

Shapes: `logp`, `old_logp`, `mask` are [B, T] (token log-probs under the current and the behaviour
policy; mask 1 on response tokens); `advantages` is [B] (one value per sequence, shared by its tokens);
`group_index` is [B] long, the prompt each sequence answers (0..G-1). Per-token losses are [B, T];
`aggregate` turns them into the scalar that is minimised.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# ---------------------------------------------------------------- aggregation: per-token [B, T] -> scalar


def _safe_div(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    return numerator / denominator.clamp(min=1.0)


def token_mean(per_token: torch.Tensor, mask: torch.Tensor, group_index: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over every response token in the batch (DAPO's token-level aggregation)."""
    return _safe_div((per_token * mask).sum(), mask.sum())


def sample_mean(per_token: torch.Tensor, mask: torch.Tensor, group_index: torch.Tensor | None = None) -> torch.Tensor:
    """Token mean within each sequence, then mean over sequences that have tokens (GRPO's original)."""
    lengths = mask.sum(dim=1)
    per_sequence = _safe_div((per_token * mask).sum(dim=1), lengths)
    return _safe_div((per_sequence * (lengths > 0)).sum(), (lengths > 0).sum())


def prompt_mean(per_token: torch.Tensor, mask: torch.Tensor, group_index: torch.Tensor | None = None) -> torch.Tensor:
    """Token mean within each prompt's group of rollouts, then mean over prompts (ScaleRL's default)."""
    if group_index is None:
        raise ValueError("loss_agg 'prompt' needs group_index (the prompt of each sequence)")
    groups = int(group_index.max().item()) + 1 if group_index.numel() else 0
    token_sums = torch.zeros(groups, dtype=per_token.dtype).index_add(0, group_index, (per_token * mask).sum(dim=1))
    token_counts = torch.zeros(groups, dtype=mask.dtype).index_add(0, group_index, mask.sum(dim=1))
    per_group = _safe_div(token_sums, token_counts)
    return _safe_div((per_group * (token_counts > 0)).sum(), (token_counts > 0).sum())


AGGREGATIONS: dict[str, Callable[..., torch.Tensor]] = {
    "prompt": prompt_mean,
    "token": token_mean,
    "sample": sample_mean,
}


def aggregate(name: str, per_token: torch.Tensor, mask: torch.Tensor, group_index: torch.Tensor | None = None) -> torch.Tensor:
    """Scalar from per-token values [B, T] by aggregation mode `name` (prompt | token | sample)."""
    if name not in AGGREGATIONS:
        raise ValueError(f"unknown loss_agg {name!r}; expected one of {', '.join(AGGREGATIONS)}")
    return AGGREGATIONS[name](per_token, mask.to(per_token.dtype), group_index)


# ---------------------------------------------------------------- policy losses: -> (per-token loss, clipped)


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
    # value exp(sequence log-ratio) on every token; gradient s * d logp_t, so the sequence-mean of tokens is GSPO's gradient
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


def policy_loss(name: str, logp, old_logp, advantages, mask, *, clip_low: float, clip_high: float,
                agg: str, group_index=None) -> tuple[torch.Tensor, dict[str, float]]:
    """(scalar loss, stats) for policy loss `name` aggregated by `agg`; stats: clip_fraction, ratio_mean."""
    if name not in POLICY_LOSSES:
        raise ValueError(f"unknown loss {name!r}; expected one of {', '.join(POLICY_LOSSES)}")
    per_token, clipped = POLICY_LOSSES[name](logp, old_logp, advantages, mask, clip_low=clip_low, clip_high=clip_high)
    loss = aggregate(agg, per_token, mask, group_index)
    with torch.no_grad():
        mask_f = mask.to(logp.dtype)
        stats = {
            "clip_fraction": token_mean(clipped.to(logp.dtype), mask_f).item(),
            "ratio_mean": token_mean(torch.exp(logp - old_logp), mask_f).item(),
        }
    return loss, stats


# ---------------------------------------------------------------- regularisers


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || pi_ref): exp(ref - logp) - (ref - logp) - 1 (>= 0, unbiased)."""
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1.0


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-position entropy [..] in nats of softmax(logits [.., V])."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return -(logprobs.exp() * logprobs).sum(dim=-1)
