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


def exit_once(answer: str, completion: str) -> float:
    """Ends the process it runs in (a sweep's Ray driver) the first time it is called in a directory, as an
    out-of-memory kill would, then verifies normally; only in a child process, never a test's own."""
    import multiprocessing

    marker = Path(os.environ["RLSCALE_FAULT_DIR"]) / "exited-once"
    if not marker.exists():
        if multiprocessing.parent_process() is None:
            raise RuntimeError("exit_once runs in the test's own process: the engine is not in a process of its own")
        marker.touch()
        os._exit(1)
    return exact_match(answer, completion)


def always_crash(answer: str, completion: str) -> float:
    """Always raises: the run must end up failed while the sweep goes on."""
    raise RuntimeError("injected crash (every call)")


def hold_while_told(answer: str, completion: str) -> float:
    """Blocks while $RLSCALE_FAULT_DIR/hold exists (touching .../held to say it waits), then verifies normally: a
    test holds a job at a step of its choosing, does something to the cluster, and lets it go. Once let go, it puts
    1 MiB in Ray's object store, as a job's next large argument would: Ray ends a driver whose node has died there."""
    directory = Path(os.environ["RLSCALE_FAULT_DIR"])
    held = False
    while (directory / "hold").exists():
        (directory / "held").touch()
        held = True
        time.sleep(0.05)
    if held:
        import ray

        ray.put(bytes(1 << 20))
    return exact_match(answer, completion)
