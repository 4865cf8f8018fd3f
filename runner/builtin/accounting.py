"""Measured compute: which devices each actor holds, and the device-hours clock of one job.
gpu_hours = (generator + trainer devices) x wall seconds held, minus validation and the driver's checkpoint waits."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from rlscale.base.compute import device_hours, held


@dataclass(frozen=True)
class Placement:
    """Where a job's actors run: GPUs if the cluster has them, else CPU cores (pinned when the host has enough)."""

    on_gpu: bool
    generator_cores: str | None  # vLLM-CPU's VLLM_CPU_OMP_THREADS_BIND, e.g. "0" or "0-1"
    trainer_cores: list[int] | None  # os.sched_setaffinity for the trainer


def placement(recipe) -> Placement:
    """GPUs when Ray sees at least one; else disjoint CPU cores for generator and trainer if this host has enough."""
    import ray

    if ray.cluster_resources().get("GPU", 0) >= 1:
        return Placement(True, None, None)
    cores = sorted(os.sched_getaffinity(0))
    g, t = recipe.generator_devices, recipe.trainer_devices
    if len(cores) < g + t:  # not enough cores to separate them: let the OS share
        return Placement(False, None, None)
    generator = cores[:g]
    return Placement(False, ",".join(map(str, generator)), cores[g : g + t])


def overlap_seconds(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of [start, end] covered by non-overlapping `intervals` (wall-clock pairs)."""
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in intervals)


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by the union of possibly overlapping intervals."""
    total, reach = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


@dataclass
class DeviceClock:
    """Device-hours held by a job since `started` (wall clock), on top of `hours_before` (from a checkpoint)."""

    devices: int
    hours_before: float = 0.0
    started: float = field(default_factory=time.time)
    excluded: list[tuple[float, float]] = field(default_factory=list)  # generator time spent on validation

    def exclude(self, start: float, end: float) -> None:
        """Do not charge the wall interval [start, end] (validation on the generator)."""
        self.excluded.append((start, end))

    def hours_at(self, when: float) -> float:
        """Device-hours charged up to wall time `when`."""
        seconds = when - self.started - overlap_seconds(self.excluded, self.started, when)
        return self.hours_before + device_hours(held(self.devices, seconds))
