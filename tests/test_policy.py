"""The tiny policy: tokenizer, HF format, sampler/trainer log-prob agreement, FP32 head, and the shipped weights."""

import json

import pytest
import torch
from rlscale.planner.recipe import Recipe
from rlscale.runner.rl.policy import ARCHITECTURE, build_model, build_tokenizer
from rlscale.runner.rl.sampling import sample
from rlscale.runner.rl.train_step import TrainBatch, last_hidden, make_optimizer, token_logprobs, train_step

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_model(tokenizer, seed=0).eval()


def test_character_tokenizer_round_trip(tokenizer):
    ids = tokenizer("07+35=")["input_ids"]
    assert ids[0] == tokenizer.bos_token_id and len(ids) == 7
    assert (
        tokenizer.decode(ids[1:] + [tokenizer.eos_token_id, tokenizer.pad_token_id], skip_special_tokens=True)
        == "07+35="
    )
    assert len({tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id}) == 3


def test_architecture_fits_vllm_cpu():
    assert ARCHITECTURE["hidden_size"] == 128 and ARCHITECTURE["num_hidden_layers"] == 2
    assert ARCHITECTURE["head_dim"] >= 32
    assert ARCHITECTURE["head_dim"] * ARCHITECTURE["num_attention_heads"] == ARCHITECTURE["hidden_size"]


def test_saved_directory_loads_with_auto_classes(tmp_path, tokenizer, model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    loaded_tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    ids = torch.tensor([loaded_tokenizer("12+34=")["input_ids"]])
    assert torch.allclose(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
    assert loaded.config.architectures == ["LlamaForCausalLM"]


def test_sampler_log_probs_match_the_trainer(tokenizer, model):
    # on-policy the importance ratio must be exactly 1: the cached sampler and the trainer agree
    prompts = [tokenizer(text)["input_ids"] for text in ("07+35=", "1+2=")]  # different lengths: left padding
    rollouts = sample(
        model,
        prompts,
        n=3,
        max_new_tokens=5,
        temperature=0.7,
        eos_id=tokenizer.eos_token_id,
        pad_id=tokenizer.pad_token_id,
        generator=torch.Generator().manual_seed(0),
        decode=tokenizer.decode,
    )
    logp, _ = token_logprobs(model, rollouts.input_ids, rollouts.attention_mask, temperature=0.7, fp32_head=True)
    mask = rollouts.response_mask
    assert mask.sum() > 0
    assert torch.allclose(logp * mask, rollouts.logp, atol=1e-5)


def test_sampling_is_deterministic_by_generator(tokenizer, model):
    prompts = [tokenizer("07+35=")["input_ids"]]
    draw = lambda seed: (
        sample(
            model,
            prompts,
            n=4,
            max_new_tokens=4,
            temperature=1.0,
            eos_id=2,
            pad_id=0,
            generator=torch.Generator().manual_seed(seed),
            decode=tokenizer.decode,
        ).input_ids
    )
    assert torch.equal(draw(1), draw(1))
    assert not torch.equal(draw(1), draw(2))


def test_fp32_head_matches_in_float32_and_differs_in_bfloat16(tokenizer, model):
    ids = torch.tensor([tokenizer("07+35=42")["input_ids"]])
    mask = torch.ones_like(ids)
    fp32, _ = token_logprobs(model, ids, mask, temperature=1.0, fp32_head=True)
    plain, _ = token_logprobs(model, ids, mask, temperature=1.0, fp32_head=False)
    assert torch.allclose(fp32, plain, atol=1e-6)  # a float32 model: the FP32 head changes nothing
    low = build_model(tokenizer, seed=0).to(torch.bfloat16)
    low_fp32, _ = token_logprobs(low, ids, mask, temperature=1.0, fp32_head=True)
    low_plain, _ = token_logprobs(low, ids, mask, temperature=1.0, fp32_head=False)
    # the head alone, exact on the bf16 model's own hidden states: the FP32 head matches it, the bf16 head does not
    # (the body's bf16 rounding is the same in both, so it is left out of the comparison)
    hidden = last_hidden(low, ids, mask)[0, :-1].double()
    exact = torch.log_softmax(hidden @ low.lm_head.weight.double().T, dim=-1).gather(1, ids[0, 1:, None])[:, 0]
    fp32_error = (low_fp32[0, 1:].double() - exact).abs().max()
    bf16_error = (low_plain[0, 1:].double() - exact).abs().max()
    assert fp32_error < 1e-5 and bf16_error > 10 * fp32_error, (fp32_error, bf16_error)


def test_train_step_raises_probability_of_rewarded_rollouts(tokenizer):
    model = build_model(tokenizer, seed=0)
    recipe = Recipe(prompts_per_batch=2, rollouts=4, lr=1e-3, lr_scaling="none", max_new_tokens=4)
    prompts = [tokenizer(text)["input_ids"] for text in ("07+35=", "11+11=")]
    rollouts = sample(
        model,
        prompts,
        n=4,
        max_new_tokens=4,
        temperature=1.0,
        eos_id=2,
        pad_id=0,
        generator=torch.Generator().manual_seed(0),
        decode=tokenizer.decode,
    )
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])  # prompt 1 has no variance: filtered
    batch = TrainBatch(rollouts.input_ids, rollouts.attention_mask, rollouts.response_mask, rollouts.logp, rewards)
    optimizer = make_optimizer(model, recipe)
    before = (rollouts.logp[0] * rollouts.response_mask[0]).sum()
    metrics = train_step(model, optimizer, batch, recipe)
    after_logp, _ = token_logprobs(model, rollouts.input_ids, rollouts.attention_mask, temperature=1.0, fp32_head=True)
    after = (after_logp[0] * rollouts.response_mask[0]).sum()
    assert metrics["kept_prompts"] == 1 and metrics["updates"] == 1
    assert after > before  # the one rewarded rollout became more likely
    assert metrics["clip_fraction"] == 0.0  # on-policy: CISPO's weight is 1


def test_the_shipped_base_policy_is_the_same_on_every_host_and_has_room_to_climb(workdir):
    from rlscale.runner.rl.policy import PORTABLE_ENV, SHIPPED_DIR, base_model_dir, load_policy, sampled_pass_rate
    from rlscale.runner.rl.tasks import arithmetic_task

    path = base_model_dir()
    assert path == SHIPPED_DIR and not (workdir / "cache" / "base-model-v5").exists()  # nothing built on the way
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    } <= {p.name for p in path.iterdir()}
    info = json.loads((path / "rlscale_base_model.json").read_text())
    assert info["portable"] and info["environment"] == PORTABLE_ENV  # built the way --rebuild builds it
    assert 0.8 <= info["sampled_pass_rate"] <= 0.9  # knows the sums: RL sharpens them to a plateau within minutes
    model, tokenizer = load_policy(path)
    assert model.config.head_dim >= 32 and tokenizer.eos_token_id == 2
    task = arithmetic_task(2, 0)
    rate = sampled_pass_rate(model, tokenizer, task, task.validation(info["eval_prompts"]), seed=0)
    assert abs(rate - info["sampled_pass_rate"]) <= 0.05  # the weights are the policy the metadata describes


def test_a_changed_base_policy_file_is_refused_with_the_file_it_is_in(tmp_path):
    import shutil

    from rlscale.runner.rl.policy import SHIPPED_DIR, verify_checksums

    from rlscale.base.errors import UserError

    copy = shutil.copytree(SHIPPED_DIR, tmp_path / "base")
    verify_checksums(copy)
    weights = bytearray((copy / "model.safetensors").read_bytes())
    weights[-1] ^= 1  # one bit of the last weight
    (copy / "model.safetensors").write_bytes(bytes(weights))
    with pytest.raises(UserError, match=r"SHA256SUMS: the base policy's model.safetensors is damaged"):
        verify_checksums(copy)


def _sampled_batch(tokenizer, model, rewards):
    prompts = [tokenizer(text)["input_ids"] for text in ("07+35=", "11+11=", "50+25=", "99+01=")][: rewards.shape[0]]
    rollouts = sample(
        model,
        prompts,
        n=rewards.shape[1],
        max_new_tokens=4,
        temperature=1.0,
        eos_id=2,
        pad_id=0,
        generator=torch.Generator().manual_seed(0),
        decode=tokenizer.decode,
    )
    return TrainBatch(rollouts.input_ids, rollouts.attention_mask, rollouts.response_mask, rollouts.logp, rewards)


def test_ppo_off_policy_takes_one_update_per_minibatch_and_clips_later_ones(tokenizer):
    model = build_model(tokenizer, seed=0)
    rewards = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    recipe = Recipe(
        loss="grpo",
        prompts_per_batch=4,
        rollouts=2,
        lr=0.05,
        lr_scaling="none",
        lr_warmup_steps=0,
        async_mode="ppo_off_policy",
        ppo_minibatches=4,
    )
    metrics = train_step(model, make_optimizer(model, recipe), _sampled_batch(tokenizer, model, rewards), recipe)
    assert metrics["updates"] == 4
    assert metrics["clip_fraction"] > 0  # minibatches 2-4 see a moved policy: ratios leave [0.8, 1.2]


def test_kl_term_needs_a_reference_and_is_zero_at_the_start(tokenizer):
    model = build_model(tokenizer, seed=0)
    rewards = torch.tensor([[1.0, 0.0]])
    recipe = Recipe(prompts_per_batch=1, rollouts=2, kl_coef=0.1, entropy_coef=0.01)
    batch = _sampled_batch(tokenizer, model, rewards)
    with pytest.raises(ValueError, match="reference"):
        train_step(model, make_optimizer(model, recipe), batch, recipe)
    import copy

    model = build_model(tokenizer, seed=0)
    metrics = train_step(model, make_optimizer(model, recipe), batch, recipe, ref_model=copy.deepcopy(model))
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-9) and metrics["entropy"] > 0


def test_warmup_ramps_the_learning_rate():
    from rlscale.runner.rl.train_step import warmup_lr

    recipe = Recipe(lr=1e-3, lr_scaling="none", lr_warmup_steps=3)
    assert [warmup_lr(recipe, k) for k in range(5)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])
