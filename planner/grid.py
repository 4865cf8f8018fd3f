"""IsoCompute grids: spread one compute level over prompts_per_batch (B_p), rollouts (n) and steps (M).
Every point gets the same compute, so M = floor(per-run compute / cost per step); all functions are pure."""

import bisect
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from rlscale.planner.cost import Profile, run_gpu_hours, step_gpu_hours, steps_within

from rlscale.base.errors import UserError
from rlscale.base.names import MAX_GRID_POINTS, MAX_STEPS

DEFAULT_PROMPTS = (32, 64, 128)
DEFAULT_ROLLOUTS = (8, 16, 32)


@dataclass(frozen=True)
class Point:
    """One run of the grid: B_p, n, M and its compute."""

    prompts_per_batch: int
    rollouts: int
    steps: int
    gpu_hours: float
    total_rollouts: int


@dataclass(frozen=True)
class Dropped:
    """A (B_p, n) combination left out of the plan, and why."""

    prompts_per_batch: int
    rollouts: int
    reason: str


@dataclass(frozen=True)
class IsoComputePlan:
    """Points at one compute level; budget and per-run compute in GPU-hours."""

    points: list[Point]
    dropped: list[Dropped]
    budget_gpu_hours: float
    per_run_gpu_hours: float
    profile: str
    max_batch: int | None
    min_steps: int

    @property
    def total_gpu_hours(self) -> float:
        """What the planned points spend together, in GPU-hours."""
        return sum(p.gpu_hours for p in self.points)

    def to_json(self) -> dict:
        """The `rlscale plan --json` payload (docs/methods.md section 7)."""
        return {
            "points": [asdict(p) for p in self.points],
            "budget_gpu_hours": self.budget_gpu_hours,
            "per_run_gpu_hours": self.per_run_gpu_hours,
            "total_gpu_hours": self.total_gpu_hours,
            "profile": self.profile,
            "max_batch": self.max_batch,
            "min_steps": self.min_steps,
            "dropped": [asdict(d) for d in self.dropped],
        }


def parse_axis(text: str, *, option: str) -> list[int]:
    """Positive ints from '32,64,128' or a doubling-style range '8,16,...,2048' (ratio from the first two)."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts:
        raise UserError("expected a comma-separated list of positive integers, got nothing", field=option)
    if "..." in parts:
        if len(parts) != 4 or parts[2] != "...":
            raise UserError(f"expected 'a,b,...,z' for a range, got {text!r}", field=option)
        first, second, last = (_positive_int(p, option) for p in (parts[0], parts[1], parts[3]))
        if second <= first or second % first:
            raise UserError(f"a range 'a,b,...,z' needs b a multiple of a greater than a, got {text!r}", field=option)
        values, ratio = [first], second // first
        while values[-1] * ratio <= last:
            values.append(values[-1] * ratio)
        return values
    values = [_positive_int(p, option) for p in parts]
    if len(set(values)) != len(values):
        raise UserError(f"duplicate value in {text!r}", field=option)
    return sorted(values)


def _positive_int(text: str, option: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UserError(f"expected a positive integer, got {text!r}", field=option) from None
    if value <= 0:
        raise UserError(f"expected a positive integer, got {value}", field=option)
    return value


def batch_grid(prompts: Sequence[int], rollouts: Sequence[int], max_batch: int | None = None) -> list[tuple[int, int]]:
    """All (B_p, n) with B_p * n <= max_batch (no limit if None), B_p-major order."""
    return [(bp, n) for bp in prompts for n in rollouts if max_batch is None or bp * n <= max_batch]


def allocate(
    step_costs: Sequence[float],
    budget: float,
    *,
    per_run: bool,
    min_steps: int = 1,
    startup: float = 0.0,
    replicas: int = 1,
    field: str = "budget",
    file: str | None = None,
) -> tuple[float, list[int | None]]:
    """(per-run compute, steps per point or None if dropped), every kept point at the same compute; keeps the
    largest group of cheapest points (ties together) that all reach `min_steps`."""
    if budget <= 0:
        raise ValueError("budget must be positive")
    if step_costs:
        cheapest = min(step_costs)
        most = (budget - startup) / cheapest  # the cheapest point's steps with the whole budget (an upper bound)
        if most / (1 if per_run else replicas * len(step_costs)) > MAX_STEPS:
            raise UserError(
                f"a budget of {budget:g} gives a run about {most:.3g} steps; expected at most {MAX_STEPS:,} "
                "(is the unit right?)",
                file=file,
                field=field,
            )
    order = sorted(range(len(step_costs)), key=lambda i: step_costs[i])
    costs = [step_costs[i] for i in order]
    kept = 0
    for k in range(len(costs), 0, -1):
        if k < len(costs) and costs[k] == costs[k - 1]:
            continue  # never split a tie
        share = budget if per_run else budget / (k * replicas)
        if steps_within(share, costs[k - 1], startup) >= min_steps:
            kept = k
            break
    share = budget if per_run or kept == 0 else budget / (kept * replicas)
    steps: list[int | None] = [None] * len(step_costs)
    for i in order[:kept]:
        steps[i] = steps_within(share, step_costs[i], startup)
        if steps[i] > MAX_STEPS:
            raise UserError(
                f"a budget of {budget:g} gives a run {steps[i]:.3g} steps; expected at most {MAX_STEPS:,} "
                "(is the unit right?)",
                file=file,
                field=field,
            )
    return share, steps


def isocompute_plan(
    budget_gpu_hours: float,
    prompts: Sequence[int] = DEFAULT_PROMPTS,
    rollouts: Sequence[int] = DEFAULT_ROLLOUTS,
    *,
    profile: Profile,
    max_batch: int | None = None,
    per_run: bool = False,
    min_steps: int = 1,
) -> IsoComputePlan:
    """The IsoCompute grid over prompts x rollouts at one compute level (GPU-hours of `profile`)."""
    if not budget_gpu_hours > 0 or budget_gpu_hours == float("inf"):
        raise UserError(f"expected a positive number of GPU-hours, got {budget_gpu_hours}", field="--budget")
    if not prompts or not rollouts:
        raise UserError("expected at least one value on each axis", field="--prompts" if not prompts else "--rollouts")
    if any(v <= 0 for v in (*prompts, *rollouts)):
        raise UserError("axis values must be positive integers", field="--prompts/--rollouts")
    if len(prompts) * len(rollouts) > MAX_GRID_POINTS:  # before any work: memory and time grow with the grid
        raise UserError(
            f"{len(prompts):,} B_p values x {len(rollouts):,} n values = {len(prompts) * len(rollouts):,} "
            f"combinations; expected at most {MAX_GRID_POINTS:,}",
            field="--prompts/--rollouts",
        )
    if max_batch is not None and max_batch <= 0:
        raise UserError(f"expected a positive integer, got {max_batch}", field="--max-batch")
    if min_steps < 1:
        raise UserError(f"expected a positive integer, got {min_steps}", field="--min-steps")
    grid = batch_grid(prompts, rollouts, max_batch)
    in_grid = set(grid)
    dropped = [
        Dropped(bp, n, f"B_p * n = {bp * n} exceeds --max-batch {max_batch}")
        for bp in prompts
        for n in rollouts
        if (bp, n) not in in_grid
    ]
    if not grid:
        raise UserError(f"no (B_p, n) combination fits within --max-batch {max_batch}", field="--max-batch")
    costs = [step_gpu_hours(profile, bp, n) for bp, n in grid]
    share, steps = allocate(
        costs,
        budget_gpu_hours,
        per_run=per_run,
        min_steps=min_steps,
        startup=profile.startup_gpu_hours,
        field="--budget",
    )
    sorted_costs = sorted(costs)  # points at most as costly as a dropped one, by bisection (linear overall)
    points = []
    for (bp, n), cost, m in zip(grid, costs, steps):
        if m is None:
            need = profile.startup_gpu_hours + min_steps * cost
            with_it = share if per_run else budget_gpu_hours / bisect.bisect_right(sorted_costs, cost)
            why = f"{min_steps} step(s) need {need:.4g} GPU-hours; with it in the grid a run would get {with_it:.4g}"
            dropped.append(Dropped(bp, n, why))
        else:
            points.append(Point(bp, n, m, run_gpu_hours(profile, bp, n, m), bp * n * m))
    if not points:
        cheapest = min(costs)
        need = profile.startup_gpu_hours + min_steps * cheapest
        raise UserError(
            f"no point reaches {min_steps} step(s): the cheapest needs {need:.4g} GPU-hours per run", field="--budget"
        )
    total_budget = share * len(points) if per_run else budget_gpu_hours
    return IsoComputePlan(points, dropped, total_budget, share, profile.name, max_batch, min_steps)
