"""A sweep on a simulated GPU cluster, scheduled by the sweep driver's own loop and admission code.

Question (issue 31): how full does a concurrent sweep keep a cluster, how close does it come to the shortest
possible makespan, and does early termination under concurrency still find the grid's best run for no more compute
than one run at a time?

The study is studies/isocompute_playbook.yaml's grid as `rlscale plan` lays it out (39 B_p x n points, their planned
GPU-hours), each point an 8-GPU job on a 64-GPU cluster (8 nodes of 8). A run advances in simulated time at its
GPUs' rate (planned GPU-hours / 8 hours for the whole run); its reward curve is a synthetic ScaleRL sigmoid observed
at 40 evaluations with binomial noise, as bench/early_termination.py draws them (C_mid 4-15% of the run's budget,
the "mid" regime). The loop is `run_concurrently` (runner/sweep/scheduler.py) with the driver's `Ledger`
(runner/sweep/admission.py) admitting whole jobs on the nodes' free GPUs: what SweepDriver runs, with a simulated
clock in place of Ray. Early termination is the asymptote rule's rung schedule (RungSchedule, the study defaults),
its stop check every other evaluation; a run stopped while in flight ends at its next check.

Reported for the full grid and with early termination: GPU utilisation (busy GPU-hours / (64 x makespan)),
makespan against its lower bound (max(GPU-hours spent / 64, longest run), per study), the grid's best found
(exactly, and within the 0.02 noise band of its true asymptote) and compute spent against the full grid; and the same
schedule one run at a time (8 GPUs busy of 64) for comparison. Writes bench/results/cluster_schedule.json.
"""

import argparse
import json
import platform
import time
from datetime import date
from pathlib import Path

import numpy as np
from early_termination import CHECK_EVERY, N_EVALS, REGIMES, RULE, WITHIN, FitCache, full_grid_best, make_study
from rlscale.planner.planning import planned_runs
from rlscale.planner.study_file import load_study
from rlscale.runner.sweep.admission import Ledger
from rlscale.runner.sweep.scheduler import GridSchedule, RungSchedule, RunProgress, run_concurrently

ROOT = Path(__file__).resolve().parents[1]
GPUS_PER_NODE, NODES, GPUS_PER_RUN = 8, 8, 8
REGIME = "mid"


class SimulatedCluster:
    """Runs advancing in simulated hours on a ledger of nodes: the progress / start / wait / stop / admit callbacks
    of run_concurrently. Each run observes its evaluations at its own pace; wait() moves the clock to the next
    event and returns once some advance has ended."""

    def __init__(self, runs: list[dict], hours: list[float], fits: FitCache, slots_gpus: int):
        self.runs, self.hours, self.fits = runs, hours, fits
        self.ledger = Ledger([{"GPU": float(GPUS_PER_NODE)}] * (slots_gpus // GPUS_PER_NODE))
        self.now = 0.0
        self.seen = [0] * len(runs)  # evaluations observed per run
        self.stopped: set[int] = set()
        self.requested: set[int] = set()
        self.flight: dict[int, tuple[float, object, float]] = {}  # run -> (until, check, time of its next eval)
        self.busy_gpu_hours = 0.0

    def progress(self) -> list[RunProgress]:
        return [self.view(i) for i in range(len(self.runs))]

    def view(self, i: int) -> RunProgress:
        n = self.seen[i]
        run = self.runs[i]
        return RunProgress(
            key=i,
            fraction=float(run["compute"][n - 1]) if n else 0.0,
            fit=self.fits(i, n),
            finished=n == N_EVALS,
            last_reward=float(run["reward"][n - 1]) if n else None,
            stopped=i in self.stopped,
        )

    def admit(self, i: int) -> bool:
        return self.ledger.admit(i, [{"GPU": float(GPUS_PER_RUN)}])

    def start(self, i: int, until: float, check) -> None:
        self.flight[i] = (until, check, self.now + self._eval_hours(i))

    def stop(self, i: int, reason: str) -> None:
        (self.requested if i in self.flight else self.stopped).add(i)

    def wait(self) -> list[int]:
        while True:
            i = min(self.flight, key=lambda k: self.flight[k][2])
            until, check, at = self.flight[i]
            for _ in self.flight:  # every run in flight holds its GPUs until this moment
                self.busy_gpu_hours += GPUS_PER_RUN * (at - self.now)
            self.now = at
            self.seen[i] += 1
            n = self.seen[i]
            if n % CHECK_EVERY == 0 and (i in self.requested or check(self.view(i))):
                self.stopped.add(i)
                self.requested.discard(i)
            if i in self.stopped or self.runs[i]["compute"][n - 1] >= until - 1e-9:
                del self.flight[i]
                self.ledger.release(i)
                return [i]
            self.flight[i] = (until, check, at + self._eval_hours(i))

    def _eval_hours(self, i: int) -> float:
        return self.hours[i] / GPUS_PER_RUN / N_EVALS

    def spent_gpu_hours(self) -> float:
        return sum(self.hours[i] * float(self.runs[i]["compute"][n - 1]) for i, n in enumerate(self.seen) if n)


def cpu_model() -> str:
    """The host's CPU model name (/proc/cpuinfo), else the machine type."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def schedule_study(runs, hours, fits, schedule, slots: int) -> dict:
    """One study through run_concurrently on the simulated cluster, `slots` 8-GPU jobs at most at once."""
    cluster = SimulatedCluster(runs, hours, fits, NODES * GPUS_PER_NODE)
    run_concurrently(
        schedule, cluster.progress, cluster.start, cluster.wait, cluster.stop, admit=cluster.admit, slots=slots
    )
    finished = [i for i, n in enumerate(cluster.seen) if n == N_EVALS and i not in cluster.stopped]
    pick = max(finished, key=lambda k: fits(k, N_EVALS).A if fits(k, N_EVALS) is not None else -1)
    longest = max(hours[i] * float(runs[i]["compute"][n - 1]) for i, n in enumerate(cluster.seen) if n) / GPUS_PER_RUN
    bound = max(cluster.spent_gpu_hours() / (NODES * GPUS_PER_NODE), longest)
    return {
        "makespan_hours": cluster.now,
        "busy_gpu_hours": cluster.busy_gpu_hours,
        "spent_gpu_hours": cluster.spent_gpu_hours(),
        "pick": pick,
        "makespan_lower_bound_hours": bound,
    }


def summarise(rows: list[dict], key: str, full_hours: float) -> dict:
    """Means over the studies; the makespan's lower bound is max(GPU-hours spent / 64, longest run) per study."""
    mine = [row[key] for row in rows]
    makespan = float(np.mean([r["makespan_hours"] for r in mine]))
    bound = float(np.mean([r["makespan_lower_bound_hours"] for r in mine]))
    return {
        "utilisation": float(
            np.mean([r["busy_gpu_hours"] / (NODES * GPUS_PER_NODE * r["makespan_hours"]) for r in mine])
        ),
        "makespan_hours": makespan,
        "makespan_lower_bound_hours": bound,
        "best_found_share": float(np.mean([r["pick"] == row["grid_best"] for r, row in zip(mine, rows)])),
        "best_within_noise_share": float(
            np.mean([row["truth"][row["grid_best"]] - row["truth"][r["pick"]] <= WITHIN for r, row in zip(mine, rows)])
        ),
        "compute_share": float(np.mean([r["spent_gpu_hours"] for r in mine])) / full_hours,
        "compute_share_max": float(np.max([r["spent_gpu_hours"] for r in mine])) / full_hours,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=100, help="synthetic studies (seeded)")
    args = parser.parse_args()
    started = time.perf_counter()
    study = load_study(ROOT / "studies" / "isocompute_playbook.yaml")
    hours = [point.gpu_hours for point in planned_runs(study)]
    full_hours = float(sum(hours))
    slots = NODES * GPUS_PER_NODE // GPUS_PER_RUN
    rng = np.random.default_rng(0)
    rungs = RungSchedule.from_rule(RULE)
    rows = []
    for k in range(args.studies):
        runs = make_study(rng, REGIMES[REGIME], n_runs=len(hours))
        fits = FitCache(runs)
        row = {"grid_best": full_grid_best(runs), "truth": [run["A"] for run in runs]}
        if k == 0:  # the full grid's schedule does not depend on the curves
            grid = schedule_study(runs, hours, fits, GridSchedule(), slots)
        row["full_grid"] = {**grid, "pick": row["grid_best"]}
        row["early_termination"] = schedule_study(runs, hours, fits, rungs, slots)
        row["one_at_a_time"] = schedule_study(runs, hours, fits, rungs, 1)
        rows.append(row)
        print(
            f"study {k + 1}/{args.studies}: concurrent {row['early_termination']['makespan_hours']:.0f} h, "
            f"one at a time {row['one_at_a_time']['makespan_hours']:.0f} h "
            f"({time.perf_counter() - started:.0f} s)",
            flush=True,
        )
    result = {key: summarise(rows, key, full_hours) for key in ("full_grid", "early_termination", "one_at_a_time")}
    ratio = result["early_termination"]["makespan_hours"] / result["one_at_a_time"]["makespan_hours"]
    result["early_termination"]["makespan_vs_one_at_a_time"] = ratio
    result.update(
        {
            "cluster": {"gpus": NODES * GPUS_PER_NODE, "nodes": NODES, "gpus_per_run": GPUS_PER_RUN},
            "study": "studies/isocompute_playbook.yaml",
            "runs": len(hours),
            "studies": args.studies,
            "c_mid_fraction_of_budget": list(REGIMES[REGIME]),
            "evals_per_run": N_EVALS,
            "check_every_evals": CHECK_EVERY,
            "date": date.today().isoformat(),
            "host": cpu_model(),
            "seconds": round(time.perf_counter() - started, 1),
        }
    )
    for key in ("full_grid", "early_termination", "one_at_a_time"):
        r = result[key]
        print(
            f"{key:18s} utilisation {r['utilisation']:.1%}  makespan {r['makespan_hours']:.0f} h "
            f"(bound {r['makespan_lower_bound_hours']:.0f} h)  best found {r['best_found_share']:.0%} "
            f"(within 0.02: {r['best_within_noise_share']:.0%})  compute {r['compute_share']:.0%}"
        )
    print(f"early termination makespan / one at a time: {ratio:.3f}")
    out = Path(__file__).parent / "results" / "cluster_schedule.json"
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out} ({result['seconds']} s)")


if __name__ == "__main__":
    main()
