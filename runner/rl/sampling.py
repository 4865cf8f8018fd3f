"""Torch sampling for the local loop and the base-model build: n rollouts per prompt, with log-probs.
Layout: [B, L], B = prompts x n with a prompt's rollouts adjacent; left-padded prompt, then right-padded response."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from rlscale.runner.rl.head import head_matmul
from transformers import DynamicCache


@dataclass
class Rollouts:
    """Sampled sequences and what the trainer needs from them (see the module docstring for the layout)."""

    input_ids: torch.Tensor  # [B, L] long
    attention_mask: torch.Tensor  # [B, L] long, 0 on padding
    response_mask: torch.Tensor  # [B, L] float, 1 on generated tokens (EOS included)
    logp: torch.Tensor  # [B, L] float32, behaviour-policy log-probs of generated tokens
    truncated: torch.Tensor  # [B] bool, no EOS within max_new_tokens
    completions: list[str]  # decoded responses, special tokens removed

    @property
    def response_tokens(self) -> int:
        """Generated tokens in the batch (EOS included)."""
        return int(self.response_mask.sum().item())


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, so a padded prompt sees the same positions as an unpadded one."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def last_hidden(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The decoder's final hidden states [B, L, H] (before the LM head), positions skipping left padding."""
    return model.model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask), use_cache=False
    ).last_hidden_state


def head_logits(model, hidden: torch.Tensor, fp32_head: bool, precision: str = "fp32") -> torch.Tensor:
    """Logits [.., V] of hidden states [.., H]; with `fp32_head` float32 logits even under autocast (ScaleRL's FP32
    head), its matmul at `precision` (runner/rl/head.py); without, the model's own head in its compute dtype."""
    head = model.lm_head
    if fp32_head:
        return head_matmul(hidden, head.weight, head.bias, precision)
    return head(hidden)


def model_device(model) -> torch.device:
    """The device the model's LM head lives on (where its inputs must be)."""
    return model.lm_head.weight.device


@torch.no_grad()
def sample(
    model,
    prompt_ids: list[list[int]],
    *,
    n: int,
    max_new_tokens: int,
    temperature: float,
    eos_id: int,
    pad_id: int,
    generator: torch.Generator,
    fp32_head: bool = True,
    head_precision: str = "fp32",
    decode=None,
) -> Rollouts:
    """`n` rollouts for each prompt (token ids, BOS included) at `temperature`; `generator` must be on the model's
    device. The head runs as the trainer's (`fp32_head`, `head_precision`), so on-policy importance ratios are 1."""
    device = model_device(model)
    width = max(len(ids) for ids in prompt_ids)
    rows = [ids for ids in prompt_ids for _ in range(n)]
    batch = len(rows)
    # built on the CPU, then moved once: no per-row host-to-device copies
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long, device="cpu")
    attention_mask = torch.zeros((batch, width), dtype=torch.long, device="cpu")
    for row, ids in enumerate(rows):
        input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long, device="cpu")
        attention_mask[row, width - len(ids) :] = 1
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    new_tokens, new_logp, new_mask = [], [], []
    cache = DynamicCache(config=model.config)
    step_ids, step_positions = input_ids, position_ids(attention_mask)
    for _ in range(max_new_tokens):
        hidden = model.model(
            input_ids=step_ids,
            attention_mask=attention_mask,
            position_ids=step_positions,
            past_key_values=cache,
            use_cache=True,
        ).last_hidden_state[:, -1:, :]
        logits = head_logits(model, hidden, fp32_head, head_precision)[:, -1, :].float()
        logprobs = torch.log_softmax(logits / temperature, dim=-1)
        token = torch.multinomial(logprobs.exp(), 1, generator=generator).squeeze(1)
        alive = ~finished
        token = torch.where(alive, token, torch.full_like(token, pad_id))
        new_tokens.append(token)
        new_logp.append(torch.where(alive, logprobs.gather(1, token[:, None]).squeeze(1), 0.0))
        new_mask.append(alive.float())
        input_ids = torch.cat([input_ids, token[:, None]], dim=1)
        attention_mask = torch.cat([attention_mask, alive.long()[:, None]], dim=1)
        step_ids, step_positions = token[:, None], step_positions[:, -1:] + 1
        finished = finished | (token == eos_id)
        if bool(finished.all()):
            break
    response = torch.stack(new_tokens, 1)
    response_mask = torch.stack(new_mask, 1)
    logp = torch.zeros(input_ids.shape, dtype=torch.float32, device=device)
    logp[:, width:] = torch.stack(new_logp, 1)
    mask = torch.zeros(input_ids.shape, dtype=torch.float32, device=device)
    mask[:, width:] = response_mask
    completions = []
    response, response_mask = response.cpu(), response_mask.cpu()
    for row in range(batch):
        ids = response[row][response_mask[row].bool()].tolist()
        ids = [t for t in ids if t not in (eos_id, pad_id)]
        completions.append(decode(ids) if decode else "")
    return Rollouts(input_ids, attention_mask, mask, logp, ~finished, completions)
