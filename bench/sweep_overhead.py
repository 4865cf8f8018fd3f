"""Sweep overhead on the quickstart: the share of `rlscale sweep`'s wall time that is not metered compute.

Question (issue 39): the demo's `rlscale sweep studies/quickstart.yaml` meters each run's device-hours (the devices
a job holds x its wall seconds, validation excluded) and stops each run at its planned compute. Of the command's wall
time, how much is not that metered time, and where does it go: start-up, engine and trainer start, validation,
fits, the report, the decision? Target: at most 15%.

Runs the command itself in this process (rlscale.cli's `sweep STUDY --db ... --out ...`) into a scratch SQLite store
and reports directory, so the repository's ./rlscale.db and ./reports/ are never touched; wall time counts from this
script's start (imports included). Metered time is each run's final device-hours x 3600 / the devices its job held
(the jobs run one after another on 2 cores). The rest is broken down by timing the calls the command makes:

    start_up      before the first job: imports, store, planning, Ray start
    job_start     run_job call time before its clock starts (the vLLM engine on the first run, the trainer and
                  base weights on every run)
    validation    the evaluations, which the device clock does not charge
    in_job_other  the rest of each job's wall time that its clock did not charge (its last step's overshoot aside)
    fits          the driver's refits after each run
    report        the report after the sweep (fits, plots, report.md and report.html), its decision apart
    decision      the study's decision (the optimal-n law with bootstrap, the standing at the budget)
    shut_down     after the last job: actors stopped, Ray shut down
    other         the rest (closing lines, rounding)

    .venv/bin/python bench/sweep_overhead.py [--study studies/quickstart.yaml] [--keep DIR]
"""

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

STARTED = time.time()  # before any heavy import: the command's own start-up counts as overhead

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULT = Path(__file__).parent / "results" / "sweep_overhead.json"
TARGET = 0.15


class Timer:
    """Accumulates the wall seconds spent inside wrapped callables, by label, and each job's result."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.intervals: dict[str, list[tuple[float, float]]] = {}
        self.jobs: list[dict] = []

    def wrap(self, label: str, fn):
        def timed(*args, **kwargs):
            started = time.time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[label] = self.seconds.get(label, 0.0) + time.time() - started
                self.intervals.setdefault(label, []).append((started, time.time()))

        return timed

    def inside(self, label: str, start: float, end: float) -> float:
        """Seconds of `label`'s calls that fell within [start, end]."""
        return sum(max(0.0, min(b, end) - max(a, start)) for a, b in self.intervals.get(label, []))

    def wrap_job(self, run_job):
        def timed(recipe, *args, **kwargs):
            started = time.time()
            result = run_job(recipe, *args, **kwargs)
            devices = recipe.generator_devices + recipe.trainer_devices
            self.jobs.append(
                {
                    "call_seconds": time.time() - started,
                    "called": started,
                    "returned": time.time(),
                    "devices": devices,
                    **result,
                }
            )
            return result

        return timed


def run_command(study_file: Path, workdir: Path, timer: Timer) -> dict:
    """`rlscale sweep STUDY --json` in this process, instrumented; returns its JSON."""
    import io
    from contextlib import redirect_stdout

    import rlscale.fitting.rules.decision
    import rlscale.runner.builtin.job
    from rlscale.runner.sweep.driver import SweepDriver

    import rlscale.views.report
    from rlscale.cli import main

    # the driver and the report import these at call time
    rlscale.runner.builtin.job.run_job = timer.wrap_job(rlscale.runner.builtin.job.run_job)
    SweepDriver.refit = timer.wrap("fits", SweepDriver.refit)
    rlscale.views.report.study_report = timer.wrap("report", rlscale.views.report.study_report)
    rlscale.fitting.rules.decision.decide = timer.wrap("decision", rlscale.fitting.rules.decision.decide)
    sys.argv = [
        "rlscale",
        "sweep",
        str(study_file),
        "--db",
        f"sqlite:///{workdir / 'rlscale.db'}",
        "--out",
        str(workdir / "reports"),
        "--json",
    ]
    out = io.StringIO()
    with redirect_stdout(out):
        try:
            main()
        except SystemExit as exit_:
            if exit_.code:
                raise
    timer.returned = time.time()
    return json.loads(out.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", type=Path, default=ROOT / "studies" / "quickstart.yaml")
    parser.add_argument("--keep", type=Path, default=None, help="scratch directory to keep (default: a temporary one)")
    args = parser.parse_args()
    timer = Timer()
    with tempfile.TemporaryDirectory(prefix="rlscale-overhead-") as tmp:
        workdir = (args.keep or Path(tmp)).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        os.chdir(workdir)
        payload = run_command(args.study.resolve(), workdir, timer)
        wall = time.time() - STARTED

    jobs = timer.jobs
    metered = sum(job["gpu_hours"] * 3600 / job["devices"] for job in jobs)
    validation = sum(job["timings"].get("eval", 0.0) for job in jobs)
    parts = {
        "start_up": jobs[0]["called"] - STARTED if jobs else 0.0,
        "job_start": sum(job["call_seconds"] - job["wall_seconds"] for job in jobs),
        "validation": validation,
        "in_job_other": sum(job["wall_seconds"] - job["gpu_hours"] * 3600 / job["devices"] for job in jobs)
        - validation,
        "fits": timer.seconds.get("fits", 0.0),
        "report": timer.seconds.get("report", 0.0) - timer.seconds.get("decision", 0.0),
        "decision": timer.seconds.get("decision", 0.0),
    }
    if jobs:  # from the last job to the report: the driver's close (actors, Ray), its last refit aside
        after = min((a for a, _ in timer.intervals.get("report", [])), default=timer.returned)
        parts["shut_down"] = after - jobs[-1]["returned"] - timer.inside("fits", jobs[-1]["returned"], after)
    parts["other"] = wall - metered - sum(parts.values())
    unmetered = wall - metered
    result = {
        "study": str(args.study.relative_to(ROOT) if args.study.resolve().is_relative_to(ROOT) else args.study),
        "command": "rlscale sweep STUDY --json (in process)",
        "host": {
            "cpus": len(os.sched_getaffinity(0)),
            "machine": platform.machine(),
            "python": platform.python_version(),
        },
        "date": time.strftime("%Y-%m-%d"),
        "runs": payload["done"],
        "failed": payload["failed"],
        "wall_seconds": round(wall, 1),
        "metered_seconds": round(metered, 1),
        "metered_device_hours": round(sum(job["gpu_hours"] for job in jobs), 4),
        "unmetered_seconds": round(unmetered, 1),
        "unmetered_fraction": round(unmetered / wall, 3),
        "target": TARGET,
        "within_target": unmetered / wall <= TARGET,
        "unmetered_parts_seconds": {key: round(value, 1) for key, value in parts.items()},
        "job_phases_seconds": {
            key: round(sum(job["timings"].get(key, 0.0) for job in jobs), 1)
            for key in ("generate", "train", "weight_sync", "eval")
        },
        "jobs": [
            {
                "steps": job["steps"],
                "device_hours": round(job["gpu_hours"], 5),
                "call_seconds": round(job["call_seconds"], 1),
                "wall_seconds": round(job["wall_seconds"], 1),
                "eval_seconds": round(job["timings"].get("eval", 0.0), 1),
            }
            for job in jobs
        ],
        "decision": (payload.get("decision") or {}).get("recommendation"),
    }
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"wall {wall:.0f} s, metered {metered:.0f} s, not metered {unmetered:.0f} s = {unmetered / wall:.1%} of "
        f"wall (target <= {TARGET:.0%})"
    )
    for key, value in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"  {key:13s} {value:7.1f} s")
    print(f"wrote {RESULT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
