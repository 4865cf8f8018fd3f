"""The engine interface: what the sweep driver asks of whatever trains a run, and the registry of engines by name.

An engine starts a run, or resumes it from its last checkpoint, trains it up to a step, streams its records back
through a callback (the driver stores them: it is the store's one writer), asks a callback whether to stop at
each checkpoint, and releases what it holds on `close`. The sweep driver talks to nothing else, so a second
engine is one more class and one more line in ENGINES; which one a run uses is its recipe's `engine` key.
"""

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

from rlscale.base.errors import UserError

DEFAULT_ENGINE = "builtin"
COMPUTE_STEP_CAP = 10  # a run stopped by compute takes at most this many times its planned steps (a runaway guard)
# engine name -> "module:class"; imported on first use, so torch, Ray or vLLM load only when a run starts
ENGINES = {
    "builtin": "rlscale.runner.builtin.engine:BuiltinEngine",
    "verl": "rlscale.runner.verl.engine:VerlEngine",
    "trl": "rlscale.runner.trl.engine:TrlEngine",
}


@dataclass
class JobResult:
    """How one call of Engine.run ended.

    steps: the last step reached (and checkpointed); below the recipe's steps means paused or stopped.
    stopped: should_stop gave `stop_reason` and the run ended there.
    compute_reached: the run ended at its planned compute (Engine.run's gpu_hours): it is finished, whatever its steps.
    busy_seconds: wall seconds some part of the engine was generating or training (for overhead accounting).
    timings: seconds by phase (engine-specific names), summed over a sweep by the driver.
    """

    steps: int
    stopped: bool = False
    compute_reached: bool = False
    stop_reason: str = ""
    busy_seconds: float = 0.0
    timings: dict = field(default_factory=dict)


def step_cap(recipe, gpu_hours: float | None) -> int:
    """The last step a run may reach: its planned steps, or COMPUTE_STEP_CAP x them when its planned compute
    `gpu_hours` ends it (the step count then follows from the measured compute)."""
    return recipe.steps * (COMPUTE_STEP_CAP if gpu_hours else 1)


def reaches_compute(spent: float, per_step: float, target: float) -> bool:
    """Whether a run that has spent `spent` device-hours, `per_step` a step, ends at this step: the step whose
    measured compute is nearest its planned `target` (ending here is nearer it than after one more step)."""
    return spent + per_step / 2 >= target


class DevicesUnavailable(RuntimeError):
    """A job could not start because the devices it was admitted on were taken meanwhile (e.g. by another user's
    job, as verl's `Total available GPUs X is less than total desired GPUs Y`). The sweep puts the run back in its
    queue without counting an attempt."""


class Engine(ABC):
    """Trains runs. One engine serves a whole sweep (it may keep workers alive from one run to the next).

    A sweep with several runs in flight calls `run` from one thread per run, for different run keys at once:
    an engine keeps per-run state local to the call (or under a lock) and shares only what is safe to share.
    """

    name: str = ""

    @abstractmethod
    def run(
        self,
        recipe,
        *,
        run_key: str,
        on_records: Callable[[list[dict]], None],
        until_step: int | None = None,
        should_stop: Callable[[], str | None] | None = None,
        progress: Callable[[dict], None] | None = None,
        gpu_hours: float | None = None,
        resume_gpu_hours: Callable[[int], float | None] | None = None,
    ) -> JobResult:
        """Train `recipe` (rlscale.planner.recipe.Recipe) under the checkpoint name `run_key`, resuming from its last
        checkpoint if there is one, until `until_step` (default recipe.steps), where it evaluates and checkpoints.

        on_records(records): dicts {step, gpu_hours, rollouts, tokens, val_reward (None between evals), metrics},
            handed over after each checkpoint; after a resume some may come again (the store drops repeats).
        should_stop(): asked after each checkpoint; a reason ends the run there (JobResult.stopped).
        progress(info): live updates {step, gpu_hours, val_reward, ...} between checkpoints, for display only.
        gpu_hours: the run's planned compute (measured device-hours); the run then ends at the step whose measured
            compute is nearest it (the step count follows from the compute; recipe.steps is the plan's estimate).
        resume_gpu_hours(step): the run's compute at `step` as the store holds it (None: no record), where a job
            resuming from that step's checkpoint starts its meter, so work lost after the checkpoint is not charged
            (an engine whose checkpoints carry their compute needs none).
        Raises when the run crashes; the driver decides whether to retry.
        """

    def devices(self, recipe) -> list[dict[str, float]]:
        """What one job of `recipe` holds while it runs, as Ray resources, one bundle per node (two 8-GPU nodes:
        [{"GPU": 8}, {"GPU": 8}]). The sweep starts a job only when every bundle fits on a node's free devices.
        Default: one node holding the generator's and the trainer's devices as GPUs."""
        return [{"GPU": float(recipe.generator_devices + recipe.trainer_devices)}]

    def nodes(self) -> list | None:
        """The cluster's alive nodes with their total and free devices (rlscale.runner.cluster.Node), or None when
        the engine cannot see them (then only --max-concurrent bounds the sweep)."""
        return None

    def close(self) -> None:
        """Release everything the engine holds (workers, clusters it started). Idempotent."""


def study_engine(study, name: str, **options) -> Engine:
    """The engine `name` for a run of `study`: a study that starts from the user's own verl or TRL setup hands the
    engine its SetupPlan (rlscale.planner.frameworks.setup) as the `setup` option."""
    if getattr(study, "setup", None) is not None and name in ("verl", "trl"):
        from rlscale.planner.frameworks.setup import setup_plan

        options.setdefault("setup", setup_plan(study))
    return get_engine(name, **options)


def get_engine(name: str = DEFAULT_ENGINE, **options) -> Engine:
    """The engine registered as `name`, made with `options`; UserError naming the known engines if there is none."""
    if name not in ENGINES:
        raise UserError(f"unknown engine {name!r}; expected one of: {', '.join(sorted(ENGINES))}", field="engine")
    module, cls = ENGINES[name].split(":")
    return getattr(importlib.import_module(module), cls)(**options)
