"""Job checkpoints under cache_dir()/checkpoints/<run_key>: trainer state + the driver's job state, written atomically.
`LATEST` moves only after a step directory is fully written, so a job killed mid-save resumes from the previous one."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ray import cloudpickle  # the prompt pool holds a lambda (its key function), which plain pickle refuses

from rlscale.base.settings import cache_dir

KEEP = 2  # checkpoints kept per run: the newest and one fallback


def checkpoint_root(run_key: str) -> Path:
    """The run's checkpoint directory (not created)."""
    return cache_dir() / "checkpoints" / run_key


def save(run_key: str, step: int, trainer_state: bytes, job_state: dict) -> Path:
    """Write checkpoint `step` and point LATEST at it; returns its directory."""
    root = checkpoint_root(run_key)
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root))
    (staging / "trainer.pt").write_bytes(trainer_state)
    (staging / "job.pkl").write_bytes(cloudpickle.dumps(job_state))
    target = root / f"step-{step:06d}"
    if target.exists():  # a re-save of the same step after a resume
        shutil.rmtree(target)
    os.replace(staging, target)
    latest = root / ".LATEST.tmp"
    latest.write_text(target.name)
    os.replace(latest, root / "LATEST")  # the commit point
    for old in sorted(root.glob("step-*"))[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    return target


def load_latest(run_key: str) -> tuple[bytes, dict] | None:
    """(trainer state blob, job state) of the newest complete checkpoint, or None if the run has none."""
    root = checkpoint_root(run_key)
    pointer = root / "LATEST"
    if not pointer.is_file():
        return None
    directory = root / pointer.read_text().strip()
    return (directory / "trainer.pt").read_bytes(), cloudpickle.loads((directory / "job.pkl").read_bytes())


def clear(run_key: str) -> None:
    """Delete every checkpoint of the run (a fresh start)."""
    shutil.rmtree(checkpoint_root(run_key), ignore_errors=True)
