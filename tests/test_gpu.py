"""The trainer on a CUDA GPU (`pytest -m gpu tests/test_gpu.py`): CUDA steps equal CPU steps for every loss x
aggregation, bf16 autocast keeps float32 master weights, a checkpoint resumes the next step on CUDA, the local loop
runs on CUDA, a 1.5B-parameter Llama trains on B_p x n = 256 rollouts of 1,024 tokens within 80 GB, and the fused
LM head (runner/rl/head.py) computes at each head_precision what its CPU path computes.

Skipped, with the reason, where torch sees no GPU (CI has none: the only skip it accepts).
"""

import copy
import importlib.util
import io
import math
from pathlib import Path

import pytest
import torch
from rlscale.planner.recipe import Recipe
from rlscale.runner.rl import head as head_module
from rlscale.runner.rl.head import head_logprobs
from rlscale.runner.rl.train_step import make_optimizer, train_step
from trainer_batch import base, batch, tokenizer  # noqa: F401  (module fixtures)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: torch.cuda.is_available() is false"),
]

LOSSES = ("cispo", "gspo", "dapo", "grpo")
AGGREGATIONS = ("prompt", "token", "sample")
CUDA, CPU = torch.device("cuda"), torch.device("cpu")
ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("gpu_trainer", ROOT / "bench" / "gpu_trainer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _recipe(**changes):
    # float32 on both devices; plain SGD at lr 1 makes the weight change equal the accumulated gradient
    return Recipe(
        prompts_per_batch=4,
        rollouts=4,
        lr=1.0,
        lr_scaling="none",
        lr_warmup_steps=0,
        grad_clip=1e9,
        gpu_dtype="float32",
        **({"micro_batch_tokens": 40} | changes),
    )


def _step(base, batch, recipe, device, ref=False):
    model = copy.deepcopy(base).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=recipe.lr)
    reference = copy.deepcopy(base).to(device) if ref else None
    metrics = train_step(model, optimizer, batch.to(device), recipe, ref_model=reference)
    weights = torch.cat([p.detach().flatten().cpu() for p in model.parameters()])
    return metrics, weights


def _assert_same_step(cuda, cpu, tol=1e-5):
    (m1, w1), (m2, w2) = cuda, cpu
    for key in ("loss", "entropy", "kl", "clip_fraction", "ratio_mean", "grad_norm", "kept_prompts", "updates"):
        assert m1[key] == pytest.approx(m2[key], abs=tol), key
    assert (w1 - w2).abs().max().item() < tol


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("loss_agg", AGGREGATIONS)
def test_cuda_step_equals_cpu_step(base, batch, loss, loss_agg):
    recipe = _recipe(loss=loss, loss_agg=loss_agg)
    _assert_same_step(_step(base, batch, recipe, CUDA), _step(base, batch, recipe, CPU))


def test_cuda_step_with_kl_entropy_minibatches_and_recomputed_logprobs_equals_cpu(base, batch):
    recipe = _recipe(
        kl_coef=0.1,
        entropy_coef=0.01,
        recompute_logprobs=True,
        zero_variance_filter=False,
        ppo_minibatches=2,
        **{"async": "ppo_off_policy"},
    )
    _assert_same_step(_step(base, batch, recipe, CUDA, ref=True), _step(base, batch, recipe, CPU, ref=True))


def test_bf16_autocast_keeps_float32_weights_adam_state_and_head(base, batch):
    recipe = Recipe(prompts_per_batch=4, rollouts=4, lr_warmup_steps=0)  # gpu_dtype bfloat16 by default
    model = copy.deepcopy(base).to(CUDA)
    optimizer = make_optimizer(model, recipe)
    metrics = train_step(model, optimizer, batch.to(CUDA), recipe)
    reference = copy.deepcopy(base).to(CUDA)
    fp32 = train_step(
        reference, make_optimizer(reference, recipe), batch.to(CUDA), recipe.model_copy(update={"gpu_dtype": "float32"})
    )
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(s["exp_avg"].dtype == torch.float32 for s in optimizer.state.values())
    assert math.isfinite(metrics["loss"]) and metrics["loss"] == pytest.approx(fp32["loss"], abs=0.05)
    assert metrics["loss"] != fp32["loss"]  # bf16 really ran


def test_checkpoint_resumes_the_next_step_on_cuda(tmp_path, tokenizer, base, batch):
    from rlscale.runner.builtin.trainer import Trainer

    base.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    recipe = Recipe(prompts_per_batch=4, rollouts=4, lr=1e-3, lr_warmup_steps=2, micro_batch_tokens=40)
    on_cuda = batch.to(CUDA)
    first = Trainer(tmp_path, recipe, device="cuda")
    train_step(first.model, first.optimizer, on_cuda, recipe)
    blob = first.state()
    draws = torch.rand(4), torch.rand(4, device=CUDA)
    torch.manual_seed(123)  # both RNGs move on; load_state must bring them back
    second = Trainer(tmp_path, recipe, device="cuda")
    second.load_state(blob)
    assert torch.equal(torch.rand(4), draws[0]) and torch.equal(torch.rand(4, device=CUDA), draws[1])
    want = train_step(first.model, first.optimizer, on_cuda, recipe)
    got = train_step(second.model, second.optimizer, on_cuda, recipe)
    for key in ("loss", "entropy", "grad_norm", "clip_fraction"):
        assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), (
            key
        )  # CUDA's scatter-add backward is not bitwise
    for p, q in zip(first.model.parameters(), second.model.parameters()):
        assert (p - q).abs().max().item() < 1e-5  # Adam divides by sqrt(v): tiny gradient noise grows
    on_cpu = Trainer(tmp_path, recipe, device="cpu")  # a GPU checkpoint resumes on a CPU too
    on_cpu.load_state(blob)
    saved = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=False)["model"]
    assert all(torch.equal(tensor, saved[name]) for name, tensor in on_cpu.model.state_dict().items())
    assert math.isfinite(train_step(on_cpu.model, on_cpu.optimizer, batch, recipe)["loss"])


def test_local_loop_runs_on_cuda(workdir):
    from rlscale.runner.builtin.local import run_local

    recipe = Recipe(prompts_per_batch=8, rollouts=4, steps=2, eval_every=2, eval_prompts=16, eval_samples=2)
    records = run_local(recipe, device="cuda")
    assert [r["step"] for r in records] == [0, 2]
    assert records[-1]["rollouts"] == 2 * 32 and 0.0 <= records[-1]["val_reward"] <= 1.0
    assert math.isfinite(records[-1]["grad_norm"])


def test_a_1p5b_llama_trains_256_rollouts_of_1024_tokens_within_80_gb():
    bench = _bench()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = bench.llama("1.5B", CUDA)
    parameters = sum(p.numel() for p in model.parameters())
    assert 1.4e9 < parameters < 1.7e9
    recipe = Recipe(prompts_per_batch=16, rollouts=16, lr=1e-6, lr_warmup_steps=0)  # defaults: bf16, micro-batches
    batch = bench.synthetic_batch(16, 16, CUDA)
    assert batch.input_ids.shape == (256, 1024)
    before = model.lm_head.weight.detach().clone()
    metrics = train_step(model, make_optimizer(model, recipe), batch, recipe)
    peak = torch.cuda.max_memory_allocated()
    assert peak < 80e9, f"peak {peak / 2**30:.1f} GiB"
    assert math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"]) and metrics["grad_norm"] > 0
    assert not torch.equal(model.lm_head.weight, before)


# ---------------------------------------------------------------- the fused LM head at each precision


def _head_leaves(seed=0, tokens=300, width=256, vocab=5000):
    generator = torch.Generator().manual_seed(seed)
    hidden = 0.25 * torch.randn(tokens, width, generator=generator, dtype=torch.float64)  # logits of std ~4
    weight = torch.randn(vocab, width, generator=generator, dtype=torch.float64)
    bias = torch.randn(vocab, generator=generator, dtype=torch.float64)
    targets = torch.randint(0, vocab, (tokens,), generator=generator)
    upstream = torch.randn(2, tokens, generator=generator, dtype=torch.float64)
    return hidden, weight, bias, targets, upstream


def _head_run(leaves, device, dtype, **options):
    hidden, weight, bias, targets, upstream = leaves
    inputs = [t.detach().to(device, dtype).requires_grad_() for t in (hidden, weight, bias)]
    if options:
        logp, entropy = head_logprobs(*inputs, targets.to(device), temperature=0.7, chunk_tokens=64, **options)
    else:  # autograd's log_softmax, the reference
        logprobs = torch.log_softmax(torch.nn.functional.linear(*inputs) / 0.7, dim=-1)
        logp = logprobs.gather(-1, targets.to(device)[:, None]).squeeze(-1)
        entropy = -(logprobs.exp() * logprobs).sum(dim=-1)
    g_logp, g_entropy = upstream.to(device, logp.dtype)
    ((logp * g_logp).sum() + (entropy * g_entropy).sum()).backward()
    return [t.detach().double().cpu() for t in (logp, entropy, *(x.grad for x in inputs))]


def _largest_error(got, want) -> float:
    """The largest error of log-probs, entropy and gradients, each relative to its largest reference value."""
    return max(((g - w).abs().max() / w.abs().max()).item() for g, w in zip(got, want))


def test_fused_fp32_head_on_cuda_is_float32_accurate_even_with_tf32_allowed(monkeypatch):
    leaves = _head_leaves()  # 300 rows: the split-TF32 kernel (runner/rl/head.py)
    reference = _head_run(leaves, CPU, torch.float64)
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True  # a process that allows TF32 elsewhere
    try:
        fp32 = _head_run(leaves, CUDA, torch.float32, precision="fp32")
        tf32 = _head_run(leaves, CUDA, torch.float32, precision="tf32")
        assert torch.backends.cuda.matmul.allow_tf32  # the head restored the process's setting
        monkeypatch.setattr(head_module, "SPLIT_MIN_ROWS", 10**9)  # plain SGEMM, IEEE float32 throughout
        sgemm = _head_run(leaves, CUDA, torch.float32, precision="fp32")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    assert _largest_error(fp32, reference) < 1e-5
    assert _largest_error(fp32, reference) < max(4 * _largest_error(sgemm, reference), 1e-6)
    assert _largest_error(tf32, reference) > 10 * _largest_error(fp32, reference)  # TF32 really ran


def test_fused_tf32_and_bf16_heads_on_cuda_round_as_documented():
    leaves = _head_leaves()
    reference = _head_run(leaves, CPU, torch.float64)
    tf32 = _head_run(leaves, CUDA, torch.float32, precision="tf32")
    bf16 = _head_run(leaves, CUDA, torch.float32, precision="bf16")
    assert 0 < _largest_error(tf32, reference) < _largest_error(bf16, reference) < 0.05
    # CUDA's bf16 x bf16 -> fp32 kernels (torch.mm out_dtype) compute what the CPU's rounded float32 operands do
    assert _largest_error(bf16, _head_run(leaves, CPU, torch.float32, precision="bf16")) < 1e-3


@pytest.mark.parametrize("head_precision", ["tf32", "bf16"])
def test_cuda_step_at_a_head_precision_equals_cpu_step_within_its_rounding(base, batch, head_precision):
    recipe = _recipe(head_precision=head_precision)
    cuda, cpu = _step(base, batch, recipe, CUDA), _step(base, batch, recipe, CPU)
    fp32 = _step(base, batch, _recipe(), CUDA)
    assert cuda[0]["loss"] == pytest.approx(fp32[0]["loss"], abs=0.01) and math.isfinite(cuda[0]["grad_norm"])
    if head_precision == "bf16":  # the same rounding on both devices (a CPU has no TF32)
        _assert_same_step(cuda, cpu, tol=1e-3)
