"""The Ray cluster a sweep's engines run on: the one named, or a local head the sweep owns, replaced if it dies.
A head that dies takes its jobs, never the runs: they resume from their last checkpoints without spending an attempt."""

import hashlib
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

HEAD_DEATH_SECONDS = 30.0  # a head whose process runs but whose Jobs API has not answered for this long is dead
QUIET_SECONDS = 300.0  # how long a restart waits for the jobs in flight to leave their engines


class SweepCluster:
    """The cluster of one sweep. address: the named cluster (None: RAY_ADDRESS's, else a local head kept under
    `head_dir`). on_note(text): a one-line note while the head is replaced."""

    def __init__(self, address: str | None, head_dir: Path, *, on_note: Callable[[str], None] = lambda note: None):
        self.address, self.head_dir, self.on_note = address, head_dir, on_note
        self.cpus = 0  # the most devices one job holds: a local head has at least as many CPUs
        self.head = None  # the local head (rlscale.runner.ray_head.LocalHead), once started or adopted
        self.restarts = 0  # heads started again after one died under the sweep
        self._state = threading.Condition()
        self._generation = 0  # bumped each time the head is replaced
        self._inside = 0  # engine calls in progress
        self._restarting = False

    @property
    def local(self) -> bool:
        """The sweep owns its head (nothing named the cluster)."""
        return self.address is None and not os.environ.get("RAY_ADDRESS")

    def address_for(self, engine: str, *, cpus: int = 0) -> str | None:
        """The address engine `engine` is made with: the named cluster's, else the local head's (its GCS for builtin,
        its Jobs API for the others), started or adopted here; never waits for a head being replaced."""
        if not self.local:
            return self.address
        if engine == "builtin" and _joined():  # this process's Ray driver has a cluster already: the engine keeps it
            return None
        from rlscale.runner.ray_head import local_head

        with self._state:
            self.cpus = max(self.cpus, cpus)
            if self.head is None:
                self.head = local_head(self.head_dir, cpus=self.cpus)
            return self.head.gcs_address if engine == "builtin" else self.head.address

    def in_own_process(self, engine: str) -> bool:
        """Whether `engine` runs in a child process: the builtin engine's Ray driver on a head this sweep replaces
        (Ray ends a driver whose node dies, and the sweep must outlive its head)."""
        return engine == "builtin" and self.local and not _joined()

    def enter(self) -> int:
        """An engine call begins (after any head replacement in progress); returns the head's generation."""
        with self._state:
            self._state.wait_for(lambda: not self._restarting)
            self._inside += 1
            return self._generation

    def leave(self) -> None:
        """The engine call that `enter` began has returned or raised."""
        with self._state:
            self._inside -= 1
            self._state.notify_all()

    def recover(
        self, generation: int, close_engines: Callable[[], None], end_processes: Callable[[], None] = lambda: None
    ) -> bool:
        """After an engine call of `generation` failed: whether the run should simply go again because its head died
        (the head is replaced here, or was by another run meanwhile); False when the failure is the job's own.
        end_processes() ends the engines' child processes at once (a call stuck on the dead head fails then)."""
        with self._state:
            if generation != self._generation:
                return True
            if not self.local or self.head is None:
                return False
            if self._restarting:
                self._state.wait_for(lambda: not self._restarting)
                return True
            dead = self.head
        if not _dead(dead):
            return False
        with self._state:
            if generation != self._generation or self._restarting:
                self._state.wait_for(lambda: not self._restarting)
                return True
            self._restarting = True
            self.on_note("the Ray head died: waiting for the jobs in flight to end")
            end_processes()
            self._state.wait_for(lambda: self._inside == 0, timeout=QUIET_SECONDS)
        try:
            from rlscale.runner.ray_head import local_head

            close_engines()  # none is in use: every call of the dead head's generation has left
            self.on_note("the Ray head died: starting a new one; runs resume from their checkpoints")
            dead.stop()  # what it left: Ray's processes, its jobs' process trees, its temp dir
            head = local_head(self.head_dir, cpus=self.cpus)
            with self._state:
                self.head = head  # engines made from now on reach the new head
            self.restarts += 1
        finally:
            with self._state:
                self._generation += 1
                self._restarting = False
                self._state.notify_all()
            self.on_note("")
        return True

    def close(self) -> None:
        """Stop the local head (after the engines released it); forget it."""
        with self._state:
            head, self.head = self.head, None
        if head is not None:
            from rlscale.runner.ray_head import HEAD_FILE

            head.stop(self.head_dir / HEAD_FILE)


def head_dir(store_url: str, study: str) -> Path:
    """Where a sweep of `study` in `store_url` keeps its local head's address: one head per study and store."""
    from rlscale.base.settings import cache_dir

    digest = hashlib.sha256(f"{store_url}|{study}".encode()).hexdigest()[:16]
    return cache_dir() / "ray-heads" / digest


def _joined() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def _dead(head) -> bool:
    deadline = time.monotonic() + HEAD_DEATH_SECONDS
    while time.monotonic() < deadline:
        if head.alive():
            return False
        if not head.running():
            return True
        time.sleep(1.0)
    return True
