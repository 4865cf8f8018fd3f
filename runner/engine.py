"""The engine interface: what the sweep driver asks of whatever trains a run, and the registry of engines by name.
The driver talks to nothing else; a run's recipe `engine` key picks its engine."""

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
    """How one call of Engine.run ended; steps below the recipe's mean paused or stopped, unless compute_reached."""

    steps: int  # the last step reached (and checkpointed)
    stopped: bool = False  # should_stop gave `stop_reason` and the run ended there
    compute_reached: bool = False  # it ended at its planned compute: finished, whatever its steps
    stop_reason: str = ""
    busy_seconds: float = 0.0  # wall seconds spent generating or training, for overhead accounting
    timings: dict = field(default_factory=dict)  # seconds by phase (engine-specific names), summed by the driver


def step_cap(recipe, gpu_hours: float | None) -> int:
    """The last step a run may reach: its planned steps, or COMPUTE_STEP_CAP x them when its planned compute
    `gpu_hours` ends it (the step count then follows from the measured compute)."""
    return recipe.steps * (COMPUTE_STEP_CAP if gpu_hours else 1)


@dataclass
class ComputeStop:
    """The one rule for where a run with planned compute `target` (device-hours; None: no stop) ends: at the step
    whose measured compute is nearest it, a step costing the mean since the run's first record `origin`, (step,
    gpu_hours), which holds a job's start-up (None: the first record it is shown). Engines and the driver ask it."""

    target: float | None
    origin: tuple[int, float] | None = None
    reached: bool = False

    def reaches(self, step: int, spent: float) -> bool:
        """Whether the run, at `step` with `spent` device-hours, ends here: ending here is nearer the target than
        after one more step (at the origin no step cost is known yet, so it ends only past the target)."""
        if self.target is None:
            return False
        self.origin = self.origin or (step, spent)
        origin_step, before = self.origin
        per_step = (spent - before) / (step - origin_step) if step > origin_step else 0.0
        return spent + per_step / 2 >= self.target

    def trim(self, records: list[dict]) -> list[dict]:
        """`records` (in step order) up to the first that ends the run: all if none does, none once reached."""
        if self.target is None:
            return records
        if self.reached:
            return []
        for index, record in enumerate(records):
            if self.reaches(int(record["step"]), float(record["gpu_hours"])):
                self.reached = True
                return records[: index + 1]
        return records


class DevicesUnavailable(RuntimeError):
    """A job's admitted devices were taken before it started (verl: `Total available GPUs X is less than total desired
    GPUs Y`): the sweep requeues the run without counting an attempt."""


class Engine(ABC):
    """Trains runs; one engine serves a sweep, `run` called on a thread per run: per-run state stays in the call."""

    name: str = ""

    @abstractmethod
    def run(
        self,
        recipe,
        *,
        run_key: str,
        on_records: Callable[[list[dict]], None],  # after each checkpoint; a resume may repeat some
        until_step: int | None = None,
        should_stop: Callable[[], str | None] | None = None,  # asked at each checkpoint: a reason ends the run there
        progress: Callable[[dict], None] | None = None,  # live updates between checkpoints, for display only
        gpu_hours: float | None = None,  # planned device-hours: the run ends at the step whose compute is nearest
        resume_gpu_hours: Callable[[int], float | None] | None = None,  # a resumed job's meter starts at this
    ) -> JobResult:
        """Train `recipe` under checkpoint name `run_key` from its last checkpoint to `until_step` (default
        recipe.steps), evaluating and checkpointing there; raises when the run crashes (the driver may retry)."""

    def devices(self, recipe) -> list[dict[str, float]]:
        """What one job of `recipe` holds while it runs, as Ray resources, one bundle per node (the sweep starts it when
        every bundle fits). Default: one node holding the generator's and trainer's devices as GPUs."""
        return [{"GPU": float(recipe.generator_devices + recipe.trainer_devices)}]

    def nodes(self) -> list | None:
        """The cluster's alive nodes with their total and free devices (rlscale.runner.cluster.Node), or None when
        the engine cannot see them (then only --max-concurrent bounds the sweep)."""
        return None

    def ended(self, run_key: str, status: str) -> None:
        """Run `run_key` ended for good in the store (done, stopped, failed): end what the engine keeps open for it
        outside its jobs (a tracker run it made). Default: nothing."""

    def close(self) -> None:
        """Release everything the engine holds (workers, clusters it started). Idempotent."""


def study_engine(study, name: str, **options) -> Engine:
    """The engine `name` for `study`'s runs; a study on the user's verl/TRL setup passes its SetupPlan as `setup`."""
    if getattr(study, "setup", None) is not None and name in ("verl", "trl"):
        from rlscale.planner.frameworks.setup import setup_plan

        options.setdefault("setup", setup_plan(study))
    return get_engine(name, **options)


def get_engine(name: str = DEFAULT_ENGINE, **options) -> Engine:
    """The engine registered as `name`, made with `options`; UserError naming the known engines if there is none."""
    if name not in ENGINES:
        raise UserError(f"unknown engine {name!r}; expected one of: {', '.join(sorted(ENGINES))}", field="engine")
    return engine_class(ENGINES[name])(**options)


def engine_class(spec: str) -> type[Engine]:
    """The Engine class at `spec` ("module:Class", as ENGINES holds them)."""
    module, cls = spec.split(":")
    return getattr(importlib.import_module(module), cls)
