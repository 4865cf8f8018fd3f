"""The advances of one sweep in flight: a thread per job over the blocking Engine.run, admission on free devices,
stop requests, and the queue of ended jobs; what an advance does is the driver's `advance` callable."""

import math
import queue
import threading
import time
from collections.abc import Callable

from rlscale.runner.sweep.admission import Ledger
from rlscale.runner.sweep.state import FINISHED, RunState

from rlscale.base.errors import UserError

REQUEUE_SECONDS = 10.0  # a run whose devices were taken at start waits this long before it is admitted again
CLUSTER_POLL_SECONDS = 2.0  # how often admission reads the cluster's free devices

# advance(run, until_step or None for its end, should_stop) -> False when its devices were taken before it started
Advance = Callable[[RunState, int | None, Callable[[], str | None]], bool]


class JobPool:
    """Runs in flight, one thread each. devices: run_id -> the Ray bundles its job holds (one per node); nodes() None:
    `limit` alone bounds runs in flight; adopted: runs whose job already runs (an earlier driver's), admitted now."""

    def __init__(
        self,
        runs: dict[int, RunState],
        *,
        devices: dict[int, list[dict]],
        nodes: Callable[[], list | None],
        limit: int | None,
        advance: Advance,
        progress_of: Callable,
        stopped: Callable[[RunState, str], None],
        on_change: Callable[[str], None],
        adopted: set[int] = frozenset(),
    ):
        self.runs, self.devices = runs, devices
        self.nodes, self.advance, self.progress_of = nodes, advance, progress_of
        self.stopped, self.on_change = stopped, on_change
        self.ended: queue.Queue = queue.Queue()
        self.threads: dict[int, threading.Thread] = {}
        self.stop_requests: dict[int, str] = {}
        self.requeued: dict[int, float] = {}  # run_id -> monotonic time it may be admitted again
        self.adopted = set(adopted)
        self.errors: list[BaseException] = []
        found = nodes()
        self.ledger = Ledger([node.total for node in found], _free(found)) if found else None
        self.polled = time.monotonic()
        todo = [run for run in runs.values() if run.status not in FINISHED and run.recipe is not None]
        for run in todo:
            if self.ledger is not None and not self.ledger.fits_at_all(devices[run.run_id]):
                raise UserError(
                    f"run {run.name!r} needs {devices_text(devices[run.run_id])}; the cluster's "
                    f"nodes have {', '.join(devices_text([node]) for node in self.ledger.nodes)}",
                    field="generator_devices/trainer_devices",
                )
        limit = limit or (len(todo) if self.ledger is not None else 1)
        self.slots = max(1, min(limit, len(todo) or 1))
        self._show()

    def admit(self, run_id: int) -> bool:
        """Reserve run_id's devices if its whole job fits on the free devices now."""
        if time.monotonic() < self.requeued.get(run_id, 0.0):
            return False
        if self.ledger is None:
            return True
        if run_id in self.adopted:  # its job runs already: following it takes nothing more
            self.adopted.discard(run_id)
            self.ledger.adopt(run_id, self.devices[run_id])
            self.runs[run_id].devices = devices_text(self.devices[run_id])
            self._show()
            return True
        if time.monotonic() - self.polled > CLUSTER_POLL_SECONDS:
            try:
                found = self.nodes()
            except Exception:  # the cluster is out of reach (a head being replaced): the ledger alone decides
                found = None
            self.ledger.observe(_free(found) if found else None)
            self.polled = time.monotonic()
        admitted = self.ledger.admit(run_id, self.devices[run_id])
        if admitted:
            self.runs[run_id].devices = devices_text(self.devices[run_id])
        self._show()
        return admitted

    def start(self, run_id: int, until: float, check) -> None:
        """Advance run_id to `until` x its planned compute on a thread of its own."""
        run = self.runs[run_id]
        run.status, run.note = "starting", ""
        # to its end: the job's own stop (its planned compute, or recipe.steps) decides; a rung: that step
        until_step = None if until >= 1.0 - 1e-9 else max(run.step + 1, math.ceil(until * run.recipe.steps - 1e-9))

        def should_stop() -> str | None:
            if run_id in self.stop_requests:
                return self.stop_requests[run_id]
            return check(self.progress_of(run))

        def advance() -> None:
            try:
                if not self.advance(run, until_step, should_stop):
                    self.requeued[run_id] = time.monotonic() + REQUEUE_SECONDS
            except BaseException as err:  # surfaces in the scheduler's thread (wait)
                self.errors.append(err)
            finally:
                self.ended.put(run_id)  # wait() releases its devices, in the scheduler's thread

        thread = threading.Thread(target=advance, name=f"run-{run.name}", daemon=True)
        self.threads[run_id] = thread
        thread.start()
        self._show()

    def wait(self) -> list[int]:
        """Run ids whose advance ended since the last call ([] after a second without one)."""
        ended = []
        try:
            ended.append(self.ended.get(timeout=1.0))
            while True:
                ended.append(self.ended.get_nowait())
        except queue.Empty:
            pass
        for run_id in ended:
            self.threads.pop(run_id, None)
            self.stop_requests.pop(run_id, None)
            if self.ledger is not None:
                self.ledger.release(run_id)
        if self.errors:
            raise self.errors[0]
        self._show()
        return ended

    def stop(self, run_id: int, reason: str) -> None:
        """Stop run_id: now if it is idle, at its next checkpoint if it is in flight."""
        run = self.runs[run_id]
        if run_id in self.threads:
            self.stop_requests[run_id] = reason
            run.note = f"stopping: {reason}"
            self._show()
        else:
            self.stopped(run, reason)

    def waiting(self) -> dict[int, float]:
        """Runs sent back to the queue that may not be admitted yet (run_id -> 1.0: they read as busy)."""
        now = time.monotonic()
        return {run_id: 1.0 for run_id, until in self.requeued.items() if now < until}

    def interrupt(self) -> None:
        """The sweep is ending early (Ctrl-C, an error): ask every job in flight to stop at its next checkpoint."""
        for run_id in list(self.threads):
            self.stop_requests[run_id] = "interrupted"

    def join(self, seconds: float) -> list[RunState]:
        """Wait up to `seconds` for every advance in flight to end; the runs of those still in flight."""
        deadline = time.monotonic() + seconds
        for thread in list(self.threads.values()):
            thread.join(max(0.0, deadline - time.monotonic()))
        return [self.runs[run_id] for run_id, thread in list(self.threads.items()) if thread.is_alive()]

    def _show(self) -> None:
        queued = sum(run.status in ("pending", "paused", "queued") for run in self.runs.values())
        parts = []
        if self.ledger is not None:
            kinds = [key for key in ("GPU", "TPU", "CPU") if self.ledger.capacity(key) > 0]
            resource = next(
                (key for key in kinds if any(key in b for bs in self.devices.values() for b in bs)),
                kinds[0] if kinds else "GPU",
            )
            parts.append(f"{resource} {self.ledger.busy(resource):g}/{self.ledger.capacity(resource):g} busy")
        parts.append(f"{len(self.threads)} in flight (max {self.slots})")
        parts.append(f"{queued} queued")
        self.on_change(", ".join(parts))


def _free(nodes) -> list | None:
    free = [node.free for node in nodes]
    return None if any(entry is None for entry in free) else free


def devices_text(bundles) -> str:
    """Bundles as one line for the user ('2 x 8 GPU' when all alike)."""
    texts = [" + ".join(f"{amount:g} {key}" for key, amount in bundle.items()) for bundle in bundles]
    return f"{len(texts)} x {texts[0]}" if len(texts) > 1 and len(set(texts)) == 1 else " and ".join(texts)
