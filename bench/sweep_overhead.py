"""Sweep overhead on the quickstart: the share of wall time not spent generating or training.

Question (issue 6): of `rlscale sweep studies/quickstart.yaml`'s wall time, how much is neither generation
(batches, validation, weight loads) nor training, i.e. process start, Ray and engine start-up, trainer
start-up, scheduling, store writes and fits? Target: at most 10%.

Runs the study in this process through the same steps as the command (SweepDriver -> fits -> plot) into a
scratch SQLite store and reports directory in a temporary directory, so the repository's ./rlscale.db and
./reports/ are never touched. Wall time counts from this script's start (imports included). Busy time is the
union of each job's generator and trainer busy intervals (run_job's `busy_seconds`; jobs run one after another,
so the sum over jobs is the union). The overhead is broken down by timing the driver's calls:

    before_clock  run_job call time before its device-hours clock starts (engine start on the first run,
                  trainer actor start and base-weight load on every run)
    in_job_idle   job wall time with neither actor busy (round trips, reward checks, checkpoints)
    store_writes  Store.add_records
    fits          the fits after each run plus the final fits and plot
    start_up      before the first job: imports, store, planning, Ray start
    between_jobs  between jobs, fits aside: run status writes, actor hand-over
    shut_down     after the last job, fits aside: shared actors stopped, Ray shut down
    other         the rest (the temporary directory's clean-up, rounding)

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
TARGET = 0.10


class Timer:
    """Accumulates the wall seconds spent inside wrapped callables, by label."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.intervals: dict[str, list[tuple[float, float]]] = {}
        self.jobs: list[dict] = []
        self.sweep_returned = 0.0  # wall clock when SweepDriver.run() returned

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
        def timed(*args, **kwargs):
            started = time.time()
            result = run_job(*args, **kwargs)
            self.jobs.append(
                {"call_seconds": time.time() - started, "called": started, "returned": time.time(), **result}
            )
            return result

        return timed


def sweep(study_file: Path, workdir: Path) -> dict:
    """Run the study as `rlscale sweep` does, instrumented; returns the measured seconds."""
    import rlscale.runner.builtin.job
    from rlscale.db.store import Store
    from rlscale.fitting.plots import plot_study
    from rlscale.fitting.stored import fit_study
    from rlscale.planner.study import load_study
    from rlscale.runner.sweep.driver import SweepDriver

    timer = Timer()
    rlscale.runner.builtin.job.run_job = timer.wrap_job(
        rlscale.runner.builtin.job.run_job
    )  # the driver imports run_job at call time
    study = load_study(study_file)
    store = Store(f"sqlite:///{workdir / 'rlscale.db'}")
    store.add_records = timer.wrap("store_writes", store.add_records)
    driver = SweepDriver(study, store)
    driver.refit = timer.wrap("fits", driver.refit)
    driver.plan()
    summary = driver.run()
    timer.sweep_returned = time.time()  # after the driver's close()
    fitted = time.time()
    records, fits, record_breaking = fit_study(store, study.name)
    plot_study(
        records,
        fits,
        workdir / "reports" / f"{study.name}.png",
        run_col="run",
        compute_col="compute",
        reward_col="reward",
        title=f"{study.name}: validation reward vs device-hours",
        record_breaking=record_breaking,
    )
    timer.seconds["fits"] = timer.seconds.get("fits", 0.0) + time.time() - fitted
    return {"summary": summary, "timer": timer, "records": records, "fits": fits}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", type=Path, default=ROOT / "studies" / "quickstart.yaml")
    parser.add_argument("--keep", type=Path, default=None, help="scratch directory to keep (default: a temporary one)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="rlscale-overhead-") as tmp:
        workdir = (args.keep or Path(tmp)).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        os.chdir(workdir)  # a sweep writes ./rlscale.db and ./reports/ by default: never into the repository
        measured = sweep(args.study.resolve(), workdir)
        wall = time.time() - STARTED

    summary, timer = measured["summary"], measured["timer"]
    jobs = timer.jobs
    busy = summary.busy_seconds
    parts = {
        "before_clock": sum(j["call_seconds"] - j["wall_seconds"] for j in jobs),
        "in_job_idle": sum(j["wall_seconds"] - j["busy_seconds"] for j in jobs),
        "store_writes": timer.seconds.get("store_writes", 0.0),
        "fits": timer.seconds.get("fits", 0.0),
    }
    # what is left, by when it happens: before the first job (imports, store, planning, Ray start), between jobs
    # (status writes; the driver's refits are under fits), after the last job (actors stopped, Ray shut down)
    if jobs:
        parts["start_up"] = jobs[0]["called"] - STARTED
        parts["between_jobs"] = sum(
            b["called"] - a["returned"] - timer.inside("fits", a["returned"], b["called"])
            for a, b in zip(jobs, jobs[1:])
        )
        end = timer.sweep_returned
        parts["shut_down"] = end - jobs[-1]["returned"] - timer.inside("fits", jobs[-1]["returned"], end)
    parts["other"] = wall - busy - sum(parts.values())
    overhead = wall - busy
    fits = measured["fits"]
    records = measured["records"]
    runs = []
    for row in fits.to_dict("records"):
        curve = records[records["run"] == row["run"]].sort_values("compute")
        runs.append(
            {
                "run": row["run"],
                "reward_start": round(float(curve["reward"].iloc[0]), 3),
                "reward_end": round(float(curve["reward"].iloc[-1]), 3),
                "device_hours": round(float(curve["compute"].iloc[-1]), 5),
                "A": round(float(row["A"]), 3),
                "r2": round(float(row["r2"]), 3),
            }
        )
    result = {
        "study": str(args.study.relative_to(ROOT) if args.study.resolve().is_relative_to(ROOT) else args.study),
        "host": {
            "cpus": len(os.sched_getaffinity(0)),
            "machine": platform.machine(),
            "python": platform.python_version(),
        },
        "date": time.strftime("%Y-%m-%d"),
        "runs": summary.count("done"),
        "failed": summary.count("failed"),
        "wall_seconds": round(wall, 1),
        "busy_seconds": round(busy, 1),
        "overhead_seconds": round(overhead, 1),
        "overhead_fraction": round(overhead / wall, 3),
        "target": TARGET,
        "within_target": overhead / wall <= TARGET,
        "overhead_parts_seconds": {key: round(value, 1) for key, value in parts.items()},
        "busy_parts_seconds": {key: round(value, 1) for key, value in summary.timings.items()},
        "jobs": [
            {
                "call_seconds": round(j["call_seconds"], 1),
                "wall_seconds": round(j["wall_seconds"], 1),
                "busy_seconds": round(j["busy_seconds"], 1),
                "steps": j["steps"],
            }
            for j in jobs
        ],
        "curves": runs,
    }
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"wall {wall:.0f} s, busy (generating or training) {busy:.0f} s, overhead {overhead:.0f} s "
        f"= {overhead / wall:.1%} of wall (target <= {TARGET:.0%})"
    )
    for key, value in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"  {key:13s} {value:6.1f} s  {value / wall:6.1%}")
    for run in runs:
        print(f"  {run['run']:24s} reward {run['reward_start']:.3f} -> {run['reward_end']:.3f}  R^2 {run['r2']:.3f}")
    print(f"-> {RESULT}")


if __name__ == "__main__":
    main()
