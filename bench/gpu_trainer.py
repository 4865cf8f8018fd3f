"""Benchmark: rlscale's train_step against a plain PyTorch policy-gradient loop, side by side in one process.

Question (issue 47): per model size and LM-head precision, how fast does the built-in trainer train, as a ratio of a
plain loop on the same model, batch, micro-batch rows and head precision, and at what MFU and peak memory?

Models are Llama configs of the Qwen2.5-0.5B/1.5B/3B shapes (tied embeddings, 151,936 vocabulary), randomly
initialised on the device (nothing is downloaded). Batches are synthetic: B_p x n rollouts of prompt + response
random tokens, rewards that vary within every group. Both loops share one model and one AdamW (fused on CUDA), lr
1e-6, and compute in bf16 autocast on CUDA (float32 weights and Adam state), float32 on a CPU:
    rlscale  train_step under the recipe's defaults (CISPO, prompt aggregation, micro_batch_tokens), with
             head_precision set: the fused head over the response tokens (runner/rl/head.py)
    plain    per micro-batch of the same rows: the model body, then log-probs of every position through chunked
             cross-entropy (2^28 logits a chunk, its log-softmax kept for backward), a CISPO-weighted token-mean
             loss over the response, backward; then gradient clipping and the optimizer step. Its head: float32
             (fp32: TF32 off; tf32: TF32 on) or autocast's bf16 (bf16 logits)
fp32 on CUDA: rlscale's head runs float32 as split TF32 (three tensor-core products, runner/rl/head.py) and the plain
loop runs SGEMM; the row `fp32-sgemm` runs rlscale's head on SGEMM too. Each fp32 row also records the head's
log-prob error on the batch's first rows against a float64 head, for each kernel (fp32_logp_error).
Each size builds both once, warms each up one step, then times them in turn for --rounds rounds (the order
alternating); tokens/s (rows x length per second) and the ratio are the medians over rounds (also the ratio of
this process's CPU seconds per step, which a shared CPU host's load moves less than wall time). MFU is
6 x parameters x tokens/s over the device's peak: --peak-tflops, else a large torch.mm measured at the start of
each round (bf16 on CUDA, float32 on a CPU), so that a shared host's load weighs on both; the median over rounds.
Peak memory: torch.cuda.max_memory_allocated on CUDA; the process's resident set sampled every 10 ms on a CPU (both
loops share the model, so both include it). A configuration out of memory is recorded as such.
The 3B rows run with activation checkpointing, the others without (--checkpointing).

    python bench/gpu_trainer.py [--sizes 0.5B,1.5B,3B] [--head-precisions fp32,fp32-sgemm,tf32,bf16] [--rounds 3]
    .venv/bin/python bench/gpu_trainer.py --device cpu   # the CPU proxy: the 0.5B vocabulary and width, 2 layers,
                                                         # 4 x 4 rollouts x 256 tokens, float32
Writes bench/results/gpu_trainer.json (CUDA) or bench/results/gpu_trainer_cpu.json (the CPU proxy).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import statistics
import sys
import threading
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"

# Qwen2.5 shapes as Llama configs (no attention bias): parameter counts 0.49B, 1.54B, 3.09B
SIZES = {
    "0.5B": dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2
    ),
    "1.5B": dict(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2
    ),
    "3B": dict(
        hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2
    ),
}
SIZES["0.5B-2L"] = SIZES["0.5B"] | {"num_hidden_layers": 2}  # the CPU proxy
CHECKPOINTED = {"3B"}  # sizes whose rows run with activation checkpointing by default
VOCAB = 151_936
PROMPT_TOKENS, RESPONSE_TOKENS = 256, 768
# per device: sizes, B_p, n, prompt and response tokens, head precisions, rounds, steps per round
DEFAULTS = {
    "cuda": dict(
        sizes="0.5B,1.5B,3B",
        prompts=16,
        rollouts=16,
        prompt_tokens=PROMPT_TOKENS,
        response_tokens=RESPONSE_TOKENS,
        head_precisions="fp32,tf32,bf16",
        rounds=3,
        steps=2,
    ),
    "cpu": dict(
        sizes="0.5B-2L",
        prompts=4,
        rollouts=4,
        prompt_tokens=64,
        response_tokens=192,
        head_precisions="fp32",
        rounds=3,
        steps=1,
    ),
}


def llama(size: str, device, seed: int = 0):
    """A randomly initialised float32 LlamaForCausalLM of `size` (a SIZES key), built directly on `device`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        rope_theta=1e6,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        **SIZES[size],
    )
    torch.manual_seed(seed)
    with torch.device(device):
        return LlamaForCausalLM(config).float()


def synthetic_batch(
    prompts: int,
    rollouts: int,
    device,
    *,
    vocab: int = VOCAB,
    prompt_tokens: int = PROMPT_TOKENS,
    response_tokens: int = RESPONSE_TOKENS,
    seed: int = 0,
):
    """A TrainBatch of random tokens: every row prompt_tokens + response_tokens long, behaviour log-probs of a
    uniform policy (ratios near 1 for a random model), rewards that vary within every prompt's group."""
    import torch
    from rlscale.runner.rl.train_step import TrainBatch

    generator = torch.Generator(device="cpu").manual_seed(seed)
    rows, length = prompts * rollouts, prompt_tokens + response_tokens
    input_ids = torch.randint(3, vocab, (rows, length), generator=generator, device="cpu")
    attention_mask = torch.ones(rows, length, dtype=torch.long, device="cpu")
    response_mask = torch.zeros(rows, length, device="cpu")
    response_mask[:, prompt_tokens:] = 1.0
    old_logp = -math.log(vocab) * response_mask
    rewards = (torch.arange(rows, device="cpu") % 2).float().view(prompts, rollouts)
    return TrainBatch(input_ids, attention_mask, response_mask, old_logp, rewards).to(device)


# ---------------------------------------------------------------- the plain loop


def plain_step(model, optimizer, batch, *, micro_rows: int, head_precision: str, checkpointing: bool) -> float:
    """One policy-gradient update written as plain PyTorch (module docstring); returns the loss."""
    import torch
    import torch.nn.functional as F
    from rlscale.runner.rl.train_step import LOGITS_CHUNK_ELEMENTS  # its cross-entropy chunk: rlscale's head chunk

    device = batch.input_ids.device
    cuda = device.type == "cuda"
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_disable()
    model.train()
    rows, length = batch.input_ids.shape
    rewards = batch.rewards.to(device)
    advantages = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std() + 1e-6)).reshape(-1)
    mask = batch.response_mask[:, 1:]
    tokens = mask.sum()
    weight = model.lm_head.weight
    span = max(1, LOGITS_CHUNK_ELEMENTS // (micro_rows * weight.shape[0]))
    optimizer.zero_grad(set_to_none=True)
    total = torch.zeros((), device=device)
    for start in range(0, rows, micro_rows):
        part = slice(start, start + micro_rows)
        ids, targets = batch.input_ids[part], batch.input_ids[part, 1:]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            hidden = model.model(input_ids=ids, attention_mask=batch.attention_mask[part]).last_hidden_state[:, :-1]
            pieces = []
            for column in range(0, length - 1, span):
                h = hidden[:, column : column + span]
                if head_precision == "bf16":  # autocast's head: bf16 logits
                    logits = F.linear(h, weight).float()
                else:
                    with torch.autocast(device.type, enabled=False), tf32_allowed(cuda and head_precision == "tf32"):
                        logits = F.linear(h.float(), weight)
                chunk = targets[:, column : column + span]
                pieces.append(
                    -F.cross_entropy(logits.flatten(0, 1), chunk.flatten(), reduction="none").view(chunk.shape)
                )
        logp = torch.cat(pieces, dim=1)
        ratio = torch.exp(logp - batch.old_logp[part, 1:]).detach().clamp(max=5.0)  # CISPO's capped weight
        loss = -(ratio * advantages[part, None] * logp * mask[part]).sum() / tokens
        loss.backward()
        total += loss.detach()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    model.eval()
    return total.item()


@contextmanager
def tf32_allowed(allowed: bool):
    """CUDA float32 matmuls inside use TF32 when `allowed`; the process's setting otherwise and after."""
    import torch

    before = torch.backends.cuda.matmul.allow_tf32
    if allowed:
        torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


# ---------------------------------------------------------------- measuring


class PeakMemory:
    """Peak memory (GiB) of what runs inside `with`: CUDA's allocator peak, or the resident set sampled on a CPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.gib = 0.0

    def __enter__(self):
        import torch

        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
            return self
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        page = os.sysconf("SC_PAGE_SIZE")
        while not self._stop.is_set():
            resident = int(Path("/proc/self/statm").read_text().split()[1]) * page
            self.gib = max(self.gib, resident / 2**30)
            self._stop.wait(0.01)

    def __exit__(self, *exc):
        import torch

        if self.cuda:
            self.gib = torch.cuda.max_memory_allocated() / 2**30
        else:
            self._stop.set()
            self._thread.join()


def synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def peak_tflops(device) -> float:
    """The rate of one large torch.mm on `device` (bf16 on CUDA, float32 on a CPU), TFLOP/s: the MFU denominator."""
    import torch

    size, dtype = (8192, torch.bfloat16) if device.type == "cuda" else (2048, torch.float32)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    best = math.inf
    for _ in range(5):
        synchronize(device)
        started = time.perf_counter()
        torch.mm(a, b)
        synchronize(device)
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best / 1e12


def time_in_turn(loops: dict, *, rounds: int, steps: int, device, peak=None) -> tuple[dict, dict, dict, list]:
    """({loop: seconds per step, one per round}, {loop: this process's CPU seconds per step, one per round}, {loop:
    peak GiB}, [the device's peak TFLOP/s, one per round]): one warm-up step each (kernels, allocator, Adam state),
    then `rounds` rounds of `steps` steps of each loop in turn, the order alternating, each round opened by measuring
    the peak (`peak`, else peak_tflops) in the same conditions."""
    for loop in loops.values():
        loop()
    seconds = {name: [] for name in loops}
    cpu_seconds = {name: [] for name in loops}
    memory = dict.fromkeys(loops, 0.0)
    peaks = []
    for round_index in range(rounds):
        peaks.append(peak or peak_tflops(device))
        for name in list(loops)[:: 1 if round_index % 2 == 0 else -1]:
            with PeakMemory(device) as used:
                synchronize(device)
                started, cpu_started = time.perf_counter(), time.process_time()
                for _ in range(steps):
                    loops[name]()
                synchronize(device)
            seconds[name].append((time.perf_counter() - started) / steps)
            cpu_seconds[name].append((time.process_time() - cpu_started) / steps)
            memory[name] = max(memory[name], used.gib)
    return seconds, cpu_seconds, memory, peaks


@contextmanager
def fp32_kernel(name: str):
    """rlscale's float32 head on `name`: "split" (split TF32 where the head picks it) or "sgemm" (never split)."""
    from rlscale.runner.rl import head

    before = head.SPLIT_MIN_ROWS
    head.SPLIT_MIN_ROWS = before if name == "split" else 10**12
    try:
        yield
    finally:
        head.SPLIT_MIN_ROWS = before


def fp32_logp_error(model, batch, rows: int = 2) -> dict:
    """Mean and max |log-prob - float64 head's| over the response tokens of the batch's first rows, per kernel."""
    import torch
    from rlscale.runner.rl.head import head_logprobs

    ids, mask = batch.input_ids[:rows], batch.response_mask[:rows, 1:].bool()
    with torch.no_grad(), torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=ids.is_cuda):
        hidden = model.model(input_ids=ids, attention_mask=batch.attention_mask[:rows]).last_hidden_state[:, :-1]
    hidden, targets, weight = hidden[mask].float(), ids[:, 1:][mask], model.lm_head.weight.detach()
    with torch.no_grad():
        exact = torch.log_softmax(hidden.double() @ weight.double().t(), dim=-1).gather(1, targets[:, None])[:, 0]
        errors = {}
        for name in ("split", "sgemm"):
            with fp32_kernel(name):
                logp, _ = head_logprobs(
                    hidden, weight, None, targets, temperature=1.0, precision="fp32", chunk_tokens=4096
                )
            delta = (logp.double() - exact).abs()
            errors[name] = {"mean": delta.mean().item(), "max": delta.max().item(), "tokens": delta.numel()}
    return errors


def measure(size: str, head_precision: str, *, checkpointing: bool, args, device) -> dict:
    """Both loops on one model of `size` at `head_precision`: medians over rounds, the ratio, MFU and peak memory."""
    with fp32_kernel("sgemm" if head_precision == "fp32-sgemm" else "split"):
        return _measure(size, head_precision, checkpointing=checkpointing, args=args, device=device)


def _measure(size: str, head_precision: str, *, checkpointing: bool, args, device) -> dict:
    import torch
    from rlscale.planner.recipe import Recipe
    from rlscale.runner.rl.train_step import make_optimizer, train_step

    fp32_row = head_precision == "fp32-sgemm"
    head_precision = "fp32" if fp32_row else head_precision

    recipe = Recipe(
        prompts_per_batch=args.prompts,
        rollouts=args.rollouts,
        activation_checkpointing=checkpointing,
        head_precision=head_precision,
        lr=1e-6,
        lr_scaling="none",
        lr_warmup_steps=0,
    )
    length = args.prompt_tokens + args.response_tokens
    row = {
        "size": size,
        "head_precision": head_precision,
        "fp32_kernel": ("sgemm" if fp32_row or device.type != "cuda" else "split")
        if head_precision == "fp32"
        else None,
        "activation_checkpointing": checkpointing,
        "rollouts": args.prompts * args.rollouts,
        "tokens_per_rollout": length,
        "micro_batch_rows": max(1, recipe.micro_batch_tokens // length),
    }
    model = optimizer = batch = loops = None
    try:
        model = llama(size, device)
        row["parameters"] = sum(p.numel() for p in model.parameters())
        optimizer = make_optimizer(model, recipe)
        batch = synthetic_batch(
            args.prompts,
            args.rollouts,
            device,
            prompt_tokens=args.prompt_tokens,
            response_tokens=args.response_tokens,
        )
        if head_precision == "fp32" and device.type == "cuda" and not fp32_row:
            row["fp32_logp_error"] = fp32_logp_error(model, batch)
        loops = {
            "rlscale": partial(train_step, model, optimizer, batch, recipe),
            "plain": partial(
                plain_step,
                model,
                optimizer,
                batch,
                micro_rows=row["micro_batch_rows"],
                head_precision=head_precision,
                checkpointing=checkpointing,
            ),
        }
        seconds, cpu_seconds, memory, peaks = time_in_turn(
            loops, rounds=args.rounds, steps=args.steps, device=device, peak=args.peak_tflops
        )
        flops_per_step = 6 * row["parameters"] * batch.input_ids.numel()
        for name in loops:
            row |= {
                f"{name}_step_seconds": seconds[name],
                f"{name}_step_cpu_seconds": cpu_seconds[name],
                f"{name}_tokens_per_s": batch.input_ids.numel() / statistics.median(seconds[name]),
                f"{name}_mfu": statistics.median(
                    flops_per_step / step / (peak * 1e12) for step, peak in zip(seconds[name], peaks)
                ),
                f"{name}_peak_gib": memory[name],
            }
        row["peak_tflops_per_round"] = peaks
        ratios = [plain / ours for ours, plain in zip(seconds["rlscale"], seconds["plain"])]
        cpu_ratios = [plain / ours for ours, plain in zip(cpu_seconds["rlscale"], cpu_seconds["plain"])]
        row |= {
            "oom": False,
            "ratio_per_round": ratios,
            "ratio": statistics.median(ratios),
            "cpu_seconds_ratio": statistics.median(cpu_ratios),
        }
    except torch.cuda.OutOfMemoryError as error:
        row |= {"oom": True, "error": str(error).splitlines()[0]}
    finally:
        del model, optimizer, batch, loops
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--sizes", help="comma-separated SIZES keys (default per device)")
    parser.add_argument("--head-precisions", help="comma-separated fp32, fp32-sgemm, tf32, bf16 (default per device)")
    parser.add_argument("--rounds", type=int, help="alternating timed rounds (the medians are reported)")
    parser.add_argument("--steps", type=int, help="train steps per loop per round")
    parser.add_argument("--prompts", type=int)
    parser.add_argument("--rollouts", type=int)
    parser.add_argument("--prompt-tokens", type=int)
    parser.add_argument("--response-tokens", type=int)
    parser.add_argument("--checkpointing", choices=("auto", "off", "on"), default="auto", help="auto: on for 3B")
    parser.add_argument("--peak-tflops", type=float, help="the MFU denominator (default: a torch.mm measured here)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    for key, value in DEFAULTS[args.device].items():
        if getattr(args, key) is None:
            setattr(args, key, value)

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: torch sees no CUDA GPU; nothing measured, nothing written (--device cpu: the proxy).")
        raise SystemExit(2)
    sys.path.insert(0, str(ROOT))
    import transformers

    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        parser.error(f"--sizes: unknown {', '.join(unknown)}; expected some of {', '.join(SIZES)}")
    precisions = [p.strip() for p in args.head_precisions.split(",") if p.strip()]
    if any(p not in ("fp32", "fp32-sgemm", "tf32", "bf16") for p in precisions):
        parser.error("--head-precisions: expected some of fp32, fp32-sgemm, tf32, bf16")
    device = torch.device(args.device)
    peak_source = "given (--peak-tflops)" if args.peak_tflops else "one large torch.mm, measured each round"
    print(
        f"{'size':>7} {'head':>10} {'ckpt':>4} {'rlscale tok/s':>13} {'plain tok/s':>11} {'ratio':>5} "
        f"{'MFU':>5} {'peak GiB':>14}"
    )
    rows = []
    for size in sizes:
        checkpointing = args.checkpointing == "on" or (args.checkpointing == "auto" and size in CHECKPOINTED)
        for precision in precisions:
            row = measure(size, precision, checkpointing=checkpointing, args=args, device=device)
            rows.append(row)
            ckpt = "on" if checkpointing else "off"
            if row["oom"]:
                print(f"{size:>7} {precision:>10} {ckpt:>4} {'out of memory':>13}", flush=True)
                continue
            print(
                f"{size:>7} {precision:>10} {ckpt:>4} {row['rlscale_tokens_per_s']:13,.0f} "
                f"{row['plain_tokens_per_s']:11,.0f} {row['ratio']:5.2f} {row['rlscale_mfu']:5.1%} "
                f"{row['rlscale_peak_gib']:6.1f} / {row['plain_peak_gib']:5.1f}",
                flush=True,
            )
    payload = {
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "device_memory_gib": torch.cuda.get_device_properties(0).total_memory / 2**30
        if device.type == "cuda"
        else None,
        "host": {
            "machine": platform.machine(),
            "cpus": len(os.sched_getaffinity(0)),
            "threads": torch.get_num_threads(),
        },
        "date": time.strftime("%Y-%m-%d"),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "vocab": VOCAB,
        "prompts": args.prompts,
        "rollouts_per_prompt": args.rollouts,
        "prompt_tokens": args.prompt_tokens,
        "response_tokens": args.response_tokens,
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "peak_tflops": args.peak_tflops,  # None: measured each round (results' peak_tflops_per_round)
        "peak_source": peak_source,
        "results": rows,
    }
    out = args.out or RESULTS / ("gpu_trainer.json" if device.type == "cuda" else "gpu_trainer_cpu.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")


if __name__ == "__main__":
    main()
