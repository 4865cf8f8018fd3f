"""One RL job on Ray: a vLLM generator actor and a torch trainer actor, in sync, ppo_off_policy or pipeline mode.
Records reach `on_records` only after the checkpoint that carries them, so a resume re-emits them identically."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from rlscale.runner.builtin import checkpoint
from rlscale.runner.builtin.accounting import DeviceClock, union_seconds
from rlscale.runner.engine import ComputeStop, step_cap

EVAL_SEED_BASE = 10**9  # validation samples come from their own seed stream


@dataclass
class JobState:
    """What the driver restores from a checkpoint (the trainer restores its own state)."""

    step: int
    pool: object  # rlscale.runner.rl.advantages.PromptPool: history, retired prompts, epoch queue and RNG
    rollouts: int = 0
    tokens: int = 0
    gpu_hours: float = 0.0
    max_staleness: int = 0
    dropped_batches: int = 0
    records: list[dict] = field(default_factory=list)  # the steps since the previous checkpoint


def run_job(
    recipe,
    *,
    run_key: str,
    on_records: Callable[[list[dict]], None],
    resume: bool = True,
    ray_address: str | None = None,
    generator=None,
    trainer=None,
    progress: Callable[[dict], None] | None = None,
    should_stop: Callable[[], str | None] | None = None,
    until_step: int | None = None,
    gpu_hours: float | None = None,
) -> dict:
    """Train `recipe` to `until_step` (default recipe.steps; with planned `gpu_hours`, device-hours, to the step nearest
    them, up to COMPUTE_STEP_CAP x recipe.steps); returns a summary (steps, gpu_hours, busy, staleness, timings)."""
    import ray
    from rlscale.runner.ray_head import connect, disconnect

    joined = not ray.is_initialized()
    head = connect(ray_address, cpus=recipe.generator_devices + recipe.trainer_devices) if joined else None
    cap = step_cap(recipe, gpu_hours)
    job = _Job(
        recipe,
        run_key,
        on_records,
        progress or (lambda info: None),
        should_stop,
        until_step=min(until_step or cap, cap),
        gpu_hours=gpu_hours,
    )
    try:
        return job.run(resume, generator, trainer)
    finally:
        job.release(keep_generator=generator is not None, keep_trainer=trainer is not None)
        if joined:
            disconnect(head)


def batch_seed(recipe, step: int) -> int:
    """vLLM seed of step `step`'s batch; prompt i uses seed + i*n.. (disjoint across steps and from validation)."""
    return (recipe.seed * 1_000_000 + step) * recipe.total_batch


class _Job:
    def __init__(self, recipe, run_key, on_records, progress, should_stop, until_step, gpu_hours=None):
        from rlscale.runner.builtin.local import resolve_model_dir
        from rlscale.runner.rl.tasks import make_task

        self.recipe = recipe
        self.run_key = run_key
        self.on_records = on_records
        self.progress = progress
        self.should_stop = should_stop
        self.until_step = until_step  # the last step of this call: recipe.steps, or a pause point
        # planned compute: end at the step nearest it (None: at until_step); the run's first record is step 0 at
        # no compute, since the clock starts once the actors are ready
        self.stop = ComputeStop(gpu_hours, origin=(0, 0.0))
        self.model_dir = resolve_model_dir(recipe)  # builds the tiny policy on first use, before any actor reads it
        self.task = make_task(recipe)
        self.end_of_thinking = getattr(self.task, "end_of_thinking", None)  # tasks without one: interrupt = truncate
        self.generator = self.trainer = None
        self.gen_intervals: list[tuple[float, float]] = []  # generator busy (batches, evals, weight loads)
        self.train_intervals: list[tuple[float, float]] = []
        self.timings = {"generate": 0.0, "train": 0.0, "weight_sync": 0.0, "eval": 0.0}
        self.pending_evals: dict[int, object] = {}  # step -> ObjectRef of its validation Generation
        self.pushes: list = []  # weight-load refs, checked at each flush so a failed load is not silent

    def run(self, resume: bool, generator, trainer) -> dict:
        import ray
        from rlscale.runner.builtin.generator import create_generator
        from rlscale.runner.builtin.trainer import create_trainer

        if trainer is not None:
            ray.get(trainer.reset.remote(self.recipe))  # base policy, new optimizer, this recipe's seed (~0.1 s)
        self.trainer = trainer or create_trainer(self.recipe, self.model_dir)
        self.generator = generator or create_generator(self.recipe, self.model_dir)
        if not resume:
            checkpoint.clear(self.run_key)
        saved = checkpoint.load_latest(self.run_key)
        if saved is None:
            from rlscale.runner.rl.advantages import PromptPool

            state = JobState(
                step=0,
                pool=PromptPool(
                    self.task.train, retire_above=self.recipe.no_positive_resampling, seed=self.recipe.seed
                ),
            )
            ray.get(self.trainer.stats.remote())  # the trainer has loaded the base policy
            self._push(self.generator.load_base.remote(str(self.model_dir)) if generator else None)
        else:
            trainer_state, state = saved
            ray.get(self.trainer.load_state.remote(trainer_state))
            self._push(self.generator.update_weights.remote(self.trainer.weights.remote(), state.step))
            if state.records:
                self.on_records(state.records)  # re-emitted identically: the store drops steps it already has
        ray.get(self.generator.ready.remote())
        ray.get(self.pushes)
        resumed_from = self.resumed_from = state.step
        self.state = state
        state.records = []
        devices = self.recipe.generator_devices + self.recipe.trainer_devices
        self.clock = DeviceClock(devices, hours_before=state.gpu_hours)
        if state.step == 0:
            self._submit_eval(0)
            self._add_record(0, {}, wall=self.clock.started)
        stopped = self._loop()
        wall = time.time() - self.clock.started
        gen_busy, train_busy = union_seconds(self.gen_intervals), union_seconds(self.train_intervals)
        return {
            "steps": self.state.step,
            "resumed_from": resumed_from,
            "gpu_hours": self.state.gpu_hours,
            "rollouts": self.state.rollouts,
            "tokens": self.state.tokens,
            "wall_seconds": wall,
            "busy_seconds": union_seconds(self.gen_intervals + self.train_intervals),
            "generator_busy": gen_busy / wall if wall else 0.0,
            "trainer_busy": train_busy / wall if wall else 0.0,
            "max_staleness": self.state.max_staleness,
            "dropped_batches": self.state.dropped_batches,
            "timings": dict(self.timings),
            "stopped": stopped is not None,
            "stop_reason": stopped or "",
            "compute_reached": self.stop.reached,
        }

    def release(self, keep_generator: bool, keep_trainer: bool) -> None:
        import ray

        for actor in (None if keep_trainer else self.trainer, None if keep_generator else self.generator):
            if actor is not None:
                ray.kill(actor)

    def _loop(self) -> str | None:
        import ray

        recipe, state = self.recipe, self.state
        lookahead = recipe.max_staleness + 1 if recipe.async_mode == "pipeline" else 1
        inflight: deque = deque()
        next_step = state.step + 1
        last = self.until_step
        while state.step < last:
            while len(inflight) < lookahead and next_step <= last:
                inflight.append(self._submit_batch(next_step))
                next_step += 1
            step = state.step + 1
            prompts, ref = inflight.popleft()
            generation = ray.get(ref)
            staleness = step - 1 - generation.weights_version
            while staleness > recipe.max_staleness:  # too old to use: regenerate from newer weights
                state.dropped_batches += 1
                generation = ray.get(self._submit_batch(step, prompts)[1])
                staleness = step - 1 - generation.weights_version
            self._note_generation(generation, "generate")
            rewards = [[self.task.verify(p, r.text) for r in group] for p, group in zip(prompts, generation.rollouts)]
            for prompt, prompt_rewards in zip(prompts, rewards):
                state.pool.record(prompt, prompt_rewards)
            trained = self.trainer.train.remote(generation.prompt_ids, generation, rewards)
            # queued behind the step (actors run calls in order): no driver round trip (~10 ms idle a step on CPU)
            self._push(self.generator.update_weights.remote(self.trainer.weights.remote(), step))
            result = ray.get(trained)
            now = time.time()
            self.train_intervals.append((result["started"], result["ended"]))
            self.timings["train"] += result["ended"] - result["started"]
            if self._reaches_compute(step, now):
                last = step
            if recipe.is_eval_step(step) or step == last:
                self._submit_eval(step)
            state.step = step
            state.rollouts += sum(len(group) for group in generation.rollouts)
            state.tokens += generation.tokens
            state.max_staleness = max(state.max_staleness, staleness)
            metrics = result["metrics"] | {
                "truncation_rate": generation.truncation_rate,
                "staleness": staleness,
                "weights_version": generation.weights_version,
                "active_prompts": state.pool.active,
                "retired_prompts": len(state.pool.retired),
                "dropped_batches": state.dropped_batches,
            }
            self._add_record(step, metrics, wall=now)
            self._collect_evals(wait_upto=None)
            if step % recipe.checkpoint_every == 0 or step == last:
                self._flush()
                reason = self._uncharged(self.should_stop) if self.should_stop else None
                if reason:
                    return reason
        return None

    def _reaches_compute(self, step: int, now: float) -> bool:
        if not self.stop.reaches(step, self.clock.hours_at(now)):
            return False  # an upper bound: running validations are still charged in it
        self._collect_evals(wait_upto=step - 1)
        self.stop.reached = self.stop.reaches(step, self.clock.hours_at(now))
        return self.stop.reached

    def _submit_batch(self, step: int, prompts=None):
        prompts = prompts or self.state.pool.sample(self.recipe.prompts_per_batch)
        return prompts, self._generate(prompts, n=self.recipe.rollouts, seed=batch_seed(self.recipe, step))

    def _submit_eval(self, step: int) -> None:
        recipe = self.recipe
        prompts = self.task.validation(recipe.eval_prompts)
        seed = (EVAL_SEED_BASE + recipe.seed * 1_000_000 + step) * len(prompts) * recipe.eval_samples
        # only the texts are scored: no log-probs
        self.pending_evals[step] = prompts, self._generate(prompts, n=recipe.eval_samples, seed=seed, logprobs=False)

    def _generate(self, prompts, *, n: int, seed: int, logprobs: bool = True):
        """The ref of the generator's `n` samples per prompt, at the recipe's temperature and length control."""
        return self.generator.generate.remote(
            [p.text for p in prompts],
            n=n,
            temperature=self.recipe.temperature,
            max_new_tokens=self.recipe.max_new_tokens,
            length_control=self.recipe.length_control,
            end_of_thinking=self.end_of_thinking,
            seed=seed,
            logprobs=logprobs,
        )

    def _collect_evals(self, wait_upto: int | None) -> None:
        import ray

        for step in sorted(self.pending_evals):
            prompts, ref = self.pending_evals[step]
            if wait_upto is None or step > wait_upto:
                if not ray.wait([ref], timeout=0)[0]:
                    continue
            generation = ray.get(ref)
            del self.pending_evals[step]
            self._note_generation(generation, "eval")
            self.clock.exclude(generation.started, generation.ended)
            rewards = [self.task.verify(p, r.text) for p, group in zip(prompts, generation.rollouts) for r in group]
            val_reward = sum(rewards) / len(rewards)
            for record in self.state.records:
                if record["step"] == step:
                    record["val_reward"] = val_reward
            self.progress(
                {
                    "step": self.state.step,
                    "val_step": step,
                    "val_reward": val_reward,
                    "gpu_hours": self.clock.hours_at(time.time()),
                }
            )

    def _note_generation(self, generation, kind: str) -> None:
        self.gen_intervals.append((generation.started, generation.ended))
        self.timings[kind] += generation.ended - generation.started

    def _push(self, ref) -> None:
        if ref is not None:
            self.pushes.append(ref)

    def _add_record(self, step: int, metrics: dict, *, wall: float) -> None:
        state = self.state
        self.state.records.append(
            {
                "step": step,
                "gpu_hours": None,
                "rollouts": state.rollouts,
                "tokens": state.tokens,
                "val_reward": None,
                "metrics": metrics,
                "_wall": wall,
            }
        )
        self.progress(
            {
                "step": step,
                "gpu_hours": self.clock.hours_at(wall),
                "rollouts": state.rollouts,
                "train_reward": metrics.get("train_reward"),
                "staleness": metrics.get("staleness"),
            }
        )

    def _flush(self) -> None:
        import ray

        state = self.state
        self._collect_evals(wait_upto=state.step)
        for load in ray.get(self.pushes):
            self.gen_intervals.append(load)
            self.timings["weight_sync"] += load[1] - load[0]
        self.pushes = []
        # every validation that overlapped these steps has finished, so their device-hours are final
        for record in state.records:
            record["gpu_hours"] = self.clock.hours_at(record.pop("_wall"))
        state.gpu_hours = state.records[-1]["gpu_hours"]
        checkpoint.save(self.run_key, state.step, ray.get(self.trainer.state.remote()), state)  # carries the records
        records, state.records = state.records, []
        self._uncharged(self.on_records, records)

    def _uncharged(self, call, *args):
        # a store outage the driver waits out is a fault, not charged (docs/troubleshooting.md)
        started = time.time()
        try:
            return call(*args)
        finally:
            self.clock.exclude(started, time.time())
