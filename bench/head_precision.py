"""Benchmark: what each LM-head precision costs in log-prob mismatch against the float32 head.

Question (issue 47): on the quickstart's rollouts, how far do the trainer's log-probs move when the FP32 head's matmul
runs at tf32 or bf16 (the recipe's head_precision) instead of fp32? On CUDA the fp32 head runs as split TF32 (three
tensor-core products, runner/rl/head.py): the reference there is the SGEMM head, and fp32-split is measured against
it like the others. The tiny base policy samples --batches batches
of the quickstart's largest geometry (B_p x n, its temperature and max_new_tokens) with the float32 head; then
token_logprobs scores every response token at each precision, and |log-prob - fp32 log-prob| is summarised (mean,
99th percentile, max) over all of them. tf32 is a CUDA mode: on a CPU the tf32 head computes fp32, so it is not
measured there (`--device cuda` measures it).

    .venv/bin/python bench/head_precision.py [--device cpu|cuda] [--batches 8]
Writes bench/results/head_precision_<device>.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def quickstart_rollouts(study_path: str, batches: int, device):
    """(recipe with the study's largest B_p and n, [Rollouts]) sampled by the tiny base policy with its float32 head."""
    import torch
    from rlscale.planner.study_file import load_study
    from rlscale.runner.builtin.local import resolve_model_dir
    from rlscale.runner.rl.advantages import PromptPool
    from rlscale.runner.rl.policy import load_policy
    from rlscale.runner.rl.sampling import sample
    from rlscale.runner.rl.tasks import make_task

    study = load_study(study_path)
    largest = {key: max(axis.values) for key, axis in study.parameters.items() if axis.values}
    recipe = study.recipe.model_copy(update=largest)
    model, tokenizer = load_policy(resolve_model_dir(recipe))
    model.to(device)
    task = make_task(recipe)
    pool = PromptPool(task.train, retire_above=None, seed=recipe.seed)
    generator = torch.Generator(device=device).manual_seed(recipe.seed)
    rollouts = [
        sample(
            model,
            [tokenizer(p.text)["input_ids"] for p in pool.sample(recipe.prompts_per_batch)],
            n=recipe.rollouts,
            max_new_tokens=recipe.max_new_tokens,
            temperature=recipe.temperature,
            eos_id=tokenizer.eos_token_id,
            pad_id=tokenizer.pad_token_id,
            generator=generator,
        )
        for _ in range(batches)
    ]
    return recipe, model, rollouts


def mismatch(model, recipe, rollouts, precision: str) -> dict:
    """|log-prob at `precision` - SGEMM fp32 log-prob| over every response token: mean, p99, max (nats), count."""
    import torch
    from gpu_trainer import fp32_kernel
    from rlscale.runner.rl.train_step import token_logprobs

    def score(batch, head_precision, kernel):
        with fp32_kernel(kernel):
            return token_logprobs(
                model,
                batch.input_ids,
                batch.attention_mask,
                temperature=recipe.temperature,
                fp32_head=True,
                head_precision=head_precision,
                where=batch.response_mask,
            )[0]

    deltas = []
    with torch.no_grad():
        for batch in rollouts:
            got = score(batch, "fp32", "split") if precision == "fp32-split" else score(batch, precision, "sgemm")
            delta = got - score(batch, "fp32", "sgemm")
            deltas.append(delta[batch.response_mask > 0].abs().double())
    delta = torch.cat(deltas)
    return {
        "tokens": delta.numel(),
        "mean_abs_delta_logp": delta.mean().item(),
        "p99_abs_delta_logp": delta.quantile(0.99).item(),
        "max_abs_delta_logp": delta.max().item(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--study", default=str(ROOT / "studies" / "quickstart.yaml"))
    parser.add_argument("--batches", type=int, default=8, help="sampled batches of the study's largest B_p x n")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: torch sees no CUDA GPU; nothing measured, nothing written.")
        raise SystemExit(2)
    device = torch.device(args.device)
    recipe, model, rollouts = quickstart_rollouts(args.study, args.batches, device)
    precisions = ("fp32-split", "tf32", "bf16") if device.type == "cuda" else ("bf16",)
    rows = {precision: mismatch(model, recipe, rollouts, precision) for precision in precisions}
    if device.type != "cuda":
        rows["tf32"] = {"not_measured": "a CPU has no TF32: the tf32 head computes fp32 there (--device cuda)"}
    print(f"{'head':>10} {'tokens':>7} {'mean |d logp|':>14} {'p99':>10} {'max':>10}")
    for precision, row in rows.items():
        if "not_measured" in row:
            print(f"{precision:>10}  not measured: {row['not_measured']}")
            continue
        print(
            f"{precision:>10} {row['tokens']:7d} {row['mean_abs_delta_logp']:14.2e} "
            f"{row['p99_abs_delta_logp']:10.2e} {row['max_abs_delta_logp']:10.2e}"
        )
    payload = {
        "study": Path(args.study).name,
        "prompts_per_batch": recipe.prompts_per_batch,
        "rollouts": recipe.rollouts,
        "batches": args.batches,
        "temperature": recipe.temperature,
        "max_new_tokens": recipe.max_new_tokens,
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "host": {"machine": platform.machine(), "threads": torch.get_num_threads()},
        "date": time.strftime("%Y-%m-%d"),
        "torch": torch.__version__,
        "against": "fp32 (SGEMM)",
        "results": rows,
    }
    out = args.out or ROOT / "bench" / "results" / f"head_precision_{device.type}.json"
    out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")


if __name__ == "__main__":
    main()
