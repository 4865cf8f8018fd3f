"""The TRL job's TrainerCallbacks: a JSON line per rlscale step, the study's reward at eval steps, and a checkpointed
stop at the segment's last step (RecordCallback evaluates rlscale's task; EvalRecordCallback has TRL evaluate)."""

import json
import time
from pathlib import Path

from transformers import TrainerCallback

EVAL_SEED_BASE = 7_000_000  # validation sampling seeds: (base, recipe seed, step), apart from TRL's training seed


class SegmentCallback(TrainerCallback):
    """A segment's record lines in `log_file`, one per rlscale step (`updates` optimizer updates), and a checkpointed
    stop at until_step; a subclass says what happens at an eval step."""

    def __init__(self, recipe, log_file: Path, *, until_step: int, updates: int):
        self.recipe, self.until, self.updates = recipe, until_step, updates
        self.log = log_file.open("ab", buffering=0)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.updates:
            return
        step = state.global_step // self.updates
        if self.recipe.is_eval_step(step) or step in (self.until, self.recipe.steps):
            self.at_eval_step(step, control, model)
        if step >= self.until:  # pause (or end) here: TRL saves the checkpoint after this step's log and evaluation
            control.should_save = True
            control.should_training_stop = True

    def at_eval_step(self, step: int, control, model) -> None:
        """Evaluate step `step` (its training step has ended)."""

    def close(self) -> None:
        self.log.close()


class RecordCallback(SegmentCallback):
    """Writes a record line per rlscale step (one generated batch: updates_per_batch optimizer updates), evaluates at
    the recipe's eval steps, and ends training with a checkpoint at until_step."""

    def __init__(self, recipe, task, tokenizer, prompts, log_file: Path, *, until_step: int):
        from rlscale.planner.frameworks.common import updates_per_batch

        super().__init__(recipe, log_file, until_step=until_step, updates=updates_per_batch(recipe))
        self.task, self.tokenizer, self.prompts = task, tokenizer, prompts
        self.val_reward = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step == 0:
            write_line(self.log, 0, self.evaluate(model, 0), {})

    def at_eval_step(self, step: int, control, model) -> None:
        self.val_reward = self.evaluate(model, step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.global_step % self.updates or "train_runtime" in (logs or {}):  # the end-of-training summary
            return
        write_line(self.log, state.global_step // self.updates, self.val_reward, dict(logs or {}))
        self.val_reward = None

    def evaluate(self, model, step: int) -> float:
        """Mean verifier reward over eval_samples samples per held-out prompt (the builtin engine's val reward)."""
        import torch

        recipe, tokenizer = self.recipe, self.tokenizer
        model = getattr(model, "module", model)
        device = next(model.parameters()).device
        batch = tokenizer([p.text for p in self.prompts], return_tensors="pt", padding=True, padding_side="left").to(
            device
        )
        training = model.training
        model.eval()
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.no_grad():
            torch.manual_seed(EVAL_SEED_BASE + recipe.seed * 1_000_000 + step)
            out = model.generate(
                **batch,
                do_sample=True,
                temperature=recipe.temperature,
                top_k=0,
                top_p=1.0,
                max_new_tokens=recipe.max_new_tokens,
                num_return_sequences=recipe.eval_samples,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
        model.train(training)
        texts = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
        rewards = [self.task.verify(self.prompts[i // recipe.eval_samples], text) for i, text in enumerate(texts)]
        return sum(rewards) / len(rewards)


def write_line(log, step: int, val_reward, metrics: dict) -> None:
    """One record line: {"step", "time" (epoch seconds), "val_reward" (None between evals), "metrics"}."""
    line = {"step": step, "time": time.time(), "val_reward": val_reward, "metrics": metrics}
    log.write(json.dumps(line).encode() + b"\n")


class EvalRecordCallback(SegmentCallback):
    """A setup study's records: a line per rlscale step, with `metric` from TRL's evaluation at eval steps (TRL logs a
    step, then evaluates, then saves), and a checkpointed stop at until_step. Step 0 is TRL's eval_on_start."""

    def __init__(self, recipe, log_file: Path, *, until_step: int, updates: int, metric: str):
        super().__init__(recipe, log_file, until_step=until_step, updates=updates)
        self.metric = metric
        self.evaluating: int | None = None  # the step whose line waits for its evaluation
        self.pending: dict = {}  # that step's training logs

    def at_eval_step(self, step: int, control, model) -> None:
        control.should_evaluate = True  # TRL evaluates after this step's log, then saves
        self.evaluating, self.pending = step, {}

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = dict(logs or {})
        if state.global_step % self.updates or "train_runtime" in logs or any(k.startswith("eval_") for k in logs):
            return  # within a step, the end-of-training summary, or the evaluation's own log
        step = state.global_step // self.updates
        if step == self.evaluating:
            self.pending = logs
        else:
            write_line(self.log, step, None, logs)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        metrics = metrics or {}
        value = metrics.get(self.metric, metrics.get(f"eval_{self.metric}"))
        if self.metric not in metrics and f"eval_{self.metric}" not in metrics:
            raise KeyError(
                f"the study's reward metric {self.metric!r} is not among TRL's evaluation metrics: "
                f"{', '.join(sorted(metrics))}"
            )
        step = state.global_step // self.updates
        write_line(self.log, step, value, self.pending if step == self.evaluating else {})
        self.evaluating, self.pending = None, {}
