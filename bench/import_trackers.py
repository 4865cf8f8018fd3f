"""Time of `rlscale import` from each tracker, as a user runs it: a study of --runs runs x --evals evaluations is
written by each tracker's own client (MLflow to a SQLite store, trackio to TRACKIO_DIR, W&B offline run directories),
then imported by the console script into a fresh store, then imported again (nothing new: every step is skipped).

  first:   wall seconds of the first import (process start, reading through the client, checks, storing)
  again:   wall seconds of a second import of the same runs (reads everything again, stores nothing)
  CPU:     CPU seconds of each import's processes (W&B's readers included), which a shared machine's load inflates
           less than wall time
The stored records are checked against what was written (runs, steps, rewards), so a fast wrong import fails.

Usage: nice .venv/bin/python bench/import_trackers.py [--runs 50] [--evals 100]
Prints the numbers and writes bench/results/import_trackers.json.
"""

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RLSCALE = Path(sys.executable).with_name("rlscale")

# each writer gets: work directory, study name, runs, evaluations; rewards follow a ScaleRL sigmoid per run
CURVE = """
def curve(run, e):
    compute = 20.0 * (e + 1)
    a, c_mid = 0.5 + 0.002 * run, 800.0 + 10 * run
    return compute, 0.1 + (a - 0.1) / (1 + (c_mid / compute) ** 1.5)
"""
WRITERS = {
    "mlflow": CURVE
    + """
import sys, time
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
root, study, runs, evals = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
client = MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow.db")
experiment = client.create_experiment(study)
now = int(time.time() * 1000)
for r in range(runs):
    run = client.create_run(experiment, run_name=f"run {r}")
    metrics = []
    for e in range(evals):
        compute, reward = curve(r, e)
        metrics += [Metric("eval/reward", reward, now, e), Metric("gpu_hours", compute, now, e)]
    for i in range(0, len(metrics), 1000):
        client.log_batch(run.info.run_id, metrics=metrics[i : i + 1000])
""",
    "trackio": CURVE
    + """
import sys, trackio
root, study, runs, evals = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
for r in range(runs):
    trackio.init(project=study, name=f"run {r}")
    for e in range(evals):
        compute, reward = curve(r, e)
        trackio.log({"eval/reward": reward, "gpu_hours": compute}, step=e)
    trackio.finish()
""",
    "wandb": CURVE
    + """
import sys, wandb
root, study, runs, evals = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
for r in range(runs):
    with wandb.init(project=study, name=f"run {r}", dir=root) as run:
        for e in range(evals):
            compute, reward = curve(r, e)
            run.log({"eval/reward": reward, "gpu_hours": compute}, step=e)
""",
}


def source(tracker: str, root: Path, study: str) -> list[str]:
    return {
        "mlflow": ["--mlflow", f"sqlite:///{root}/mlflow.db", "--experiment", study],
        "trackio": ["--trackio", study],
        "wandb": [str(root / "wandb")],
    }[tracker]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--evals", type=int, default=100)
    args = parser.parse_args()
    study = "bench"
    results = {}
    for tracker, script in WRITERS.items():
        with tempfile.TemporaryDirectory(prefix=f"import_{tracker}_") as tmp:
            root = Path(tmp)
            env = {**os.environ, "TRACKIO_DIR": str(root / "trackio"), "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
            env |= {name: str(root) for name in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR")}
            started = time.perf_counter()
            subprocess.run(
                [sys.executable, "-c", script, str(root), study, str(args.runs), str(args.evals)],
                env=env,
                check=True,
                capture_output=True,
            )
            written = time.perf_counter() - started
            db = f"sqlite:///{root / 'store.db'}"
            command = [str(RLSCALE), "import", *source(tracker, root, study), "--reward", "eval/reward"]
            command += ["--compute", "gpu_hours", "--study", study, "--db", db, "--json"]
            times, cpu, summaries = [], [], []
            for _ in range(2):
                started, used = time.perf_counter(), children_cpu()
                done = subprocess.run(command, env=env, capture_output=True, text=True)
                times.append(time.perf_counter() - started)
                cpu.append(children_cpu() - used)
                if done.returncode != 0:
                    sys.exit(f"{tracker}: import failed: {done.stderr.strip()}")
                summaries.append(json.loads(done.stdout))
            check(tracker, db, args.runs, args.evals)
            assert summaries[0]["records_added"] == args.runs * args.evals, summaries[0]
            assert summaries[1]["records_added"] == 0, summaries[1]
            results[tracker] = {
                "write_s": round(written, 2),
                "first_s": round(times[0], 2),
                "again_s": round(times[1], 2),
                "first_cpu_s": round(cpu[0], 2),
                "again_cpu_s": round(cpu[1], 2),
            }
            print(
                f"{tracker:8s} {args.runs} runs x {args.evals} evals: written in {written:6.1f} s; "
                f"import {times[0]:5.1f} s ({cpu[0]:.1f} s CPU), again {times[1]:5.1f} s ({cpu[1]:.1f} s CPU)"
            )
    out = ROOT / "bench" / "results" / "import_trackers.json"
    out.write_text(
        json.dumps(
            {
                "command": f"bench/import_trackers.py --runs {args.runs} --evals {args.evals}",
                "date": datetime.date.today().isoformat(),
                "host": f"{platform.node()} ({os.cpu_count()} CPUs)",
                "load_average_at_end": round(os.getloadavg()[0], 1),
                "runs": args.runs,
                "evals": args.evals,
                "seconds": results,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out.relative_to(ROOT)}")


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's finished children and theirs."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def check(tracker: str, db: str, runs: int, evals: int) -> None:
    """The stored study holds every run and step with the reward written."""
    sys.path.insert(0, str(ROOT))
    from rlscale.db.store import Store

    namespace: dict = {}
    exec(CURVE, namespace)
    with Store(db) as store:
        records = store.records_frame("bench")
    assert sorted(set(records["run"])) == sorted(f"run {r}" for r in range(runs)), tracker
    for name, rows in records.groupby("run"):
        r = int(name.split()[1])
        expected = [namespace["curve"](r, e) for e in range(evals)]
        assert rows["step"].tolist() == list(range(evals)), (tracker, name)
        assert rows["gpu_hours"].tolist() == [c for c, _ in expected], (tracker, name)
        assert rows["val_reward"].tolist() == [w for _, w in expected], (tracker, name)


if __name__ == "__main__":
    main()
