"""What the engines that run each segment of a run as a Ray job (verl, trl) share: a run's jobs by submission id
(`<run key>-<k>`), stopping one and waiting until it has stopped, the wall seconds the Jobs API saw it run, and
reading the lines a running job appends to its log file."""

import json
import math
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
