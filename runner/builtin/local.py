"""The single-process RL loop (torch sampling, no Ray, no vLLM): for tests, debugging and the tiny policy.
Compute: 1 device x training wall seconds / 3600; evaluation is not charged, so its schedule cannot move the curve."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from pathlib import Path

import torch
from rlscale.runner.rl.advantages import PromptPool
from rlscale.runner.rl.sampling import sample
from rlscale.runner.rl.tasks import make_task
from rlscale.runner.rl.train_step import TrainBatch, autocast, make_optimizer, train_step

from rlscale.base.compute import device_hours, held

DEVICES = 1  # the local loop holds one device
# the last step's metrics an eval record carries
LOGGED_METRICS = ("train_reward", "entropy", "kl", "grad_norm", "clip_fraction", "truncation_rate", "kept_prompts")


def resolve_model_dir(recipe) -> Path:
    """The recipe's model directory: the embedded tiny policy for 'tiny', else the given HF directory."""
    from rlscale.runner.rl.policy import model_path

    from rlscale.base.errors import UserError

    path = Path(model_path(recipe.model))
    if not (path / "config.json").is_file():
        raise UserError("expected 'tiny' or a HF model directory with config.json", field="model")
    return path


def sample_prompts(model, tokenizer, prompts, recipe, *, n: int, generator: torch.Generator):
    """`n` rollouts per prompt at the recipe's temperature, length and LM head (Rollouts)."""
    return sample(
        model,
        [tokenizer(p.text)["input_ids"] for p in prompts],
        n=n,
        max_new_tokens=recipe.max_new_tokens,
        temperature=recipe.temperature,
        eos_id=tokenizer.eos_token_id,
        pad_id=tokenizer.pad_token_id,
        generator=generator,
        fp32_head=recipe.fp32_head,
        head_precision=recipe.head_precision,
        decode=tokenizer.decode,
    )


def evaluate(model, tokenizer, task, recipe, generator: torch.Generator) -> float:
    """Validation pass rate: mean reward over eval_samples rollouts per held-out prompt at the training temperature."""
    prompts = task.validation(recipe.eval_prompts)
    with autocast(recipe, generator.device):
        rollouts = sample_prompts(model, tokenizer, prompts, recipe, n=recipe.eval_samples, generator=generator)
    rewards = [task.verify(prompts[i // recipe.eval_samples], c) for i, c in enumerate(rollouts.completions)]
    return sum(rewards) / len(rewards)


def default_device() -> str:
    """'cuda' when torch sees a GPU, else 'cpu'."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def run_local(
    recipe,
    *,
    steps: int | None = None,
    threads: int = 1,
    device: str | None = None,
    on_step: Callable[[int, dict], None] | None = None,
    on_record: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Train per `recipe` for `steps` (default recipe.steps) on `device` (default: cuda if available), deterministic
    per seed, device and threads; returns eval records {step, gpu_hours, rollouts, tokens, val_reward, ...}."""
    from rlscale.runner.rl.policy import load_policy

    device = torch.device(device or default_device())
    total_steps = steps or recipe.steps
    torch.set_num_threads(threads)
    torch.manual_seed(recipe.seed)
    model, tokenizer = load_policy(resolve_model_dir(recipe))
    model.to(device)
    ref_model = copy.deepcopy(model).requires_grad_(False) if recipe.kl_coef > 0 else None
    optimizer = make_optimizer(model, recipe)
    task = make_task(recipe)
    pool = PromptPool(task.train, retire_above=recipe.no_positive_resampling, seed=recipe.seed)
    rollout_gen = torch.Generator(device=device).manual_seed(recipe.seed)
    eval_seed = 10_000 + recipe.seed  # a separate stream: evaluation never shifts the training samples

    records: list[dict] = []
    train_seconds, rollouts_done, tokens_done = 0.0, 0, 0
    last: dict = {}

    def record(step: int) -> None:
        val = evaluate(model, tokenizer, task, recipe, torch.Generator(device=device).manual_seed(eval_seed + step))
        row = {
            "step": step,
            "gpu_hours": device_hours(held(DEVICES, train_seconds)),
            "rollouts": rollouts_done,
            "tokens": tokens_done,
            "val_reward": val,
            "active_prompts": pool.active,
            "retired_prompts": len(pool.retired),
            **{k: last[k] for k in LOGGED_METRICS if k in last},
            "staleness": 0,
        }
        records.append(row)
        if on_record:
            on_record(row)

    record(0)
    for step in range(1, total_steps + 1):
        started = time.perf_counter()
        prompts = pool.sample(recipe.prompts_per_batch)
        with autocast(recipe, device):  # the sampler's log-probs in the trainer's precision: ratio 1 on-policy
            rollouts = sample_prompts(model, tokenizer, prompts, recipe, n=recipe.rollouts, generator=rollout_gen)
        rewards = torch.tensor(
            [task.verify(prompts[i // recipe.rollouts], c) for i, c in enumerate(rollouts.completions)], device=device
        ).view(len(prompts), recipe.rollouts)
        for prompt, prompt_rewards in zip(prompts, rewards.tolist()):
            pool.record(prompt, prompt_rewards)
        batch = TrainBatch(rollouts.input_ids, rollouts.attention_mask, rollouts.response_mask, rollouts.logp, rewards)
        last = train_step(model, optimizer, batch, recipe, ref_model=ref_model)
        last["truncation_rate"] = rollouts.truncated.float().mean().item()
        train_seconds += time.perf_counter() - started
        rollouts_done += rewards.numel()
        tokens_done += rollouts.response_tokens
        if on_step:
            on_step(step, last | {"elapsed": train_seconds})
        if recipe.is_eval_step(step) or step == total_steps:
            record(step)
    return records
