"""Losses, aggregation, advantages, filters and the train step against hand-computed values, gradients included."""

import math

import pytest
import torch
from rlscale.planner.recipe import Recipe
from rlscale.runner.rl.advantages import PromptPool, compute_advantages, zero_variance_mask
from rlscale.runner.rl.losses import aggregate, kl_k3, policy_loss

torch.set_num_threads(1)
LN = math.log


def close(got, want, rel=1e-6):
    return torch.allclose(
        torch.as_tensor(got, dtype=torch.float64), torch.tensor(want, dtype=torch.float64), rtol=rel, atol=1e-9
    )


def leaf(values):
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


# ---------------------------------------------------------------- aggregation

# two prompts: sequences 0,1 answer prompt 0 (lengths 1 and 3), sequence 2 answers prompt 1 (length 2)
PER_TOKEN = torch.tensor([[1.0, 0.0, 0.0], [2.0, 4.0, 6.0], [3.0, 5.0, 0.0]], dtype=torch.float64)
MASK = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
GROUPS = torch.tensor([0, 0, 1])


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token", (1 + 2 + 4 + 6 + 3 + 5) / 6),  # 21 / 6 = 3.5
        ("sample", (1.0 + 4.0 + 4.0) / 3),  # sequence means 1, 4, 4
        ("prompt", ((1 + 2 + 4 + 6) / 4 + (3 + 5) / 2) / 2),  # group means 3.25 and 4
    ],
)
def test_aggregation_values(mode, expected):
    assert aggregate(mode, PER_TOKEN, MASK, GROUPS).item() == pytest.approx(expected)


@pytest.mark.parametrize(
    "mode, weights",
    [
        ("token", [[1 / 6, 0, 0], [1 / 6] * 3, [1 / 6, 1 / 6, 0]]),
        ("sample", [[1 / 3, 0, 0], [1 / 9] * 3, [1 / 6, 1 / 6, 0]]),
        ("prompt", [[1 / 8, 0, 0], [1 / 8] * 3, [1 / 4, 1 / 4, 0]]),
    ],
)
def test_aggregation_token_weights_are_the_gradient(mode, weights):
    per_token = PER_TOKEN.clone().requires_grad_(True)
    aggregate(mode, per_token, MASK, GROUPS).backward()
    assert torch.allclose(per_token.grad, torch.tensor(weights, dtype=torch.float64))


def test_aggregation_ignores_empty_sequences_and_groups():
    mask = MASK.clone()
    mask[2] = 0  # prompt 1 filtered away: only prompt 0 remains
    assert aggregate("prompt", PER_TOKEN, mask, GROUPS).item() == pytest.approx(13 / 4)
    assert aggregate("sample", PER_TOKEN, mask, GROUPS).item() == pytest.approx((1 + 4) / 2)


def test_unknown_mode_is_rejected():
    with pytest.raises(ValueError, match="loss_agg"):
        aggregate("seq-sum", PER_TOKEN, MASK, GROUPS)


# ---------------------------------------------------------------- policy losses, one sequence of 3 tokens

# ratios r = exp(logp - old) of 1.5, 0.5, 1.1 (the first two outside a 0.2 clip, the third inside)
OLD = [0.0, 0.0, 0.0]
LOGP = [LN(1.5), LN(0.5), LN(1.1)]
ONE_MASK = torch.ones(1, 3, dtype=torch.float64)
ONE_GROUP = torch.zeros(1, dtype=torch.long)


def run_loss(name, advantage, clip_low, clip_high, logp=LOGP, agg="token"):
    logp = leaf([logp])
    loss, stats = policy_loss(
        name,
        logp,
        torch.tensor([OLD], dtype=torch.float64),
        torch.tensor([advantage], dtype=torch.float64),
        ONE_MASK,
        clip_low=clip_low,
        clip_high=clip_high,
        agg=agg,
        group_index=ONE_GROUP,
    )
    loss.backward()
    return loss.item(), logp.grad[0].tolist(), {key: value.item() for key, value in stats.items()}


def test_grpo_positive_advantage_clips_the_rising_token_only():
    # A = 1: terms max(-r, -clip(r)) = -1.2, -0.5, -1.1; d/dlogp = -r where unclipped, 0 where clipped
    loss, grad, stats = run_loss("grpo", 1.0, 0.2, 0.2)
    assert loss == pytest.approx((-1.2 - 0.5 - 1.1) / 3)
    assert grad == pytest.approx([0.0, -0.5 / 3, -1.1 / 3])
    assert stats["clip_fraction"] == pytest.approx(1 / 3)


def test_grpo_negative_advantage_clips_the_falling_token_only():
    # A = -1: terms max(r, clip(r)) = 1.5, 0.8, 1.1; the token at r = 0.5 is clipped (no gradient)
    loss, grad, _ = run_loss("grpo", -1.0, 0.2, 0.2)
    assert loss == pytest.approx((1.5 + 0.8 + 1.1) / 3)
    assert grad == pytest.approx([1.5 / 3, 0.0, 1.1 / 3])


def test_dapo_clip_higher_lets_more_rising_probability_through():
    # r = 1.25 is clipped by GRPO's 1.2 but not by DAPO's 1.28
    logp = [LN(1.25), 0.0, 0.0]
    grpo_loss, grpo_grad, _ = run_loss("grpo", 1.0, 0.2, 0.2, logp=logp)
    dapo_loss, dapo_grad, _ = run_loss("dapo", 1.0, 0.2, 0.28, logp=logp)
    assert grpo_loss == pytest.approx((-1.2 - 1 - 1) / 3) and grpo_grad[0] == 0.0
    assert dapo_loss == pytest.approx((-1.25 - 1 - 1) / 3) and dapo_grad[0] == pytest.approx(-1.25 / 3)


def test_cispo_keeps_gradient_through_clipped_tokens():
    # loss = -mean(sg(clip(r, 0.8, 1.2)) * A * logp); weights 1.2, 0.8, 1.1; grad = -w A / 3 for every token
    loss, grad, stats = run_loss("cispo", 2.0, 0.2, 0.2)
    weights = [1.2, 0.8, 1.1]
    assert loss == pytest.approx(-sum(w * 2.0 * lp for w, lp in zip(weights, LOGP)) / 3)
    assert grad == pytest.approx([-w * 2.0 / 3 for w in weights])
    assert all(g != 0 for g in grad)
    assert stats["clip_fraction"] == pytest.approx(2 / 3)


def test_cispo_default_range_truncates_only_above():
    # the recipe default for cispo: no lower truncation, upper bound 5
    low, high = Recipe().clip_range
    assert (max(0.0, 1 - low), 1 + high) == (0.0, 5.0)
    _, grad, stats = run_loss("cispo", 1.0, low, high, logp=[LN(7.0), LN(0.1), 0.0])
    assert grad == pytest.approx([-5.0 / 3, -0.1 / 3, -1.0 / 3])
    assert stats["clip_fraction"] == pytest.approx(1 / 3)


def test_gspo_uses_the_sequence_ratio():
    # token log-ratios ln 1.5, ln 0.5, ln 1.1 -> s = (1.5 * 0.5 * 1.1) ** (1/3) = 0.9378 (inside [0.8, 1.2])
    s = (1.5 * 0.5 * 1.1) ** (1 / 3)
    loss, grad, stats = run_loss("gspo", 1.0, 0.2, 0.2)
    assert loss == pytest.approx(-s)
    assert grad == pytest.approx([-s / 3] * 3)  # every token gets the same weight s / |y|
    assert stats["clip_fraction"] == 0.0


def test_gspo_clipped_sequence_has_no_gradient():
    # s = (1.5 * 1.5 * 1.5) ** (1/3) = 1.5 > 1.2 with A > 0: the whole sequence is clipped
    loss, grad, stats = run_loss("gspo", 1.0, 0.2, 0.2, logp=[LN(1.5)] * 3)
    assert loss == pytest.approx(-1.2)
    assert grad == pytest.approx([0.0, 0.0, 0.0])
    assert stats["clip_fraction"] == 1.0


def test_on_policy_losses_all_equal_reinforce():
    # at r = 1 nothing is clipped and every loss has the REINFORCE gradient -A / |y| per token
    for name in ("grpo", "dapo", "gspo", "cispo"):
        _, grad, _ = run_loss(name, 0.5, 0.2, 0.28, logp=[0.0, 0.0, 0.0])
        assert grad == pytest.approx([-0.5 / 3] * 3), name


def test_prompt_aggregation_in_policy_loss():
    # two prompts; prompt 0 has two 1-token sequences (A = +1, -1), prompt 1 one 2-token sequence (A = 2); CISPO at r
    # = 1
    logp = leaf([[LN(0.5), 0.0], [LN(0.25), 0.0], [LN(0.5), LN(0.5)]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    loss, _ = policy_loss(
        "cispo",
        logp,
        logp.detach(),
        torch.tensor([1.0, -1.0, 2.0], dtype=torch.float64),
        mask,
        clip_low=1.0,
        clip_high=4.0,
        agg="prompt",
        group_index=torch.tensor([0, 0, 1]),
    )
    prompt0 = (-LN(0.5) + LN(0.25)) / 2
    prompt1 = -2 * LN(0.5)
    assert loss.item() == pytest.approx((prompt0 + prompt1) / 2)
    loss.backward()
    assert close(logp.grad, [[-0.25, 0.0], [0.25, 0.0], [-0.5, -0.5]])


# ---------------------------------------------------------------- KL, entropy


def test_kl_k3_values_and_gradient():
    logp = leaf([LN(0.5), LN(0.25)])
    ref = torch.tensor([LN(0.25), LN(0.25)], dtype=torch.float64)
    kl = kl_k3(logp, ref)
    # ref/p = 0.5: 0.5 - ln 0.5 - 1 = 0.19315; equal policies: 0
    assert kl.tolist() == pytest.approx([0.5 - LN(0.5) - 1, 0.0])
    kl.sum().backward()
    assert logp.grad.tolist() == pytest.approx([1 - 0.5, 0.0])  # d/dlogp = 1 - ref/p


# ---------------------------------------------------------------- advantages and filters

REWARDS = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])


def test_advantage_none_is_centred_reward():
    assert compute_advantages(REWARDS, "none").tolist() == [[0.5, -0.5, -0.5, 0.5], [0.25, 0.25, 0.25, -0.75]]


def test_advantage_group_divides_by_group_std():
    std0, std1 = (1 / 3) ** 0.5, 0.5  # unbiased: var = sum (r - mean)^2 / (n - 1)
    expected = [[0.5 / std0, -0.5 / std0, -0.5 / std0, 0.5 / std0], [0.25 / std1] * 3 + [-0.75 / std1]]
    assert close(compute_advantages(REWARDS, "group"), expected, rel=1e-5)


def test_advantage_batch_divides_by_batch_std():
    std = (8 * (5 / 8) * (3 / 8) / 7) ** 0.5  # 5 ones in 8 rewards, unbiased
    expected = [[0.5 / std, -0.5 / std, -0.5 / std, 0.5 / std], [0.25 / std] * 3 + [-0.75 / std]]
    assert close(compute_advantages(REWARDS, "batch"), expected, rel=1e-5)


def test_zero_variance_groups_get_zero_advantage_and_are_filtered():
    rewards = torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.0, 1.0]])
    assert zero_variance_mask(rewards).tolist() == [False, False, True]
    for norm in ("batch", "group", "none"):
        assert compute_advantages(rewards, norm)[:2].abs().max().item() < 1e-6


def test_prompt_pool_retires_prompts_above_threshold_for_later_epochs():
    pool = PromptPool(list(range(4)), retire_above=0.9, seed=0, key=lambda p: p)
    first_epoch = pool.sample(4)
    assert sorted(first_epoch) == [0, 1, 2, 3]
    pool.record(2, [1, 1, 1, 1])  # pass rate 1.0 > 0.9: retired
    pool.record(1, [1, 1, 1, 0])  # 0.75: stays
    pool.record(1, [1, 1, 1, 1])  # history 7/8 = 0.875: stays
    assert pool.retired == {2} and pool.pass_rate(1) == pytest.approx(7 / 8)
    assert sorted(pool.sample(3)) == [0, 1, 3] and pool.active == 3


def test_prompt_pool_without_threshold_never_retires():
    pool = PromptPool(["a", "b"], retire_above=None, seed=0, key=lambda p: p)
    pool.record("a", [1, 1])
    assert pool.retired == set() and sorted(pool.sample(4)) == ["a", "a", "b", "b"]


def test_prompt_pool_is_deterministic_by_seed():
    draws = [PromptPool(list(range(50)), retire_above=0.9, seed=s, key=lambda p: p).sample(10) for s in (3, 3, 4)]
    assert draws[0] == draws[1] != draws[2]


# ---------------------------------------------------------------- recipe knobs


def test_lr_scales_with_sqrt_total_batch():
    recipe = Recipe(lr=1e-4, prompts_per_batch=12, rollouts=16, lr_reference_batch=768)
    assert recipe.scaled_lr == pytest.approx(1e-4 * (192 / 768) ** 0.5)
    assert Recipe(lr=1e-4, lr_scaling="none", prompts_per_batch=12).scaled_lr == 1e-4


def test_recipe_clip_defaults_per_loss():
    assert Recipe(loss="grpo").clip_range == (0.2, 0.2)
    assert Recipe(loss="dapo").clip_range == (0.2, 0.28)
    assert Recipe(loss="dapo", clip_high=0.3).clip_range == (0.2, 0.3)
