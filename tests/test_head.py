"""The fused LM head (runner/rl/head.py): log-probs, entropy and gradients equal autograd's log_softmax in float32,
whatever the chunking, inside every loss and aggregation of a train step; its matmul precisions; the recipe key."""

import copy
import types

import pytest
import torch
import torch.nn.functional as F
from rlscale.planner.recipe import Recipe
from rlscale.runner.rl import head as head_module
from rlscale.runner.rl import train_step as train_step_module
from rlscale.runner.rl.head import SPLIT_TF32, head_logprobs, head_matmul, split_tf32
from rlscale.runner.rl.policy import build_model, build_tokenizer
from rlscale.runner.rl.train_step import token_logprobs
from trainer_batch import perturbed_batch, sgd_recipe, sgd_step

torch.set_num_threads(1)

LOSSES = ("cispo", "gspo", "dapo", "grpo")
AGGREGATIONS = ("prompt", "token", "sample")
TOKENS, WIDTH, VOCAB = 13, 16, 50


@pytest.fixture(scope="module")
def policy():
    """(the tiny policy freshly built, its CPU train batch: tests/trainer_batch.py)."""
    tokenizer = build_tokenizer()
    base = build_model(tokenizer, seed=0).eval()
    return base, perturbed_batch(tokenizer, base)


def reference_head(hidden, weight, bias, targets, *, temperature):
    """Autograd's own: log_softmax of the full logits, the target's entry gathered, entropy from the same."""
    logprobs = torch.log_softmax(F.linear(hidden, weight, bias) / temperature, dim=-1)
    return logprobs.gather(-1, targets[:, None]).squeeze(-1), -(logprobs.exp() * logprobs).sum(dim=-1)


def _leaves(seed=0, bias=True):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(TOKENS, WIDTH, generator=generator).requires_grad_()
    weight = torch.randn(VOCAB, WIDTH, generator=generator).requires_grad_()
    bias = torch.randn(VOCAB, generator=generator).requires_grad_() if bias else None
    targets = torch.randint(0, VOCAB, (TOKENS,), generator=generator)
    return hidden, weight, bias, targets


def _run(head, leaves, upstream, **kwargs):
    hidden, weight, bias, targets = (
        t.detach().clone().requires_grad_(t.requires_grad) if t is not None else None for t in leaves
    )
    logp, entropy = head(hidden, weight, bias, targets, **kwargs)
    g_logp, g_entropy = upstream
    total = (logp * g_logp).sum() + ((entropy * g_entropy).sum() if g_entropy is not None else 0.0)
    total.backward()
    grads = [hidden.grad, weight.grad] + ([bias.grad] if bias is not None else [])
    return [logp.detach(), entropy.detach(), *grads]


@pytest.mark.parametrize("chunk_tokens", [1, 4, 10**6])  # one token a chunk, uneven chunks, one chunk
@pytest.mark.parametrize("entropy_grad", [False, True])
@pytest.mark.parametrize("keep_logprobs", [False, True])  # recomputed in backward, or kept from forward (GPUs)
@pytest.mark.parametrize("split", [False, True])  # CUDA's fp32 kernel, its three products in float32 on a CPU
def test_fused_head_equals_autograd_log_softmax_in_float32(
    monkeypatch, chunk_tokens, entropy_grad, keep_logprobs, split
):
    if split:
        monkeypatch.setattr(head_module, "_kernel", lambda *args: SPLIT_TF32)
    leaves = _leaves()
    generator = torch.Generator().manual_seed(1)
    upstream = (
        torch.randn(TOKENS, generator=generator),
        torch.randn(TOKENS, generator=generator) if entropy_grad else None,
    )
    want = _run(reference_head, leaves, upstream, temperature=0.7)
    options = dict(precision="fp32", chunk_tokens=chunk_tokens, keep_logprobs=keep_logprobs)
    got = _run(head_logprobs, leaves, upstream, temperature=0.7, **options)
    for name, g, w in zip(("logp", "entropy", "d hidden", "d weight", "d bias"), got, want):
        assert (g - w).abs().max().item() < 1e-5, name
    assert got[3].abs().max() > 1e-2  # the weight gradient is not trivially zero


def test_split_tf32_is_exact_and_its_high_part_fits_tf32():
    t = torch.randn(1000, generator=torch.Generator().manual_seed(3)) * torch.logspace(-30, 30, 1000)
    hi, lo = split_tf32(t)
    assert torch.equal(hi + lo, t)  # exact: lo is the float32 rest
    assert not (hi.view(torch.int32) & 0x1FFF).any()  # 10 mantissa bits, what a TF32 tensor core reads
    assert ((lo / t).abs() <= 2.0**-11).all()  # rounded to nearest: half a TF32 unit at most


@pytest.mark.parametrize(
    ("precision", "cuda", "rows", "room", "kernel"),
    [
        ("fp32", True, 256, True, SPLIT_TF32),
        ("fp32", True, 256, False, "fp32"),  # a device short of memory keeps SGEMM: no weight copies
        ("fp32", True, 255, True, "fp32"),  # too few rows: reading the weight bounds it, splitting costs more
        ("fp32", False, 4096, True, "fp32"),  # a CPU has no TF32
        ("fp32", "pre-Ampere", 4096, True, "fp32"),  # a GPU without TF32 tensor cores
        ("tf32", True, 4096, True, "tf32"),
    ],
)
def test_fp32_runs_as_split_tf32_on_cuda_for_enough_rows_where_the_weights_parts_fit(
    monkeypatch, precision, cuda, rows, room, kernel
):
    weight = torch.zeros(VOCAB, WIDTH)
    asked = []
    monkeypatch.setattr(head_module, "room_for", lambda nbytes, device: asked.append(nbytes) or room)
    monkeypatch.setattr(head_module, "_has_tf32", lambda device: cuda is True)
    hidden = types.SimpleNamespace(is_cuda=bool(cuda), shape=(rows, WIDTH))  # the device and shape alone are read
    assert head_module._kernel(precision, hidden, weight) == kernel
    assert asked in ([], [2 * VOCAB * WIDTH * 4])  # room for the hi and lo float32 copies of the weight


def test_split_tf32_logits_equal_float32_logits(monkeypatch):
    monkeypatch.setattr(head_module, "_kernel", lambda *args: SPLIT_TF32)
    leaves = _leaves()
    logits = head_matmul(leaves[0].detach(), leaves[1].detach(), leaves[2].detach(), "fp32")
    assert (logits - torch.nn.functional.linear(*(t.detach() for t in leaves[:3]))).abs().max().item() < 1e-5


def test_an_unused_entropy_costs_no_entropy_backward_and_gives_the_log_prob_gradient_alone():
    leaves = _leaves(bias=False)
    upstream = (torch.ones(TOKENS), None)
    want = _run(reference_head, leaves, upstream, temperature=1.0)
    got = _run(head_logprobs, leaves, upstream, temperature=1.0, precision="fp32", chunk_tokens=5)
    assert all((g - w).abs().max().item() < 1e-5 for g, w in zip(got, want))


def test_kept_log_probs_are_the_one_vocabulary_wide_tensor_saved_and_serve_one_backward():
    hidden, weight, bias, targets = _leaves()
    saved = []

    def keep(tensor):
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        logp, _ = head_logprobs(
            hidden, weight, bias, targets, temperature=1.0, precision="fp32", chunk_tokens=5, keep_logprobs=True
        )
    assert [tuple(t.shape) for t in saved if VOCAB in t.shape] == [(VOCAB, WIDTH), (VOCAB,), (TOKENS, VOCAB)]
    logp, _ = head_logprobs(  # the hooks above hand tensors back unchecked: a second graph without them
        hidden, weight, bias, targets, temperature=1.0, precision="fp32", chunk_tokens=5, keep_logprobs=True
    )
    logp.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="inplace"):  # the kept log-probs were spent by the first backward
        logp.sum().backward()


def _reference_head_logprobs(hidden, weight, bias, targets, *, temperature, precision, chunk_tokens):
    assert precision == "fp32"
    return reference_head(hidden, weight, bias, targets, temperature=temperature)


def _assert_same_step(got, want):
    (m1, g1, _), (m2, g2, _) = got, want
    for key in ("loss", "entropy", "kl", "clip_fraction", "ratio_mean", "grad_norm"):
        assert m1[key] == pytest.approx(m2[key], abs=1e-5), key
    assert (g1 - g2).abs().max().item() < 1e-5
    assert g1.abs().max().item() > 1e-3


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("loss_agg", AGGREGATIONS)
def test_a_train_step_through_the_fused_head_equals_one_through_autograd(policy, monkeypatch, loss, loss_agg):
    base, batch = policy
    recipe = sgd_recipe(loss=loss, loss_agg=loss_agg, micro_batch_tokens=40)
    fused = sgd_step(base, batch, recipe)
    monkeypatch.setattr(train_step_module, "head_logprobs", _reference_head_logprobs)
    _assert_same_step(fused, sgd_step(base, batch, recipe))


def test_entropy_bonus_kl_and_recomputed_log_probs_through_the_fused_head_equal_autograd(policy, monkeypatch):
    base, batch = policy
    recipe = sgd_recipe(kl_coef=0.1, entropy_coef=0.05, recompute_logprobs=True, temperature=0.7, micro_batch_tokens=40)
    fused = sgd_step(base, batch, recipe, ref=True)
    monkeypatch.setattr(train_step_module, "head_logprobs", _reference_head_logprobs)
    _assert_same_step(fused, sgd_step(base, batch, recipe, ref=True))


def _policy_head(base, batch, **options):
    """token_logprobs of `batch` (entropy with its gradient) and the LM head's and embedding's gradients of the
    response tokens' log-probs and entropies."""
    model = copy.deepcopy(base)
    logp, entropy = token_logprobs(
        model, batch.input_ids, batch.attention_mask, fp32_head=True, with_entropy=True, entropy_grad=True, **options
    )
    ((logp + entropy) * batch.response_mask).sum().backward()
    return logp, entropy, model.lm_head.weight.grad, model.model.embed_tokens.weight.grad


def test_a_chunked_head_gives_the_same_logprobs_entropy_and_gradients(policy):
    base, batch = policy
    whole = _policy_head(base, batch, temperature=0.7, chunk_elements=10**12)
    vocab = base.lm_head.weight.shape[0]
    for chunk_elements in (vocab, 7 * vocab):  # one token a chunk; uneven chunks
        chunked = _policy_head(base, batch, temperature=0.7, chunk_elements=chunk_elements)
        assert all(torch.allclose(got, want, atol=1e-5) for got, want in zip(chunked, whole))


def test_log_probs_where_asked_equal_the_full_pass_there_and_are_zero_elsewhere(policy):
    base, batch = policy
    mask = batch.response_mask
    full = _policy_head(base, batch, temperature=1.0)
    response = _policy_head(base, batch, temperature=1.0, where=mask)
    outside = (mask == 0) & (torch.arange(mask.shape[1]) > 0)
    assert outside.any() and (full[0][outside] != 0).all()  # the full pass has log-probs there
    for got, want in zip(response[:2], full[:2]):
        assert torch.allclose(got * mask, want * mask, atol=1e-6) and (got[mask == 0] == 0).all()
    for got, want in zip(response[2:], full[2:]):  # the same terms' gradients
        assert torch.allclose(got, want, atol=1e-6)


def test_the_head_keeps_no_vocabulary_wide_tensor_for_backward_but_its_weight(policy):
    base, batch = policy
    vocab = base.lm_head.weight.shape[0]
    model = copy.deepcopy(base)
    saved = []

    def keep(tensor):
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        token_logprobs(model, batch.input_ids, batch.attention_mask, temperature=1.0, fp32_head=True, with_entropy=True)
    wide = [t for t in saved if vocab in t.shape]  # logits, probabilities or their gradients would be [.., V]
    assert wide and all(t.data_ptr() == model.lm_head.weight.data_ptr() for t in wide)


# ---------------------------------------------------------------- matmul precision


def test_bf16_head_rounds_the_operands_and_sums_in_float32():
    hidden, weight, bias, _ = _leaves()
    got = head_matmul(hidden.detach(), weight.detach(), bias.detach(), "bf16")
    rounded = hidden.detach().bfloat16().double() @ weight.detach().bfloat16().double().T + bias.detach().double()
    assert got.dtype == torch.float32 and (got.double() - rounded).abs().max().item() < 1e-5
    fp32 = head_matmul(hidden.detach(), weight.detach(), bias.detach(), "fp32")
    assert (got - fp32).abs().max().item() > 1e-3  # the rounding is real
    bf16_logits = head_matmul(hidden.detach(), weight.detach(), bias.detach(), "bf16-logits")
    assert (bf16_logits - fp32).abs().max() > (got - fp32).abs().max()  # rounding the logits costs more


def test_tf32_on_a_cpu_is_fp32():
    hidden, weight, bias, targets = _leaves()
    kwargs = dict(temperature=1.0, chunk_tokens=4)
    tf32 = head_logprobs(hidden, weight, bias, targets, precision="tf32", **kwargs)
    fp32 = head_logprobs(hidden, weight, bias, targets, precision="fp32", **kwargs)
    assert all(torch.equal(a, b) for a, b in zip(tf32, fp32))


def test_a_bf16_head_gradient_is_the_rounded_operands_gradient():
    leaves = _leaves()
    upstream = (torch.ones(TOKENS), torch.ones(TOKENS))
    got = _run(head_logprobs, leaves, upstream, temperature=1.0, precision="bf16", chunk_tokens=4)
    fp32 = _run(head_logprobs, leaves, upstream, temperature=1.0, precision="fp32", chunk_tokens=4)
    assert (got[0] - fp32[0]).abs().max() > 1e-4  # log-probs moved by the rounding
    for g, w in zip(got[2:], fp32[2:]):  # gradients near fp32's: the same softmax, rounded operands
        assert torch.allclose(g, w, rtol=0.05, atol=0.05)


def test_the_trainer_honours_the_recipe_head_precision(policy):
    base, batch = policy
    fp32 = sgd_step(base, batch, sgd_recipe(micro_batch_tokens=40))
    bf16 = sgd_step(base, batch, sgd_recipe(micro_batch_tokens=40, head_precision="bf16"))
    assert bf16[0]["loss"] != fp32[0]["loss"] and bf16[0]["loss"] == pytest.approx(fp32[0]["loss"], abs=0.01)


# ---------------------------------------------------------------- the recipe key


def test_head_precision_belongs_to_the_fp32_head_and_exports_say_they_cannot_express_it():
    from pydantic import ValidationError
    from rlscale.planner.frameworks.openrlhf import openrlhf_mapping
    from rlscale.planner.frameworks.trl import trl_mapping
    from rlscale.planner.frameworks.verl import verl_mapping

    with pytest.raises(ValidationError, match="fp32_head"):
        Recipe(fp32_head=False, head_precision="bf16")
    assert Recipe(fp32_head=False).head_precision == "fp32"
    for mapping in (verl_mapping, trl_mapping, openrlhf_mapping):
        assert any(item.startswith("head_precision: tf32") for item in mapping(Recipe(head_precision="tf32")).missing)
        assert not any(item.startswith("head_precision") for item in mapping(Recipe()).missing)


# ---------------------------------------------------------------- the vLLM generator

GENERATOR_SCORE = (
    "import json, sys; from rlscale.runner.builtin.generator import Generator; "
    "engine = Generator(sys.argv[1], in_process=True, dtype='float32', head_precision=sys.argv[2]); "
    "print(json.dumps(engine.score(json.loads(sys.argv[3]), json.loads(sys.argv[4]))))"
)


@pytest.mark.slow
def test_the_vllm_generator_runs_its_head_at_the_recipe_precision():
    # in a child process: an in-process vLLM engine changes torch's thread count and vLLM's environment
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("vllm")
    from rlscale.runner.rl.policy import base_model_dir, load_policy

    model_dir = base_model_dir()
    model, tokenizer = load_policy(model_dir)
    prompt = tokenizer("12+34=")["input_ids"]
    completion = tokenizer("46", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    ids = torch.tensor([prompt + completion])
    trainer = {
        precision: token_logprobs(
            model, ids, torch.ones_like(ids), temperature=1.0, fp32_head=True, head_precision=precision
        )[0][0, len(prompt) :]
        for precision in ("fp32", "bf16")
    }
    child = subprocess.run(
        [sys.executable, "-c", GENERATOR_SCORE, str(model_dir), "bf16", json.dumps(prompt), json.dumps(completion)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    assert child.returncode == 0, child.stderr[-2000:]
    generator = torch.tensor(json.loads(child.stdout.strip().splitlines()[-1]))
    assert (generator - trainer["bf16"]).abs().max().item() < 1e-5  # the trainer's bf16 head, in vLLM
    assert (generator - trainer["fp32"]).abs().max().item() > 1e-4  # not vLLM's own float32 head
