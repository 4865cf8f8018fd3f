"""The trainer: the torch policy and its optimizer behind `train_step`, as a Ray actor that hands out weights
(a safetensors blob, what `Generator.update_weights` loads) and its full state (a torch.save blob, for checkpoints)."""

from __future__ import annotations

import copy
import io
import os
import time
from pathlib import Path

import torch
from rlscale.runner.builtin.generator import Generation
from rlscale.runner.rl.train_step import TrainBatch, autocast, make_optimizer, token_logprobs, train_step


def train_batch(
    prompt_ids: list[list[int]], generation: Generation, rewards: list[list[float]], pad_id: int
) -> TrainBatch:
    """A TrainBatch in runner/rl/sampling.py's layout (left-padded prompts, right-padded responses, generator
    log-probs); forced tokens (an interrupt's marker) are attended to but masked out of the loss."""
    n = len(generation.rollouts[0])
    rows = [(prompt_ids[i], r) for i, group in enumerate(generation.rollouts) for r in group]
    prompt_width = max(len(p) for p, _ in rows)
    width = prompt_width + max(1, max(len(r.token_ids) for _, r in rows))
    cpu = torch.device("cpu")  # built row by row on the host; the trainer moves it to its device once
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long, device=cpu)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long, device=cpu)
    response_mask = torch.zeros((len(rows), width), dtype=torch.float32, device=cpu)
    old_logp = torch.zeros((len(rows), width), dtype=torch.float32, device=cpu)
    for row, (prompt, rollout) in enumerate(rows):
        start, end = prompt_width - len(prompt), prompt_width + len(rollout.token_ids)
        input_ids[row, start:end] = torch.tensor(prompt + rollout.token_ids, dtype=torch.long, device=cpu)
        attention_mask[row, start:end] = 1
        response_mask[row, prompt_width:end] = torch.tensor(rollout.sampled, dtype=torch.float32, device=cpu)
        old_logp[row, prompt_width:end] = torch.tensor(rollout.logprobs, dtype=torch.float32, device=cpu)
    return TrainBatch(
        input_ids,
        attention_mask,
        response_mask,
        old_logp,
        torch.tensor(rewards, dtype=torch.float32, device=cpu).view(len(prompt_ids), n),
    )


class Trainer:
    """The policy being trained (float32 weights and AdamW state, bf16 autocast on CUDA per recipe.gpu_dtype, FP32
    head at recipe.head_precision) on `device`, and an optional frozen reference."""

    def __init__(
        self,
        model_dir: str | Path,
        recipe,
        *,
        threads: int = 1,
        cpu_cores: list[int] | None = None,
        device: str = "cpu",
    ):
        if cpu_cores:
            os.sched_setaffinity(0, cpu_cores)  # keep the trainer off the generator's cores
        torch.set_num_threads(threads)
        self.model_dir = str(model_dir)
        self.device = torch.device(device)
        self.reset(recipe)

    def reset(self, recipe) -> None:
        """Start `recipe`'s job afresh (base policy, new optimizer, its seed), so a sweep can reuse the actor."""
        from rlscale.runner.rl.policy import load_policy

        torch.manual_seed(recipe.seed)
        self.recipe = recipe
        self.model, self.tokenizer = load_policy(self.model_dir)
        self.model.to(self.device)
        self.ref_model = copy.deepcopy(self.model).requires_grad_(False) if recipe.kl_coef > 0 else None
        self.optimizer = make_optimizer(self.model, recipe)
        self.busy_seconds = 0.0

    def train(self, prompt_ids: list[list[int]], generation: Generation, rewards: list[list[float]]) -> dict:
        """One `train_step` on a generated batch: {"metrics": health metrics, "started"/"ended": wall-clock seconds}."""
        started, clock = time.time(), time.perf_counter()
        batch = train_batch(prompt_ids, generation, rewards, self.tokenizer.pad_token_id).to(self.device)
        metrics = train_step(self.model, self.optimizer, batch, self.recipe, ref_model=self.ref_model)
        self.busy_seconds += time.perf_counter() - clock
        return {"metrics": metrics, "started": started, "ended": time.time()}

    def weights(self) -> bytes:
        """The policy's weights as a safetensors blob (HF parameter names, what vLLM's loader expects)."""
        from safetensors.torch import save

        return save({name: tensor.detach().to("cpu").contiguous() for name, tensor in self.model.state_dict().items()})

    def state(self) -> bytes:
        """Everything a checkpoint needs to resume training bit-for-bit: model, optimizer, CPU and CUDA RNG."""
        buffer = io.BytesIO()
        torch.save(
            {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            },
            buffer,
        )
        return buffer.getvalue()

    def load_state(self, blob: bytes) -> None:
        """Restore a `state()` blob saved on any device (the RNG states must be CPU ByteTensors to be set)."""
        state = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=False)
        self.model.load_state_dict(state["model"])  # copies into the parameters, on whatever device they are
        self.optimizer.load_state_dict(state["optimizer"])  # moves the Adam moments to their parameters' device
        torch.set_rng_state(state["rng"])
        if state.get("cuda_rng") and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"][: torch.cuda.device_count()])

    @torch.no_grad()
    def score(self, prompt_ids: list[int], completion_ids: list[int], temperature: float = 1.0) -> list[float]:
        """The trainer's log-probs of a fixed completion after a prompt (the same computation `train_step` uses)."""
        ids = torch.tensor([prompt_ids + completion_ids], device=self.device)
        with autocast(self.recipe, self.device):
            logp, _ = token_logprobs(
                self.model,
                ids,
                torch.ones_like(ids),
                temperature=temperature,
                fp32_head=self.recipe.fp32_head,
                head_precision=self.recipe.head_precision,
            )
        return logp[0, len(prompt_ids) :].tolist()

    def stats(self) -> dict:
        """Cumulative busy seconds (time inside `train`)."""
        return {"busy_seconds": self.busy_seconds}


def create_trainer(recipe, model_dir: str | Path | None = None):
    """A trainer actor for `recipe` (its model, trainer_devices), placed per `placement(recipe)`. Needs Ray; it can
    serve consecutive jobs on the same model (`run_job` calls `reset(recipe)`)."""
    from rlscale.runner.builtin.accounting import placement
    from rlscale.runner.builtin.local import resolve_model_dir

    where = placement(recipe)
    return trainer_actor(
        model_dir or resolve_model_dir(recipe), recipe, on_gpu=where.on_gpu, cpu_cores=where.trainer_cores
    )


def trainer_actor(model_dir: str | Path, recipe, *, on_gpu: bool = False, cpu_cores: list[int] | None = None):
    """Start a `Trainer` as a Ray actor on recipe.trainer_devices GPUs (`on_gpu`) or CPU cores; returns the handle."""
    import ray

    devices = recipe.trainer_devices
    resources = {"num_gpus": devices, "num_cpus": 1} if on_gpu else {"num_cpus": devices}
    # one device per trainer for now: multi-GPU data parallelism is not implemented
    return ray.remote(**resources)(Trainer).remote(
        str(model_dir),
        recipe,
        threads=1 if on_gpu else devices,
        cpu_cores=cpu_cores,
        device="cuda" if on_gpu else "cpu",
    )
