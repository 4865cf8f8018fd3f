"""The trainer without a GPU: device-correct tensor creation, micro-batching that leaves the loss unchanged,
the chunked LM head, activation checkpointing, and a checkpoint that resumes the next step exactly."""

import copy

import pytest
import torch
from rlscale.planner.recipe import Recipe
from rlscale.runner.rl.sampling import sample
from rlscale.runner.rl.train_step import micro_batches, token_logprobs, train_step
from trainer_batch import base, batch, tokenizer  # noqa: F401  (module fixtures)

torch.set_num_threads(1)

LOSSES = ("cispo", "gspo", "dapo", "grpo")
AGGREGATIONS = ("prompt", "token", "sample")
WHOLE = 10**9  # a micro-batch budget no batch reaches: one forward pass


def _recipe(**changes):
    # plain SGD at lr 1 (no warmup, no clipping) makes the weight change equal the accumulated gradient
    return Recipe(
        prompts_per_batch=4, rollouts=4, lr=1.0, lr_scaling="none", lr_warmup_steps=0, grad_clip=1e9, **changes
    )


def _step(base, batch, recipe, ref=False):
    model = copy.deepcopy(base)
    optimizer = torch.optim.SGD(model.parameters(), lr=recipe.lr)
    metrics = train_step(model, optimizer, batch, recipe, ref_model=copy.deepcopy(base) if ref else None)
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    return metrics, grads, weights


def _assert_same_step(one, other, tol=1e-5):
    (m1, g1, w1), (m2, g2, w2) = one, other
    for key in ("loss", "entropy", "kl", "clip_fraction", "ratio_mean", "grad_norm"):
        assert m1[key] == pytest.approx(m2[key], abs=tol), key
    assert (g1 - g2).abs().max().item() < tol
    assert (w1 - w2).abs().max().item() < tol
    assert g1.abs().max().item() > 1e-3  # the step really moved the weights


# ---------------------------------------------------------------- device mix-ups, caught on a CPU


@pytest.mark.parametrize("zero_variance_filter", [True, False])
@pytest.mark.parametrize("loss_agg", AGGREGATIONS)
def test_train_step_makes_every_tensor_on_the_batch_device(base, batch, zero_variance_filter, loss_agg):
    # A default device other than the batch's: any tensor the step makes without device= lands on 'meta', where
    # mixing it with the batch fails, as a CPU-made index tensor fails next to a CUDA batch.
    recipe = _recipe(
        loss_agg=loss_agg,
        zero_variance_filter=zero_variance_filter,
        kl_coef=0.1,
        entropy_coef=0.01,
        recompute_logprobs=True,
    )
    want, _, _ = _step(base, batch, recipe, ref=True)
    with torch.device("meta"):
        got, grads, _ = _step(base, batch, recipe, ref=True)
    assert grads.device.type == "cpu"
    assert got["loss"] == pytest.approx(want["loss"], abs=1e-6) and got["kept_prompts"] == (
        3 if zero_variance_filter else 4
    )


def test_sampler_makes_its_tensors_on_the_model_device(tokenizer, base):
    prompts = [tokenizer(t)["input_ids"] for t in ("07+35=", "1+2=")]
    draw = lambda: sample(
        base,
        prompts,
        n=2,
        max_new_tokens=4,
        temperature=1.0,
        eos_id=2,
        pad_id=0,
        generator=torch.Generator().manual_seed(0),
    )
    want = draw()
    with torch.device("meta"):
        got = draw()
    for name in ("input_ids", "attention_mask", "response_mask", "logp", "truncated"):
        assert getattr(got, name).device.type == "cpu", name
        assert torch.equal(getattr(got, name), getattr(want, name)), name


# ---------------------------------------------------------------- micro-batching leaves the step unchanged


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("loss_agg", AGGREGATIONS)
def test_micro_batched_step_equals_the_whole_batch_step(base, batch, loss, loss_agg):
    # budget 1: every rollout alone, so each prompt's group is split across micro-batches; 40: uneven splits
    whole = _step(base, batch, _recipe(loss=loss, loss_agg=loss_agg, micro_batch_tokens=WHOLE))
    for budget in (1, 40):
        _assert_same_step(_step(base, batch, _recipe(loss=loss, loss_agg=loss_agg, micro_batch_tokens=budget)), whole)


def test_micro_batching_with_kl_entropy_minibatches_and_recomputed_logprobs(base, batch):
    knobs = dict(
        kl_coef=0.1, entropy_coef=0.01, recompute_logprobs=True, ppo_minibatches=2, **{"async": "ppo_off_policy"}
    )
    whole = _step(base, batch, _recipe(micro_batch_tokens=WHOLE, **knobs), ref=True)
    assert whole[0]["updates"] == 2
    _assert_same_step(_step(base, batch, _recipe(micro_batch_tokens=1, **knobs), ref=True), whole)


def test_micro_batches_respect_the_token_budget_and_cover_every_row(batch):
    for budget in (1, 16, 40, 100, WHOLE):
        parts = micro_batches(batch.attention_mask, budget)
        assert [row for rows, _ in parts for row in rows] == list(range(batch.input_ids.shape[0]))
        for rows, columns in parts:
            span = columns.stop - columns.start
            assert len(rows) == 1 or len(rows) * span <= budget
            attended = batch.attention_mask[rows]
            assert attended[:, columns].sum() == attended.sum()  # the span drops only padding
    assert len(micro_batches(batch.attention_mask, WHOLE)) == 1


def test_activation_checkpointing_gives_the_same_step(base, batch):
    plain = _step(base, batch, _recipe(micro_batch_tokens=40))
    _assert_same_step(_step(base, batch, _recipe(micro_batch_tokens=40, activation_checkpointing=True)), plain)


def test_chunked_lm_head_gives_the_same_logprobs_entropy_and_gradients(base, batch):
    def run(chunk_elements):
        model = copy.deepcopy(base)
        logp, entropy = token_logprobs(
            model,
            batch.input_ids,
            batch.attention_mask,
            temperature=0.7,
            fp32_head=True,
            with_entropy=True,
            entropy_grad=True,
            chunk_elements=chunk_elements,
        )
        ((logp * batch.response_mask).sum() + entropy.sum()).backward()
        return logp, entropy, model.lm_head.weight.grad, model.model.embed_tokens.weight.grad

    whole = run(10**12)
    vocab = base.lm_head.weight.shape[0]
    chunked = run(batch.input_ids.shape[0] * vocab * 2)  # two positions per chunk, recomputed in backward
    for got, want in zip(chunked, whole):
        assert torch.allclose(got, want, atol=1e-5)


# ---------------------------------------------------------------- checkpoints


def test_trainer_state_resumes_the_next_step_exactly(tmp_path, tokenizer, base, batch):
    from rlscale.runner.builtin.trainer import Trainer

    base.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    recipe = Recipe(prompts_per_batch=4, rollouts=4, lr=1e-3, lr_warmup_steps=2)
    first = Trainer(tmp_path, recipe)
    train_step(first.model, first.optimizer, batch, recipe)
    blob = first.state()
    draw = torch.rand(4)
    torch.manual_seed(123)  # the RNG moves on; load_state must bring it back
    second = Trainer(tmp_path, recipe)
    second.load_state(blob)
    assert torch.equal(torch.rand(4), draw)
    want = train_step(first.model, first.optimizer, batch, recipe)
    got = train_step(second.model, second.optimizer, batch, recipe)
    assert got == want
    for p, q in zip(first.model.parameters(), second.model.parameters()):
        assert torch.equal(p, q)


# ---------------------------------------------------------------- the CLI


def test_run_local_device_cuda_without_a_gpu_is_a_one_line_error(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from rlscale.base.errors import UserError
    from rlscale.cli import app

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    recipe_file = tmp_path / "r.yaml"
    recipe_file.write_text("steps: 1\n")
    result = CliRunner().invoke(app, ["run", str(recipe_file), "--local", "--device", "cuda"])
    assert isinstance(result.exception, UserError) and "--device" in str(result.exception)
    result = CliRunner().invoke(app, ["run", str(recipe_file), "--local", "--device", "tpu"])
    assert isinstance(result.exception, UserError) and "expected cpu or cuda" in str(result.exception)


def test_chunked_lm_head_keeps_no_whole_batch_logits_for_backward(base, batch):
    # what autograd holds between forward and backward: with one chunk, the [B, L, V] log-softmax; with chunks,
    # only hidden-state slices (each chunk's logits are recomputed in backward)
    vocab = base.lm_head.weight.shape[0]

    def saved_logits(chunk_elements):
        sizes = []
        keep = lambda t: sizes.append(t.numel() if t.dim() == 3 and t.shape[-1] == vocab else 0) or t
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            token_logprobs(
                copy.deepcopy(base),
                batch.input_ids,
                batch.attention_mask,
                temperature=1.0,
                fp32_head=True,
                with_entropy=True,
                chunk_elements=chunk_elements,
            )
        return sum(sizes)

    rows, length = batch.input_ids.shape
    logits = rows * (length - 1) * vocab
    assert saved_logits(10**12) >= logits
    assert saved_logits(logits // 4) == 0
