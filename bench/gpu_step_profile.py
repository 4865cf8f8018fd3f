"""Benchmark: where a 0.5B train step's GPU time goes, per head precision (CUDA only).

Question (issue 47): how fast does each LM-head matmul kernel run at the 0.5B head's shape (one chunk of 1,766
tokens x 896 x 151,936), and which kernels fill one `train_step` (16 x 16 rollouts x 1,024 tokens) at fp32 (split
TF32) and bf16? Prints the matmul rates and torch.profiler's top CUDA kernels for one step after a warm-up; a step's
CUDA time below its wall time means the GPU waited for the CPU to launch kernels.

    python3 bench/gpu_step_profile.py
Writes bench/results/gpu_step_profile.txt (what it printed).
"""

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import gpu_trainer as g  # noqa: E402
from rlscale.planner.recipe import Recipe  # noqa: E402
from rlscale.runner.rl import head  # noqa: E402
from rlscale.runner.rl.train_step import make_optimizer, train_step  # noqa: E402

OUT = ROOT / "bench" / "results" / "gpu_step_profile.txt"
lines = []


def say(text: str) -> None:
    print(text, flush=True)
    lines.append(text)


def milliseconds(f, n=10) -> float:
    f()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        f()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


def main() -> None:
    if not torch.cuda.is_available():
        print("torch sees no CUDA GPU; nothing measured, nothing written.")
        raise SystemExit(2)
    dev = torch.device("cuda")
    rows, width, vocab = 1766, 896, g.VOCAB
    a, w = torch.randn(rows, width, device=dev), torch.randn(vocab, width, device=dev)
    ab, wb, w_split = a.bfloat16(), w.bfloat16(), head.split_tf32(w).t()
    flop = 2 * rows * width * vocab
    kernels = {
        "sgemm": lambda: torch.mm(a, w.t()),
        "split": lambda: head._split_addmm(None, a, head.split_tf32(w).t()),
        "split(w pre-split)": lambda: head._split_addmm(None, a, w_split),
        "bf16 out_dtype fp32": lambda: torch.mm(ab, wb.t(), out_dtype=torch.float32),
        "bf16 mm .float()": lambda: torch.mm(ab, wb.t()).float(),
        "bf16 cast w + out fp32": lambda: torch.mm(ab, w.t().to(torch.bfloat16), out_dtype=torch.float32),
    }
    say(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    for name, f in kernels.items():
        ms = milliseconds(f)
        say(f"{name:>24} {ms:8.3f} ms {flop / ms / 1e9:8.1f} TFLOP/s")
    for precision in ("fp32", "bf16"):
        model = g.llama("0.5B", dev)
        recipe = Recipe(
            prompts_per_batch=16,
            rollouts=16,
            head_precision=precision,
            lr=1e-6,
            lr_scaling="none",
            lr_warmup_steps=0,
        )
        optimizer = make_optimizer(model, recipe)
        batch = g.synthetic_batch(16, 16, dev, prompt_tokens=256, response_tokens=768)
        train_step(model, optimizer, batch, recipe)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            train_step(model, optimizer, batch, recipe)
            torch.cuda.synchronize()
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=60)
        say(f"{precision} {table}")
        del model, optimizer, batch
        torch.cuda.empty_cache()
    OUT.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
