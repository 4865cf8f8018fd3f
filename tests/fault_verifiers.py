"""Verifiers that crash on purpose, named from study files as `fault_verifiers:<name>` (tests/ on the path).
A custom verifier is user code that runs inside every job, so it is the natural place to inject a fault."""

import os
from pathlib import Path

from rlscale.runner.rl.tasks import exact_match


def crash_once(answer: str, completion: str) -> float:
    """Raises the first time it is called in a directory ($RLSCALE_FAULT_DIR), then verifies normally."""
    marker = Path(os.environ["RLSCALE_FAULT_DIR"]) / "crashed-once"
    if not marker.exists():
        marker.touch()
        raise RuntimeError("injected crash (first call)")
    return exact_match(answer, completion)


def always_crash(answer: str, completion: str) -> float:
    """Always raises: the run must end up failed while the sweep goes on."""
    raise RuntimeError("injected crash (every call)")
