"""What the engines that run each segment of a run as a Ray job (verl, trl) share: a run's jobs by submission id
(`<run key>-<k>`), stopping one and waiting until it has stopped, the wall seconds the Jobs API saw it run, and
reading the lines a running job appends to its log file."""

import json
import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path

RUNNING = ("PENDING", "RUNNING")


def run_jobs(client, run_key: str) -> list:
    """The run's jobs on the cluster (JobDetails from a JobSubmissionClient), in submission order."""
    numbered = []
    for details in client.list_jobs():
        prefix, _, number = (details.submission_id or "").rpartition("-")
        if prefix == run_key and number.isdigit():
            numbered.append((int(number), details))
    return [details for _, details in sorted(numbered, key=lambda pair: pair[0])]


def stop_job(client, submission_id: str, poll_seconds: float = 1.0) -> None:
    """Stop the job and wait until the Jobs API no longer reports it running."""
    client.stop_job(submission_id)
    while str(client.get_job_status(submission_id).value) in RUNNING:
        time.sleep(min(poll_seconds, 1.0))


class JobsApiEngine:
    """What an engine whose jobs go through Ray's Jobs API (verl, trl) does alike: its client, the cluster's nodes
    from the dashboard, and on close stopping the jobs it started. The engine calls _start_jobs_api in __init__."""

    def _start_jobs_api(self, ray_address: str | None) -> None:
        self.ray_address = ray_address  # the dashboard, http://HEAD:8265 (RAY_ADDRESS when None)
        self._client = None
        self._lock = threading.Lock()
        self._started: set[str] = set()  # submission ids submitted here (close stops those still running)
        self._closed = False  # after close nothing more is submitted (a sweep's threads may still be retrying)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the engine is closed: the sweep is ending")

    def nodes(self) -> list | None:
        """The cluster's nodes and their free devices, from the dashboard."""
        from rlscale.runner.cluster import dashboard_nodes

        return dashboard_nodes(self._jobs_client())

    def close(self, wait_seconds: float = 60.0) -> None:
        """Stop the jobs this engine submitted that still run (an interrupted sweep), and wait until the Jobs API
        reports them ended; a paused or stopped run has none running. A job adopted from an earlier driver is left
        to the cluster."""
        with self._lock:
            started, self._started, self._closed = set(self._started), set(), True
        try:
            client = self._jobs_client()
            live = [job for job in started if str(client.get_job_status(job).value) in RUNNING]
            for job in live:
                client.stop_job(job)
            deadline = time.monotonic() + wait_seconds
            while live and time.monotonic() < deadline:
                time.sleep(0.5)
                live = [job for job in live if str(client.get_job_status(job).value) in RUNNING]
        except Exception:  # the cluster is gone: nothing left to stop
            pass
        self._client = None

    def _jobs_client(self):
        with self._lock:
            if self._client is None:
                from ray.job_submission import JobSubmissionClient

                self._client = JobSubmissionClient(self.ray_address)
            return self._client


def report_progress(records: list[dict], progress) -> None:
    """Hand the live view a batch's last step, compute and latest validation reward (progress may be None)."""
    if progress and records:
        progress({"step": records[-1]["step"], "gpu_hours": records[-1]["gpu_hours"],
                  "val_reward": next((r["val_reward"] for r in reversed(records) if r["val_reward"] is not None),
                                     None)})


def wall_seconds(details) -> float:
    """Seconds the job ran, by the Jobs API's clock (start to end; 0 if it never started)."""
    if not details.start_time:
        return 0.0
    end = details.end_time or time.time() * 1000
    return max(0.0, (end - details.start_time) / 1000.0)


def base_seconds(details) -> float:
    """Device-seconds of the run's jobs before this one, as its submission recorded them in its metadata."""
    return float((details.metadata or {}).get("base_gpu_seconds", 0.0))


@dataclass
class LogTail:
    """Reads the complete lines appended to one file since the last read."""

    path: Path
    offset: int = 0  # bytes read and parsed so far

    def read(self) -> list[dict]:
        """The lines completed since the last call, parsed ({} if the file does not exist yet)."""
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n") + 1
        self.offset += end
        return [json.loads(line) for line in chunk[:end].splitlines() if line.strip()]


def finite_number(value) -> float | None:
    """A finite number, or None (NaN written as null, a missing metric, a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)
