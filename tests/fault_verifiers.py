"""Verifiers that crash on purpose, named from study files as `fault_verifiers:<name>` (tests/ on the path).
A custom verifier is user code that runs inside every job, so it is the natural place to inject a fault."""

import os
import time
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


def hold_while_told(answer: str, completion: str) -> float:
    """Blocks while $RLSCALE_FAULT_DIR/hold exists (touching .../held to say it waits), then verifies normally: a
    test holds a job at a step of its choosing, does something to the cluster, and lets it go."""
    directory = Path(os.environ["RLSCALE_FAULT_DIR"])
    while (directory / "hold").exists():
        (directory / "held").touch()
        time.sleep(0.05)
    return exact_match(answer, completion)
