"""Benchmark: the built-in trainer on one CUDA GPU, Llama models of about 0.5B, 1.5B and 3B parameters.

Each model is randomly initialised from a LlamaConfig (Qwen2.5-0.5B/1.5B/3B shapes, tied embeddings, 152k
vocabulary; nothing is downloaded) and trained with `train_step` on synthetic batches of B_p x n = 16 x 16 = 256
rollouts of 1,024 tokens (256 prompt + 768 response) under the recipe's defaults (CISPO, prompt aggregation, fp32
weights and AdamW state, bf16 autocast, FP32 head, micro_batch_tokens), with activation checkpointing off and on.
Prints peak GPU memory and train tokens/s (rows x length per second of train_step, after one warm-up step) and
writes bench/results/gpu_trainer.json. A configuration that runs out of memory is recorded as such.

Run on a GPU machine: `python bench/gpu_trainer.py [--sizes 0.5B,1.5B] [--steps 2]`. Without CUDA it refuses.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "bench" / "results" / "gpu_trainer.json"

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
VOCAB = 151_936
PROMPT_TOKENS, RESPONSE_TOKENS = 256, 768


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
    import math

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


def measure(size: str, *, checkpointing: bool, steps: int, prompts: int, rollouts: int, device="cuda") -> dict:
    """Peak memory (GiB) and train tokens/s of `steps` train_steps (after one warm-up) for model `size`."""
    import torch
    from rlscale.planner.recipe import Recipe
    from rlscale.runner.rl.train_step import make_optimizer, train_step

    recipe = Recipe(
        prompts_per_batch=prompts, rollouts=rollouts, activation_checkpointing=checkpointing, lr=1e-6, lr_warmup_steps=0
    )
    row = {
        "size": size,
        "activation_checkpointing": checkpointing,
        "micro_batch_tokens": recipe.micro_batch_tokens,
        "rollouts": prompts * rollouts,
        "tokens_per_rollout": PROMPT_TOKENS + RESPONSE_TOKENS,
    }
    model = optimizer = batch = None
    try:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        model = llama(size, device)
        row["parameters"] = sum(p.numel() for p in model.parameters())
        optimizer = make_optimizer(model, recipe)
        batch = synthetic_batch(prompts, rollouts, device)
        metrics = train_step(model, optimizer, batch, recipe)  # warm-up: kernels, allocator, Adam state
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(steps):
            metrics = train_step(model, optimizer, batch, recipe)
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - started) / steps
        row |= {
            "oom": False,
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
            "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
            "step_seconds": seconds,
            "train_tokens_per_s": batch.input_ids.numel() / seconds,
            "loss": metrics["loss"],
            "grad_norm": metrics["grad_norm"],
        }
    except torch.cuda.OutOfMemoryError as error:
        row |= {"oom": True, "error": str(error).splitlines()[0]}
    finally:
        del model, optimizer, batch
        gc.collect()
        torch.cuda.empty_cache()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(SIZES), help="comma-separated SIZES keys")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per configuration (after one warm-up)")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--rollouts", type=int, default=16)
    parser.add_argument("--checkpointing", default="off,on", help="activation checkpointing modes to run: off,on")
    parser.add_argument("--out", type=Path, default=RESULT)
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        print(
            "bench/gpu_trainer.py needs a CUDA GPU and torch sees none; nothing measured, nothing written.",
            file=sys.stderr,
        )
        raise SystemExit(2)
    sys.path.insert(0, str(ROOT))
    import transformers

    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        parser.error(f"--sizes: unknown {', '.join(unknown)}; expected some of {', '.join(SIZES)}")
    modes = [m.strip() == "on" for m in args.checkpointing.split(",") if m.strip()]
    rows = []
    print(f"{'size':>5} {'params':>7} {'ckpt':>4} {'peak GiB':>9} {'step s':>7} {'train tok/s':>12}")
    for size in sizes:
        for checkpointing in modes:
            row = measure(
                size, checkpointing=checkpointing, steps=args.steps, prompts=args.prompts, rollouts=args.rollouts
            )
            rows.append(row)
            params = f"{row.get('parameters', 0) / 1e9:.2f}B"
            if row["oom"]:
                print(f"{size:>5} {params:>7} {'on' if checkpointing else 'off':>4} {'OOM':>9}", flush=True)
            else:
                print(
                    f"{size:>5} {params:>7} {'on' if checkpointing else 'off':>4} {row['peak_gib']:9.1f} "
                    f"{row['step_seconds']:7.2f} {row['train_tokens_per_s']:12,.0f}",
                    flush=True,
                )
    payload = {
        "device": torch.cuda.get_device_name(0),
        "device_memory_gib": torch.cuda.get_device_properties(0).total_memory / 2**30,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "vocab": VOCAB,
        "prompt_tokens": PROMPT_TOKENS,
        "response_tokens": RESPONSE_TOKENS,
        "timed_steps": args.steps,
        "results": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")


if __name__ == "__main__":
    main()
