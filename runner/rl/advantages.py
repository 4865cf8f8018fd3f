"""Advantages from grouped binary rewards [B_p, n], the zero-variance filter and no-positive resampling.
No value network (ScaleRL): the baseline is the group mean; the scale is the batch, group or no standard deviation."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

STD_EPS = 1e-6  # keeps all-equal groups/batches finite; their centred rewards are 0 anyway

P = TypeVar("P")


def _centred(rewards: torch.Tensor) -> torch.Tensor:
    return rewards - rewards.mean(dim=1, keepdim=True)


def batch_norm(rewards: torch.Tensor) -> torch.Tensor:
    """(r - group mean) / std of all rewards in the batch (ScaleRL's choice)."""
    std = rewards.std() if rewards.numel() > 1 else rewards.new_zeros(())
    return _centred(rewards) / (std + STD_EPS)


def group_norm(rewards: torch.Tensor) -> torch.Tensor:
    """(r - group mean) / group std (GRPO)."""
    if rewards.shape[1] < 2:
        return torch.zeros_like(rewards)
    return _centred(rewards) / (rewards.std(dim=1, keepdim=True) + STD_EPS)


def no_norm(rewards: torch.Tensor) -> torch.Tensor:
    """r - group mean, unscaled (Dr. GRPO)."""
    return _centred(rewards)


# std is the unbiased (n - 1) estimate, as torch.std, verl and TRL compute it
ADVANTAGE_NORMS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "batch": batch_norm,
    "group": group_norm,
    "none": no_norm,
}


def compute_advantages(rewards: torch.Tensor, norm: str) -> torch.Tensor:
    """Advantages [B_p, n] for rewards [B_p, n] under normalisation `norm` (batch | group | none)."""
    if norm not in ADVANTAGE_NORMS:
        raise ValueError(f"unknown adv_norm {norm!r}; expected one of {', '.join(ADVANTAGE_NORMS)}")
    return ADVANTAGE_NORMS[norm](rewards.float())


def zero_variance_mask(rewards: torch.Tensor) -> torch.Tensor:
    """[B_p] bool, True for prompts whose rollouts disagree (the only ones with a learning signal)."""
    return (rewards != rewards[:, :1]).any(dim=1)


class PromptPool:
    """Training prompts served in seeded epochs, with ScaleRL's no-positive resampling: a prompt whose historical
    pass rate (rollouts solved / seen) exceeds `retire_above` (None: never) is dropped from all later epochs."""

    def __init__(self, prompts: Sequence[P], *, retire_above: float | None, seed: int, key=lambda p: p.id):
        self._prompts = list(prompts)
        self._key = key
        self.retire_above = retire_above
        self._rng = random.Random(seed)
        self.solved: dict = {}
        self.seen: dict = {}
        self.retired: set = set()
        self._queue: list[P] = []
        self.epoch = 0

    @property
    def active(self) -> int:
        """How many prompts are still in rotation (not retired)."""
        return len(self._prompts) - len(self.retired)

    def sample(self, count: int) -> list[P]:
        """The next `count` prompts of the current epoch; a new shuffled epoch of active prompts when it runs out."""
        batch = []
        while len(batch) < count:
            if not self._queue:
                self._queue = [p for p in self._prompts if self._key(p) not in self.retired]
                if not self._queue:  # every prompt retired: keep training on the full set rather than stop
                    self._queue = list(self._prompts)
                self._rng.shuffle(self._queue)
                self.epoch += 1
            batch.append(self._queue.pop())
        return batch

    def record(self, prompt: P, rewards: Sequence[float]) -> None:
        """Add one prompt's rollout rewards to its history; retire it if its pass rate now exceeds the threshold."""
        key = self._key(prompt)
        self.solved[key] = self.solved.get(key, 0.0) + float(sum(rewards))
        self.seen[key] = self.seen.get(key, 0) + len(rewards)
        if self.retire_above is not None and self.solved[key] / self.seen[key] > self.retire_above:
            self.retired.add(key)

    def pass_rate(self, prompt: P) -> float | None:
        """Historical pass rate of `prompt`, None if never sampled."""
        key = self._key(prompt)
        return self.solved[key] / self.seen[key] if self.seen.get(key) else None
