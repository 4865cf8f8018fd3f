"""The train batch the trainer tests share (CPU and GPU): made on the CPU from the tiny policy's own samples,
with the module fixtures that build it (tokenizer, base policy, batch), and one plain-SGD step to compare steps by."""

import copy

import pytest
import torch
from rlscale.planner.recipe import Recipe
from rlscale.runner.rl.policy import build_model, build_tokenizer
from rlscale.runner.rl.sampling import sample
from rlscale.runner.rl.train_step import TrainBatch, train_step


def perturbed_batch(tokenizer, base) -> TrainBatch:
    """4 prompts of different lengths x 4 rollouts; responses cut to different lengths (right padding), the
    behaviour log-probs perturbed so ratios leave the clip range, and prompt 3 all-correct (filtered)."""
    texts = ("07+35=", "1+2=", "50+25=", "9+10=")
    rollouts = sample(
        base,
        [tokenizer(t)["input_ids"] for t in texts],
        n=4,
        max_new_tokens=6,
        temperature=1.0,
        eos_id=tokenizer.eos_token_id,
        pad_id=tokenizer.pad_token_id,
        generator=torch.Generator().manual_seed(0),
    )
    input_ids, attention, response = (
        rollouts.input_ids.clone(),
        rollouts.attention_mask.clone(),
        rollouts.response_mask.clone(),
    )
    start = input_ids.shape[1] - 6
    for row in range(input_ids.shape[0]):
        keep = 1 + row % 6  # response lengths 1..6
        input_ids[row, start + keep :] = tokenizer.pad_token_id
        attention[row, start + keep :] = 0
        response[row, start + keep :] = 0
    noise = torch.randn(input_ids.shape, generator=torch.Generator().manual_seed(1))
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0], [1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    return TrainBatch(input_ids, attention, response, (rollouts.logp + 0.3 * noise) * response, rewards)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def base(tokenizer):
    return build_model(tokenizer, seed=0).eval()


@pytest.fixture(scope="module")
def batch(tokenizer, base):
    """CPU batch (tests/trainer_batch.py)."""
    return perturbed_batch(tokenizer, base)


def sgd_recipe(**changes) -> Recipe:
    """4 x 4 rollouts, plain SGD at lr 1 (no warmup, no clipping): a step's weight change is its gradient."""
    return Recipe(
        prompts_per_batch=4, rollouts=4, lr=1.0, lr_scaling="none", lr_warmup_steps=0, grad_clip=1e9, **changes
    )


def sgd_step(base, batch: TrainBatch, recipe, ref: bool = False) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """(metrics, flat gradient, flat weights) of one SGD train_step on a copy of `base`."""
    model = copy.deepcopy(base)
    optimizer = torch.optim.SGD(model.parameters(), lr=recipe.lr)
    metrics = train_step(model, optimizer, batch, recipe, ref_model=copy.deepcopy(base) if ref else None)
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    return metrics, grads, torch.cat([p.detach().flatten() for p in model.parameters()])
