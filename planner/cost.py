"""Cost model: GPU-hours of a run = startup + steps * (step overhead + per-rollout cost * B_p * n); pure functions.
Overhead is what does not scale with B_p * n (weight sync, scheduling, validation); startup is paid once a run."""

import math

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from rlscale.base.errors import UserError


class Profile(BaseModel):
    """A hardware/model cost profile; costs in GPU-hours (device-hours on a CPU-only host)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    gpu_hours_per_rollout: float = Field(ge=0, description="GPU-hours per rollout of a training step")
    step_overhead_gpu_hours: float = Field(0.0, ge=0, description="GPU-hours per step independent of B_p * n")
    startup_gpu_hours: float = Field(0.0, ge=0, description="GPU-hours paid once per run before step 1")
    description: str = ""
    calibrated_on: str = Field("", description="what the costs were measured on: host, date, study and runs")


# ScaleRL (Khatri et al. 2025): 8B, 16k context, 100k GPU-hours for ~7,400 steps at 48 x 16; overhead is noise there
SCALERL_8B = Profile(
    name="scalerl-8b",
    gpu_hours_per_rollout=100_000 / (7_400 * 48 * 16),
    description="ScaleRL's published scale: 8B model, 16k context, H100-class GPUs",
)

# calibrated: 0.060 device-s/step + 1.76 ms/rollout; startup 0 as the clock starts once engine and trainer are up
TINY_CPU = Profile(
    name="tiny-cpu",
    gpu_hours_per_rollout=4.89054e-07,
    step_overhead_gpu_hours=1.66114e-05,
    startup_gpu_hours=0.0,
    description="embedded tiny policy on a 2-core CPU host (device-hours; calibrated on the quickstart)",
    calibrated_on=(
        "bench/sweep_overhead.py records of studies/quickstart.yaml as of 2026-11-21 (B_p 32/64 x n 4/8, "
        "159-341 steps), one 2-core x86_64 host, no GPU; an estimate of steps only: runs stop at measured "
        "compute (2026-11-23, B_p 16: n = 4, 8 took 727 and 442 steps for 730 and 441 planned, n = 2 "
        "took 1,531 for 1,084)"
    ),
)

BUILTIN_PROFILES: dict[str, Profile] = {p.name: p for p in (SCALERL_8B, TINY_CPU)}
DEFAULT_PROFILE = SCALERL_8B.name


def step_gpu_hours(profile: Profile, prompts_per_batch: int, rollouts: int) -> float:
    """GPU-hours of one training step at B_p prompts x n rollouts."""
    return profile.step_overhead_gpu_hours + profile.gpu_hours_per_rollout * prompts_per_batch * rollouts


def run_gpu_hours(profile: Profile, prompts_per_batch: int, rollouts: int, steps: int) -> float:
    """GPU-hours of a whole run: startup plus `steps` steps."""
    return profile.startup_gpu_hours + steps * step_gpu_hours(profile, prompts_per_batch, rollouts)


def steps_within(budget: float, cost_per_step: float, startup: float = 0.0) -> int:
    """The most steps whose cost (startup + steps * cost_per_step) fits in `budget` (same unit); 0 if none."""
    if cost_per_step <= 0:
        raise ValueError("cost per step must be positive")
    # a hair of slack so that e.g. 3 * (1/3) == 1 is not floored to 2 by rounding
    return max(0, math.floor((budget - startup) / cost_per_step * (1 + 1e-12)))


class CalibrationQuality(BaseModel):
    """How well the linear per-step cost explains the measured steps."""

    model_config = ConfigDict(frozen=True)

    r2: float = Field(description="coefficient of determination of per-step cost on B_p * n")
    relative_residual: float = Field(description="RMS residual / mean per-step cost")
    n_runs: int
    n_intervals: int = Field(description="record-to-record intervals used")
    warnings: list[str] = Field(
        default_factory=list,
        description="codes: poor_fit (R^2 below R2_WELL_EXPLAINED), negative_cost_clipped (a coefficient fitted below "
        "0 was set to 0)",
    )


R2_WELL_EXPLAINED = 0.9  # below it, per-step cost is not well explained by B_p * n: calibrate warns
R2_USABLE = 0.5  # below it, a decision prices steps with the study's profile instead of this calibration


def calibrate(
    records: pd.DataFrame, runs: pd.DataFrame, *, name: str, calibrated_on: str = ""
) -> tuple[Profile, CalibrationQuality]:
    """A Profile fitted by least squares of record-to-record interval costs on B_p * n, and its quality; UserError
    when the data cannot identify both coefficients."""
    missing = {"run_id", "step", "gpu_hours"} - set(records.columns)
    if missing:
        raise UserError(f"records lack column(s) {', '.join(sorted(missing))}")
    batch = _batch_by_run(runs)
    spans, batches, costs, firsts = [], [], [], []
    for run_id, group in records.dropna(subset=["step", "gpu_hours"]).groupby("run_id"):
        if run_id not in batch:
            continue
        group = group.sort_values("step")
        step = group["step"].to_numpy(float)
        hours = group["gpu_hours"].to_numpy(float)
        d_step, d_hours = np.diff(step), np.diff(hours)
        keep = d_step > 0
        spans.append(d_step[keep])
        costs.append(d_hours[keep])
        batches.append(np.full(keep.sum(), batch[run_id], float))
        firsts.append((step[0], hours[0], batch[run_id]))
    if not spans or sum(len(s) for s in spans) < 2:
        raise UserError("calibration needs at least two record-to-record intervals of measured steps")
    span, x, interval_cost = np.concatenate(spans), np.concatenate(batches), np.concatenate(costs)
    if np.ptp(x) == 0:
        raise UserError(
            f"every run has B_p * n = {int(x[0])}: per-step overhead and per-rollout cost cannot be separated; "
            "calibrate on a study with at least two batch sizes"
        )
    # interval cost = span * overhead + span * x * per_rollout: linear in the two coefficients
    design = np.column_stack([span, span * x])
    (overhead, per_rollout), *_ = np.linalg.lstsq(design, interval_cost, rcond=None)
    per_step = interval_cost / span
    fitted = overhead + per_rollout * x
    residual = per_step - fitted
    total = np.sum((per_step - per_step.mean()) ** 2)
    r2 = 1.0 - np.sum(residual**2) / total if total > 0 else 1.0
    relative = float(np.sqrt(np.mean(residual**2)) / per_step.mean()) if per_step.mean() > 0 else float("inf")
    startups = [hours - step * (overhead + per_rollout * b) for step, hours, b in firsts]
    profile = Profile(
        name=name,
        gpu_hours_per_rollout=max(float(per_rollout), 0.0),
        step_overhead_gpu_hours=max(float(overhead), 0.0),
        startup_gpu_hours=max(float(np.mean(startups)), 0.0),
        description=f"calibrated on {len(firsts)} runs, {len(x)} intervals",
        calibrated_on=calibrated_on or f"{len(firsts)} runs, {len(x)} record intervals (host not given)",
    )
    warnings = [
        code
        for code, bad in (
            ("poor_fit", r2 < R2_WELL_EXPLAINED),
            ("negative_cost_clipped", min(overhead, per_rollout, float(np.mean(startups))) < 0),
        )
        if bad
    ]
    return profile, CalibrationQuality(
        r2=float(r2), relative_residual=relative, n_runs=len(firsts), n_intervals=len(x), warnings=warnings
    )


def _batch_by_run(runs: pd.DataFrame) -> dict:
    out = {}
    for row in runs.to_dict("records"):
        config = row.get("config") or {}
        try:
            out[row["run_id"]] = int(config["prompts_per_batch"]) * int(config["rollouts"])
        except (KeyError, TypeError, ValueError):
            continue  # a run without batch geometry cannot inform the fit
    return out
