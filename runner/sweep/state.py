"""A sweep's runs as the driver and `rlscale status` see them: one RunState per stored run, built in one place
from the store's frames (pure: frames in, states out)."""

import math
from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd
from pydantic import ValidationError
from rlscale.planner.planning import extended, planned_runs
from rlscale.planner.recipe import Recipe

FINISHED = ("done", "failed", "stopped")  # "paused": checkpointed at a rung, resumed when the scheduler says so


@dataclass
class RunState:
    """A sweep's run: identity, recipe, status, progress (last step, latest val reward, device-hours vs planned)."""

    run_id: int
    name: str
    recipe: Recipe | None  # None for a run imported from logs: its config names its source, not a recipe
    seed: int
    planned_gpu_hours: float
    status: str = "pending"
    step: int = 0
    val_reward: float | None = None
    gpu_hours: float = 0.0
    attempts: int = 0
    note: str = ""
    created_at: object = None  # the run row's creation time: part of its checkpoint key
    devices: str = ""  # what a run in flight holds, e.g. "2 GPU" (the live view shows it)

    def to_dict(self) -> dict:
        """The `rlscale status --json` row."""
        return {
            "run_id": self.run_id,
            "run": self.name,
            "seed": self.seed,
            "status": self.status,
            "step": self.step,
            "steps": None if self.recipe is None else self.recipe.steps,
            "val_reward": self.val_reward,
            "gpu_hours": self.gpu_hours,
            "planned_gpu_hours": self.planned_gpu_hours,
            "note": self.note,
        }


def run_states(
    runs: pd.DataFrame, records: pd.DataFrame, planned_gpu_hours: Mapping[str, float], *, extend: float = 1.0
) -> list[RunState]:
    """One RunState per row of `runs` (Store.runs_frame), in order, with progress from `records`; planned_gpu_hours
    maps run names to their plan (NaN for others); a planned run's recipe has its steps times the study's `extend`
    (sweep --extend); the note is the first line of the run's error."""
    by_run = {run_id: rows for run_id, rows in records.groupby("run_id")} if len(records) else {}
    states = []
    for row in runs.to_dict("records"):
        error = row.get("error") if isinstance(row.get("error"), str) else ""  # None or NaN when there is none
        recipe = _recipe(row["config"])
        if recipe is not None and row["run"] in planned_gpu_hours:
            recipe = extended(recipe, extend)
        state = RunState(
            int(row["run_id"]),
            row["run"],
            recipe,
            int(row["seed"]),
            float(planned_gpu_hours.get(row["run"], math.nan)),
            status=row["status"],
            note=error.splitlines()[0] if error else "",
            created_at=row.get("created_at"),
        )
        mine = by_run.get(row["run_id"])
        if mine is not None and len(mine):
            state.step = int(mine["step"].max())
            state.gpu_hours = float(mine["gpu_hours"].max())
            evals = mine["val_reward"].dropna()
            state.val_reward = float(evals.iloc[-1]) if len(evals) else None
        states.append(state)
    return states


def _recipe(config: dict) -> Recipe | None:
    try:
        return Recipe.model_validate(config)
    except ValidationError:
        return None


def run_name(point, several_seeds: bool) -> str:
    """A planned point's run name in the store: the point's name, plus `/s<seed>` when a study has several seeds."""
    return f"{point.name}/s{point.seed}" if several_seeds else point.name


def planned_gpu_hours(study) -> dict[str, float]:
    """Run name -> planned GPU-hours of a study; empty for None (a study imported without a spec has no plan)."""
    if study is None:
        return {}
    return {run_name(point, len(study.seeds) > 1): point.gpu_hours for point in planned_runs(study)}
