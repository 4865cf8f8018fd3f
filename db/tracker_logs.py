"""Tracker runs (read by db/trackers.py) -> the importer's rows; compute is a logged cumulative metric or GPU-hours
from each step's wall time x the run's GPUs, all checked before anything is stored."""

import bisect
import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from rlscale.base.compute import device_hours, held
from rlscale.base.errors import UserError
from rlscale.base.names import run_name_problem


@dataclass
class TrackerRun:
    """One tracker run; `metrics`: metric -> step -> (value, seconds into the run when logged, from run_seconds)."""

    name: str
    run_id: str
    metrics: dict[str, dict[int, tuple[Any, float]]] = field(default_factory=dict)


def run_seconds(segments: list[tuple[float, list[float]]]) -> list[list[float]]:
    """Seconds into the run at each logged time (unix seconds) of each (start, times) segment, in order: a resume counts
    from its own start plus the earlier segments' start-to-last-log spans, so a crash-to-resume gap is not the run's."""
    out, before = [], 0.0
    for start, times in segments:
        out.append([before + max(t - start, 0.0) for t in times])
        before += max([0.0, *(t - start for t in times)])
    return out


def tracker_frame(
    runs: list[TrackerRun], *, source: str, reward: str | None, compute: str | None, gpus: float | None
) -> pd.DataFrame:
    """Importer rows of every run that logged `reward`, one per step with a reward; attrs `compute_unit`,
    `compute_note` (in words) and `runs_left_out` (runs that never logged the reward)."""
    check_choice(source, reward, compute, gpus)
    if not runs:
        raise UserError("no runs here", file=source)
    _check_names(runs, source)
    kept = [run for run in runs if reward in run.metrics]
    if not kept:
        raise UserError(f"no run logged the metric {reward!r} ({_some_metrics(runs)})", file=source, field="--reward")
    rows = []
    for run in kept:
        where = f"{source}: run {run.name!r}"
        points = sorted(run.metrics[reward].items())
        if compute is not None:
            spent = _cumulative(run, compute, [step for step, _ in points], where)
        else:
            spent = [device_hours(held(gpus, seconds)) for _, (_, seconds) in points]  # the one meter
        for (step, (value, _)), compute_at_step in zip(points, spent):
            rows.append(
                {
                    "run": run.name,
                    "step": step,
                    "compute": compute_at_step,
                    "reward": _number(value, where, step, reward),
                    "rollouts": None,
                    "tokens": None,
                }
            )
    frame = pd.DataFrame(rows)
    for column in ("rollouts", "tokens"):
        frame[column] = frame[column].astype("Int64")
    frame.attrs["compute_unit"] = compute or "gpu_hours"
    frame.attrs["compute_note"] = (
        f"the logged metric {compute!r} (cumulative)"
        if compute is not None
        else f"GPU-hours from each step's wall time x {gpus:g} GPUs (the tracker's timestamps)"
    )
    frame.attrs["runs_left_out"] = [run.name for run in runs if reward not in run.metrics]
    frame.attrs["source"] = source
    return frame


def check_choice(source: str, reward: str | None, compute: str | None, gpus: float | None) -> None:
    """UserError unless the user named the reward metric and exactly one way to the compute."""
    if reward is None:
        raise UserError("name the reward metric with --reward", file=source, field="--reward")
    if (compute is None) == (gpus is None):
        raise UserError(
            "name the compute: --compute METRIC (a logged cumulative metric: GPU-hours, tokens, ...) or --gpus N "
            "(GPU-hours from each step's wall time x N GPUs), one of them",
            file=source,
            field="--compute",
        )
    if gpus is not None and not (math.isfinite(gpus) and gpus > 0):
        raise UserError(f"expected a number of GPUs > 0, got {gpus:g}", file=source, field="--gpus")


def _check_names(runs: list[TrackerRun], source: str) -> None:
    seen: dict[str, str] = {}
    for run in runs:
        problem = run_name_problem(run.name)
        if problem:
            raise UserError(f"run {run.run_id}: its name cannot be stored: {problem}; rename it", file=source)
        if run.name in seen:
            # runs are matched by name within a study, so two tracker runs of one name would merge into one
            raise UserError(
                f"two runs are named {run.name!r} (ids {seen[run.name]} and {run.run_id}): rename one", file=source
            )
        seen[run.name] = run.run_id


def _cumulative(run: TrackerRun, metric: str, steps: list[int], where: str) -> list[float]:
    if metric not in run.metrics:
        raise UserError(f"no metric {metric!r} ({_some_metrics([run])})", file=where, field="--compute")
    logged = {
        step: _number(value, where, step, metric, minimum=0.0) for step, (value, _) in run.metrics[metric].items()
    }
    logged.setdefault(0, 0.0)  # a counter logged every k steps: interpolated between logged steps, from 0
    known = sorted(logged)
    for before, after in zip(known, known[1:]):
        if logged[after] < logged[before]:
            raise UserError(
                f"expected a cumulative metric, but it falls from {logged[before]:g} at step {before} to "
                f"{logged[after]:g} at step {after}",
                file=where,
                field=f"metric {metric!r}",
            )
    out = []
    for step in steps:
        if step > known[-1]:
            raise UserError(
                f"step {step} has a reward, but this metric is logged only up to step {known[-1]}",
                file=where,
                field=f"metric {metric!r}",
            )
        i = bisect.bisect_left(known, step)
        if known[i] == step:
            out.append(logged[step])
        else:
            lo, hi = known[i - 1], known[i]
            out.append(logged[lo] + (logged[hi] - logged[lo]) * (step - lo) / (hi - lo))
    return out


def _number(value: Any, where: str, step: int, metric: str, *, minimum: float | None = None) -> float:
    # trackers write non-finite values as text ("NaN", "Infinity") or null
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"step {step}: expected a finite number, got {value!r}", file=where, field=f"metric {metric!r}")
    if minimum is not None and value < minimum:
        raise UserError(
            f"step {step}: expected a number >= {minimum:g}, got {value!r}", file=where, field=f"metric {metric!r}"
        )
    return float(value)


def _some_metrics(runs: list[TrackerRun], limit: int = 8) -> str:
    names = sorted({name for run in runs for name in run.metrics})
    shown = ", ".join(names[:limit]) + (f", ... ({len(names)} in all)" if len(names) > limit else "")
    return f"metrics logged: {shown}" if names else "no metrics logged"
