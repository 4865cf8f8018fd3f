"""The TRL job's TrainerCallback: a JSON line per rlscale step, the validation pass rate at the recipe's eval steps,
and the end of training (with a checkpoint) at the segment's last step."""

import json
import time
from pathlib import Path

from transformers import TrainerCallback

EVAL_SEED_BASE = 7_000_000  # validation sampling seeds: (base, recipe seed, step), apart from TRL's training seed


class RecordCallback(TrainerCallback):
    """Writes a record line per rlscale step (one generated batch: updates_per_batch optimizer updates), evaluates at
    the recipe's eval steps, and ends training with a checkpoint at until_step."""

    def __init__(self, recipe, task, tokenizer, prompts, log_file: Path, *, until_step: int):
        from rlscale.planner.frameworks.common import updates_per_batch

        self.recipe, self.task, self.tokenizer, self.prompts = recipe, task, tokenizer, prompts
        self.until = until_step
        self.updates = updates_per_batch(recipe)
        self.log = log_file.open("ab", buffering=0)
        self.val_reward = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step == 0:
            self._write(0, self.evaluate(model, 0), {})

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.updates:
            return
        step = state.global_step // self.updates
        if self.recipe.is_eval_step(step) or step in (self.until, self.recipe.steps):
            self.val_reward = self.evaluate(model, step)
        if step >= self.until:  # pause (or end) here: TRL saves the checkpoint after this step's log
            control.should_save = True
            control.should_training_stop = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.global_step % self.updates or "train_runtime" in (logs or {}):  # the end-of-training summary
            return
        self._write(state.global_step // self.updates, self.val_reward, dict(logs or {}))
        self.val_reward = None

    def evaluate(self, model, step: int) -> float:
        """Mean verifier reward over eval_samples samples per held-out prompt (the builtin engine's val reward)."""
        import torch

        recipe, tokenizer = self.recipe, self.tokenizer
        model = getattr(model, "module", model)
        device = next(model.parameters()).device
        batch = tokenizer([p.text for p in self.prompts], return_tensors="pt", padding=True, padding_side="left").to(device)
        training = model.training
        model.eval()
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.no_grad():
            torch.manual_seed(EVAL_SEED_BASE + recipe.seed * 1_000_000 + step)
            out = model.generate(**batch, do_sample=True, temperature=recipe.temperature, top_k=0, top_p=1.0,
                                 max_new_tokens=recipe.max_new_tokens, num_return_sequences=recipe.eval_samples,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        model.train(training)
        texts = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
        rewards = [self.task.verify(self.prompts[i // recipe.eval_samples], text) for i, text in enumerate(texts)]
        return sum(rewards) / len(rewards)

    def _write(self, step: int, val_reward, metrics: dict) -> None:
        line = {"step": step, "time": time.time(), "val_reward": val_reward, "metrics": metrics}
        self.log.write(json.dumps(line).encode() + b"\n")

    def close(self) -> None:
        self.log.close()
