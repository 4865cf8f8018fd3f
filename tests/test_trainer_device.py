"""The trainer without a GPU: device-correct tensor creation, micro-batching that leaves the loss unchanged,
activation checkpointing, and a checkpoint that resumes the next step exactly (the LM head's chunking, equality
and memory: tests/test_head.py)."""

import pytest
import torch
from rlscale.planner.recipe import Recipe
from rlscale.runner.rl.sampling import sample
from rlscale.runner.rl.train_step import micro_batches, train_step
from trainer_batch import base, batch, sgd_recipe, sgd_step, tokenizer  # noqa: F401  (module fixtures)

torch.set_num_threads(1)

LOSSES = ("cispo", "gspo", "dapo", "grpo")
AGGREGATIONS = ("prompt", "token", "sample")
WHOLE = 10**9  # a micro-batch budget no batch reaches: one forward pass


_recipe, _step = sgd_recipe, sgd_step


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
