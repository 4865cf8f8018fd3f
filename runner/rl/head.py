"""The LM head as per-token log-probs and entropy: chunked over tokens, with its own backward (plain torch, so CPUs
and GPUs run the same code); tests/test_head.py checks it against autograd's log_softmax."""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import NamedTuple

import torch

PRECISIONS = ("fp32", "tf32", "bf16")  # the recipe's head_precision (planner/recipe.py)
BF16_LOGITS = "bf16-logits"
SPLIT_TF32 = "3xtf32"  # fp32 on CUDA tensor cores: hi x hi + hi x lo + lo x hi in TF32, float32-accurate
SPLIT_MIN_ROWS = 256  # fewer rows than this: plain SGEMM (the matmul reads the weight once, splitting costs more)
KEEP_FRACTION = 0.25  # the log-probs are kept for backward when they take at most this share of the room left


def resolve_precision(fp32_head: bool, precision: str, compute_dtype: torch.dtype) -> str:
    """The head's matmul precision: the recipe's `precision` for an FP32 head, else the model's compute dtype."""
    if fp32_head:
        if precision not in PRECISIONS:
            raise ValueError(f"unknown head precision {precision!r}; expected one of {', '.join(PRECISIONS)}")
        return precision
    return BF16_LOGITS if compute_dtype == torch.bfloat16 else "fp32"


def compute_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype the model computes in on `weight`'s device: autocast's when it is on, else the weight's own."""
    device = weight.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype


def head_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, precision: str) -> torch.Tensor:
    """Logits x @ weight.T (+ bias) [.., V] in float32 at `precision`, for hidden states x [.., H]: the one head
    matmul of the trainer, the torch sampler and the vLLM generator (runner/builtin/generator.py)."""
    if x.dtype == weight.dtype == torch.bfloat16 and precision in ("fp32", "tf32"):
        precision = "bf16"  # bf16 operands are exact in fp32 and TF32: the bf16 kernel gives the same products
    flat = x.reshape(-1, x.shape[-1])
    precision = _kernel(precision, flat, weight)
    with torch.autocast(x.device.type, enabled=False):
        logits = _matmul(_operand(flat, precision), _operand(weight, precision).t(), precision)
        if bias is not None:
            logits = logits + bias.float()
    return logits.view(*x.shape[:-1], -1)


def head_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    *,
    temperature: float,
    precision: str,
    chunk_tokens: int,
    keep_logprobs: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log pi(targets) [N], entropy [N]) in float32 nats at `temperature`, hidden [N, H] through weight [V, H];
    `keep_logprobs` keeps [N, V] log-probs for backward (None: if a gradient is wanted and `room_for` them)."""
    wants_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (hidden, weight, bias))
    if keep_logprobs is None:
        keep_logprobs = wants_grad and room_for(hidden.shape[0] * weight.shape[0] * 4, hidden.device)
    chunk = max(1, int(chunk_tokens))
    precision = _kernel(precision, hidden, weight)
    if precision == SPLIT_TF32:
        chunk = max(1, chunk // 2)  # each chunk's operands split in two: the head's memory stays where it was
    return _HeadLogprobs.apply(hidden, weight, bias, targets, float(temperature), precision, chunk, keep_logprobs)


def _kernel(precision: str, rows: torch.Tensor, weight: torch.Tensor) -> str:
    """fp32 on a CUDA device with TF32 tensor cores runs as split TF32 when `rows` [M, H] are enough to make the
    matmul compute-bound and the two float32 parts of `weight` [V, H] have `room_for` them; else SGEMM."""
    if precision != "fp32" or not rows.is_cuda or rows.shape[0] < SPLIT_MIN_ROWS or not _has_tf32(weight.device):
        return precision
    return SPLIT_TF32 if room_for(2 * weight.numel() * 4, weight.device) else precision


def _has_tf32(device: torch.device) -> bool:
    # NVIDIA from Ampere (8.0) on; an older GPU or ROCm ignores the TF32 switch and would run three float32 matmuls
    return torch.version.hip is None and torch.cuda.get_device_capability(device) >= (8, 0)


def room_for(nbytes: int, device: torch.device) -> bool:
    """Whether `nbytes` more fit in KEEP_FRACTION of what torch can still allocate on `device`: a CUDA device's
    free memory plus its cache's unused part; never on a CPU, where the host's memory is the scarcer thing."""
    if device.type != "cuda":
        return False
    free, _ = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return nbytes <= KEEP_FRACTION * (free + cached)


class _HeadLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, precision, chunk_tokens, keep_logprobs):
        ctx.set_materialize_grads(False)  # an unused entropy brings None, not a zero tensor to multiply
        tokens = hidden.shape[0]
        logp = torch.empty(tokens, dtype=torch.float32, device=hidden.device)
        entropy, lse = torch.empty_like(logp), torch.empty_like(logp)
        kept = hidden.new_empty((tokens, weight.shape[0]), dtype=torch.float32) if keep_logprobs else None
        with torch.autocast(hidden.device.type, enabled=False):
            w = _operand(weight, precision).t()
            for start in range(0, tokens, chunk_tokens):
                part = slice(start, start + chunk_tokens)
                z = _logits(hidden[part], w, bias, temperature, precision)
                top = z.amax(dim=-1)
                z.sub_(top[:, None])  # z - max: exp cannot overflow
                e = z.exp()
                total = e.sum(dim=-1)
                log_sum = total.log()
                # log p = z - max - log sum; H = -sum p log p = log sum - sum(e (z - max)) / sum(e)
                logp[part] = z.gather(1, targets[part, None]).squeeze(1) - log_sum
                entropy[part] = log_sum - e.mul_(z).sum(dim=-1) / total
                lse[part] = top + log_sum
                if kept is not None:
                    torch.sub(z, log_sum[:, None], out=kept[part])  # log p
        ctx.save_for_backward(hidden, weight, bias, targets, lse, entropy, kept)
        ctx.temperature, ctx.precision, ctx.chunk_tokens = temperature, precision, chunk_tokens
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        # a kept log-prob tensor is overwritten in place below: a second backward finds it changed and refuses
        hidden, weight, bias, targets, lse, entropy, kept = ctx.saved_tensors
        # the forward's kernel: recomputed logits must be the ones its log-sum-exp came from (the head's backward runs
        # right after the loss, with the memory the forward had room in)
        precision, temperature = ctx.precision, ctx.temperature
        want_hidden, want_weight, want_bias = ctx.needs_input_grad[:3]
        if grad_logp is None and grad_entropy is None:
            return (None,) * 8
        # d / d(logits / T): the 1/T of the chain rule folded into the per-token gradients
        g_logp = (grad_logp if grad_logp is not None else torch.zeros_like(lse)).float() / temperature
        g_entropy = None if grad_entropy is None else grad_entropy.float() / temperature
        grad_hidden = torch.empty(hidden.shape, dtype=torch.float32, device=hidden.device) if want_hidden else None
        grad_weight = grad_bias = None
        with torch.autocast(hidden.device.type, enabled=False):
            w_op = _operand(weight, precision)
            for start in range(0, hidden.shape[0], ctx.chunk_tokens):
                part = slice(start, start + ctx.chunk_tokens)
                g, rows = g_logp[part, None], targets[part]
                h_op = _operand(hidden[part], precision)
                if kept is not None:
                    z = kept[part]  # log p
                else:
                    z = _logits(h_op, w_op.t(), bias, temperature, precision).sub_(lse[part, None])
                if g_entropy is None:
                    # dz = g (onehot - p), g one number a token: it scales the [n, H] side of each matmul instead
                    p = z.exp_()
                    p_op = _operand(p, precision)
                    if want_hidden:  # g (W[target] - p W)
                        grad_hidden[part] = (w_op.index_select(0, rows).float() - _matmul(p_op, w_op, precision)) * g
                    if want_weight:  # sum over tokens of g (onehot - p) h
                        gh = h_op.float() * g
                        grad_weight = _accumulate(grad_weight, p_op.t(), _operand(-gh, precision), precision)
                        grad_weight.index_add_(0, rows, gh)
                    if want_bias:
                        grad_bias = _add(grad_bias, p.t().mv(g[:, 0]).neg_().index_add_(0, rows, g[:, 0]))
                    continue
                # dz = g (onehot - p) - g_H p (log p + H)
                p = z.exp()
                dz = z.add_(entropy[part, None]).mul_(g_entropy[part, None]).add_(g).mul_(p).neg_()
                dz.scatter_add_(1, rows[:, None], g)
                dz_op = _operand(dz, precision)
                if want_hidden:
                    grad_hidden[part] = _matmul(dz_op, w_op, precision)
                if want_weight:
                    grad_weight = _accumulate(grad_weight, dz_op.t(), h_op, precision)
                if want_bias:
                    grad_bias = _add(grad_bias, dz.sum(dim=0))
        return (
            None if grad_hidden is None else grad_hidden.to(hidden.dtype),
            None if grad_weight is None else grad_weight.to(weight.dtype),
            None if grad_bias is None else grad_bias.to(bias.dtype),
            None,
            None,
            None,
            None,
            None,
        )


def _logits(hidden, w_t, bias, temperature, precision) -> torch.Tensor:
    z = _matmul(_operand(hidden, precision), w_t, precision)
    if bias is not None:
        z += bias.float()
    if temperature != 1.0:
        z.div_(temperature)
    return z


class _Split(NamedTuple):
    """A float32 tensor as hi + lo, exactly: hi rounded to TF32's 10 mantissa bits, lo the rest (itself rounded to
    TF32 by the matmul, an error of 2^-22 of the value). Three TF32 products carry float32's accuracy."""

    hi: torch.Tensor
    lo: torch.Tensor

    def t(self) -> _Split:
        return _Split(self.hi.t(), self.lo.t())

    def index_select(self, dim: int, index: torch.Tensor) -> _Split:
        return _Split(self.hi.index_select(dim, index), self.lo.index_select(dim, index))

    def float(self) -> torch.Tensor:
        return self.hi + self.lo


def split_tf32(t: torch.Tensor) -> _Split:
    """`t` as hi + lo, hi its float32 value rounded to nearest at 10 mantissa bits (finite values)."""
    if isinstance(t, _Split):
        return t
    t = t.float().contiguous()
    hi = (t.view(torch.int32) + 0x1000).bitwise_and_(-0x2000).view(torch.float32)
    return _Split(hi, t - hi)


def _operand(t: torch.Tensor, precision: str) -> torch.Tensor:
    # a CPU has no bf16 x bf16 -> fp32 matmul: it gets the bf16 values as their exact float32 values
    if precision == SPLIT_TF32:
        return split_tf32(t)
    if precision == BF16_LOGITS or (precision == "bf16" and t.is_cuda):
        return t.to(torch.bfloat16)
    if precision == "bf16":
        return t.to(torch.bfloat16).float()
    return t.float()


def _matmul(a: torch.Tensor, b: torch.Tensor, precision: str) -> torch.Tensor:
    if precision == SPLIT_TF32:
        return _split_addmm(None, a, b)
    if precision == BF16_LOGITS:
        return torch.mm(a, b).float()
    if a.dtype == torch.bfloat16:  # bf16 on CUDA: tensor cores, float32 accumulation and output
        return torch.mm(a, b, out_dtype=torch.float32)
    with _tf32(a.is_cuda, precision == "tf32"):
        return torch.mm(a, b)


def _accumulate(total: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor, precision: str) -> torch.Tensor:
    if precision == SPLIT_TF32:
        return _split_addmm(total, a, b)
    if total is None or a.dtype == torch.bfloat16:
        return _add(total, _matmul(a, b, precision))
    with _tf32(a.is_cuda, precision == "tf32"):
        return total.addmm_(a, b)


def _split_addmm(total: torch.Tensor | None, a, b) -> torch.Tensor:
    # the small products first, so that the largest lands on an accumulator already holding the corrections
    a, b = split_tf32(a), split_tf32(b)
    with _tf32(a.hi.is_cuda, True):
        total = torch.mm(a.lo, b.hi) if total is None else total.addmm_(a.lo, b.hi)
        return total.addmm_(a.hi, b.lo).addmm_(a.hi, b.hi)


def _add(total: torch.Tensor | None, term: torch.Tensor) -> torch.Tensor:
    return term if total is None else total.add_(term)


def _tf32(cuda: bool, allowed: bool):
    return _cuda_tf32(allowed) if cuda else nullcontext()


@contextmanager
def _cuda_tf32(allowed: bool):
    # the legacy flag: every torch has it, and from 2.9 its setter keeps the new fp32_precision API in step
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_tf32
    matmul.allow_tf32 = allowed
    try:
        yield
    finally:
        matmul.allow_tf32 = before
