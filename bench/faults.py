"""Faults at random moments under load: a campaign of trials, each a short concurrent sweep hit by one fault.

Question (issue 48): whatever happens to a sweep, does it end with nothing lost, doubled or left running? As Ray's
fault-tolerance tests and Jepsen's campaigns do, each trial injects one fault at a moment drawn from the seed, then
runs `rlscale sweep` again as a user would and checks invariants.

A trial: a fresh directory (store, cache, shared dir), an IsoCompute study of two runs (n 2 and 4 at B_p 8, the tiny
policy) that `rlscale sweep STUDY --json` trains at once on its own local Ray head, the `builtin` engine or the
`trl` engine by turns (builtin jobs hold 2 CPUs, so RLSCALE_RAY_CPUS=4 lets both run on 2 cores). Faults:

    driver_kill9   kill -9 of the driver's process group
    job_kill9      kill -9 of one job's process tree (builtin: a generator or trainer actor and its children;
                   trl: the job's entrypoint session)
    head_restart   the local Ray head stopped (SIGTERM to `ray start`, or SIGKILL to all its processes); the
                   sweep starts another
    pg_outage      PostgreSQL stopped for 5-30 s, then started (needs .ci/run's server: RLSCALE_TEST_PG_URL and
                   RLSCALE_TEST_PG_CTL)
    sqlite_lock    the SQLite store locked by another writer for 5-30 s
    sigint         SIGINT to the driver's process group (Ctrl-C in its terminal)
    sigterm        SIGTERM to the driver (a scheduler's preemption, `kill`, `docker stop`)
    disk_full      the checkpoint directory's disk (a 256 MiB tmpfs: builtin's checkpoints, trl's shared dir) full
                   for 5-30 s
    two_drivers    a second `rlscale sweep` of the same study started while the first runs

Invariants, after the rerun:
    status    the rerun exits 0; every planned run is `done` (none running, pending, paused or failed); a SIGINT
              ends the first driver with 130, a SIGTERM with 143
    records   no (run, step) twice; every step 0..last stored; every evaluation of the schedule (eval_every, step
              0) stored
    compute   each run's compute within 3% of its planned compute, never falling with the step; work lost to the
              fault is not charged (docs/troubleshooting.md): no step costs more than a job's start (what step 0
              holds) plus a tenth of the plan
    clean     no process of the trial's sweeps left (Ray's, jobs', drivers'), no head file, every head's temp dir gone
    once      no two jobs of one run trained at once (trl: the jobs' record times); with two drivers, one exited 2
              with one line naming the other and the other finished

    .venv/bin/python bench/faults.py [--trials 30] [--seed 0] [--faults KIND,...] [--engines builtin,trl]
    bash .ci/run .venv/bin/python bench/faults.py ...   # with a throwaway PostgreSQL for pg_outage
"""

import argparse
import json
import os
import platform
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULT = Path(__file__).parent / "results" / "faults.json"
RLSCALE = [str(Path(sys.executable).with_name("rlscale"))]
FAULTS = (
    "driver_kill9",
    "job_kill9",
    "head_restart",
    "pg_outage",
    "sqlite_lock",
    "sigint",
    "sigterm",
    "disk_full",
    "two_drivers",
)
ENGINES = ("builtin", "trl")
COMPUTE_TOLERANCE = 0.03
LOST_BOUND = 0.1  # no step may cost more than a job's start plus this fraction of the plan (lost work not charged)
OUTAGE_SECONDS = (5.0, 30.0)
SWEEP_SECONDS = 900  # one `rlscale sweep` of a trial, at most
DISK_MIB = 256

RECIPE = {
    "model": "tiny",
    "task": "arithmetic",
    "prompts_per_batch": 8,
    "async": "sync",
    "lr": 1.0e-4,
    "lr_reference_batch": 512,
    "lr_warmup_steps": 0,
    "max_new_tokens": 8,
    "temperature": 1.0,
    "eval_every": 5,
    "eval_prompts": 32,
    "eval_samples": 2,
    "checkpoint_every": 4,
}
# what TRL expresses exactly (tests/test_trl_engine.py's recipe)
TRL_RECIPE = {
    "engine": "trl",
    "loss": "dapo",
    "loss_agg": "token",
    "adv_norm": "group",
    "zero_variance_filter": False,
    "no_positive_resampling": None,
    "length_control": "truncate",
    "trainer_devices": 1,
}
BUDGET = {"builtin": 0.01, "trl": 0.02}  # device-hours per run: builtin 2 CPUs x 18 s, trl 1 CPU x 72 s


def study_spec(engine: str) -> dict:
    """The trial's study: IsoCompute over n in {2, 4} at B_p 8, each run stopping at its measured compute."""
    return {
        "name": "faults",
        "method": "isocompute",
        "metric": "val_reward",
        "compute": {"unit": "gpu_hours", "budget": BUDGET[engine], "scope": "per_run", "profile": "tiny-cpu"},
        "seeds": 1,
        "parameters": {"rollouts": {"values": [2, 4]}},
        "recipe": {**RECIPE, **(TRL_RECIPE if engine == "trl" else {})},
    }


@dataclass
class Trial:
    """One trial's set-up and what was seen."""

    number: int
    engine: str
    fault: str
    moment_s: float  # drawn: seconds after the (first) driver started
    hold_s: float = 0.0  # drawn: how long an outage or a full disk lasts
    detail: str = ""  # what was done, e.g. "SIGKILL to 23 processes of the head"
    injected_s: float | None = None  # when it was done (None: not injected)
    first_exit: list = field(default_factory=list)  # exit codes of the drivers started first
    rerun_exit: int | None = None
    wall_s: float = 0.0
    invariants: dict = field(default_factory=dict)  # name -> True, or the first violation's text
    skipped: str = ""  # why the fault could not be injected here
    log_tail: dict = field(default_factory=dict)  # driver label -> the end of its stderr, when it exited non-zero

    @property
    def held(self) -> bool:
        return bool(self.invariants) and all(value is True for value in self.invariants.values())


class Sandbox:
    """A trial's directory, environment and store."""

    def __init__(self, trial: Trial, pg_url: str | None):
        self.trial = trial
        self.root = Path(tempfile.mkdtemp(prefix=f"faults-{trial.number:02d}-", dir="/tmp"))
        self.cache, self.shared = self.root / "cache", self.root / "shared"
        self.cache.mkdir()
        self.shared.mkdir()
        self.study = self.root / "faults.yaml"
        self.study.write_text(yaml.safe_dump(study_spec(trial.engine), sort_keys=False))
        self.schema = None
        if trial.fault == "pg_outage":
            self.url = self._pg_schema(pg_url)
        else:
            self.url = f"sqlite:///{self.root / 'store.db'}"
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RLSCALE_DB"))},
            "RLSCALE_CACHE": str(self.cache),
            "RLSCALE_SHARED_DIR": str(self.shared),
            "RLSCALE_RAY_CPUS": "4" if trial.engine == "builtin" else str(len(os.sched_getaffinity(0))),
            "COLUMNS": "100",
        }
        self.mounted = None
        if trial.fault == "disk_full":
            self.mounted = self.cache / "checkpoints" if trial.engine == "builtin" else self.shared
            self.mounted.mkdir(exist_ok=True)
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={DISK_MIB}m", "tmpfs", str(self.mounted)],
                check=True,
                capture_output=True,
            )
        self.heads: dict[str, dict] = {}  # temp_dir -> head file contents, every head seen during the trial
        self._watching = True
        self._watcher = threading.Thread(target=self._watch_heads, daemon=True)
        self._watcher.start()

    def command(self, *extra: str) -> list[str]:
        return [*RLSCALE, "sweep", str(self.study), "--db", self.url, "--out", str(self.root / "reports"), *extra]

    def spawn(self, label: str) -> subprocess.Popen:
        """`rlscale sweep STUDY --json` in a session of its own (as in its own terminal), stderr to a file."""
        with open(self.root / f"{label}.err", "wb") as err:
            return subprocess.Popen(
                self.command("--json"),
                cwd=self.root,
                env=self.env,
                start_new_session=True,
                stdout=open(self.root / f"{label}.out", "wb"),  # noqa: SIM115 (the child writes to it)
                stderr=err,
            )

    def stderr(self, label: str) -> str:
        path = self.root / f"{label}.err"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        self._watching = False
        self._watcher.join()
        if self.mounted is not None:
            subprocess.run(["umount", "-l", str(self.mounted)], capture_output=True)
        if self.schema is not None:
            self._drop_schema()
        shutil.rmtree(self.root, ignore_errors=True)

    def _watch_heads(self) -> None:
        while self._watching:
            for path in (self.cache / "ray-heads").glob("*/ray-head.json"):
                try:
                    head = json.loads(path.read_text())
                    self.heads.setdefault(head["temp_dir"], head)
                except (OSError, ValueError, KeyError):
                    pass
            time.sleep(0.3)

    def _pg_schema(self, base: str) -> str:
        from sqlalchemy import create_engine
        from sqlalchemy.engine import make_url

        self.schema = f"faults_{os.getpid()}_{self.trial.number}"
        admin = create_engine(base)
        with admin.begin() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA "{self.schema}"')
        admin.dispose()
        url = make_url(base).update_query_dict({"options": f"-csearch_path={self.schema}"})
        self.base_url = base
        return url.render_as_string(hide_password=False)

    def _drop_schema(self) -> None:
        from sqlalchemy import create_engine

        admin = create_engine(self.base_url, pool_pre_ping=True)
        try:
            with admin.begin() as conn:
                conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
        finally:
            admin.dispose()


# ------------------------------------------------------------------------------------------ processes


def processes_of(cache: Path) -> list[int]:
    """Processes started for a trial: every one carries its RLSCALE_CACHE (drivers, Ray's, jobs', vLLM's)."""
    marker = f"RLSCALE_CACHE={cache}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(children.get(current, []))
    return out


def kill_all(pids: list[int], sig=signal.SIGKILL) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def wait_exit(process: subprocess.Popen, seconds: float) -> int | None:
    try:
        return process.wait(seconds)
    except subprocess.TimeoutExpired:
        return None


# ------------------------------------------------------------------------------------------ faults


def inject(box: Sandbox, trial: Trial, drivers: list, started: float, rng: random.Random, pg_ctl: str | None):
    """Wait for the trial's moment, then do its fault; returns the second driver of two_drivers (else None)."""
    while time.monotonic() - started < trial.moment_s:
        if trial.fault != "two_drivers" and all(d.poll() is not None for d in drivers):
            trial.detail = "the sweep ended before the moment"
            return None
        time.sleep(0.1)
    trial.injected_s = round(time.monotonic() - started, 1)
    fault = trial.fault
    if fault == "driver_kill9":
        os.killpg(drivers[0].pid, signal.SIGKILL)
        trial.detail = "SIGKILL to the driver's process group"
    elif fault == "sigint":
        os.killpg(drivers[0].pid, signal.SIGINT)
        trial.detail = "SIGINT to the driver's process group"
    elif fault == "sigterm":
        os.kill(drivers[0].pid, signal.SIGTERM)
        trial.detail = "SIGTERM to the driver"
    elif fault == "two_drivers":
        second = box.spawn("second")
        trial.detail = "a second driver started"
        return second
    elif fault == "job_kill9":
        trial.detail = kill_a_job(box, trial, started, rng)
    elif fault == "head_restart":
        trial.detail = stop_the_head(box, trial, started, rng)
    elif fault == "pg_outage":
        subprocess.run([pg_ctl, "stop"], check=True, capture_output=True)
        time.sleep(trial.hold_s)
        subprocess.run([pg_ctl, "start"], check=True, capture_output=True)
        trial.detail = f"PostgreSQL stopped for {trial.hold_s:.0f} s"
    elif fault == "sqlite_lock":
        database = box.url.removeprefix("sqlite:///")
        holder = sqlite3.connect(database, timeout=120, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        time.sleep(trial.hold_s)
        holder.execute("ROLLBACK")
        holder.close()
        trial.detail = f"the store's write lock held {trial.hold_s:.0f} s"
    elif fault == "disk_full":
        filler = box.mounted / "filler"
        with open(filler, "wb", buffering=0) as out:
            try:
                while True:
                    out.write(b"\0" * (1 << 20))
            except OSError:
                pass
        time.sleep(trial.hold_s)
        filler.unlink()
        trial.detail = f"{box.mounted.name}/ full for {trial.hold_s:.0f} s"
    return None


def kill_a_job(box: Sandbox, trial: Trial, started: float, rng: random.Random) -> str:
    """SIGKILL to one job's process tree; waits (60 s at most) for a job to be running."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pids = processes_of(box.cache)
        if trial.engine == "builtin":
            jobs = [pid for pid in pids if cmdline(pid).startswith(("ray::Generator", "ray::Trainer"))]
        else:
            jobs = [pid for pid in pids if "rlscale.runner.trl" in cmdline(pid) and os.getpgid(pid) == pid]
        if jobs:
            victim = rng.choice(sorted(jobs))
            name = cmdline(victim).split()[0]
            tree = descendants(victim)
            if trial.engine == "trl":
                os.killpg(victim, signal.SIGKILL)
            kill_all(tree)
            trial.injected_s = round(time.monotonic() - started, 1)
            return f"SIGKILL to {name} and {len(tree) - 1} below it"
        time.sleep(0.5)
    return "no job running within 60 s"


def stop_the_head(box: Sandbox, trial: Trial, started: float, rng: random.Random) -> str:
    """The sweep's local head stopped: SIGTERM to `ray start` (as `ray stop` does), or SIGKILL to its processes."""
    from rlscale.runner.ray_head import LocalHead

    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        found = list((box.cache / "ray-heads").glob("*/ray-head.json"))
        if found:
            try:
                head = LocalHead(**json.loads(found[0].read_text()))
            except (OSError, ValueError, TypeError):
                time.sleep(0.3)
                continue
            trial.injected_s = round(time.monotonic() - started, 1)
            if rng.random() < 0.5:
                os.kill(head.pid, signal.SIGTERM)
                return "SIGTERM to the head's `ray start`"
            pids = head.processes()
            kill_all(pids)
            return f"SIGKILL to the head's {len(pids)} processes"
        time.sleep(0.3)
    return "no head within 90 s"


# ------------------------------------------------------------------------------------------ invariants


def check(box: Sandbox, trial: Trial, loser: tuple[int | None, str] | None) -> dict:
    """The invariants after the rerun: name -> True, or the first violation."""
    from rlscale.db.store import Store
    from rlscale.planner.planning import planned_runs
    from rlscale.planner.recipe import Recipe
    from rlscale.planner.study_file import load_study

    out = {}
    plan = {point.name: point for point in planned_runs(load_study(box.study))}
    with Store(box.url) as store:
        if "faults" not in store.study_names():
            return {"status": f"nothing stored; the rerun exited {trial.rerun_exit}"}
        runs, records = store.runs_frame("faults"), store.records_frame("faults")
    statuses = dict(zip(runs["run"], runs["status"]))
    errors = {run: str(error).splitlines()[0][:100] for run, error in zip(runs["run"], runs["error"]) if error}
    signalled = {"sigint": 130, "sigterm": 143}.get(trial.fault) if trial.injected_s is not None else None
    if trial.rerun_exit != 0:
        out["status"] = f"the rerun exited {trial.rerun_exit}: {statuses} {errors}"
    elif signalled is not None and trial.first_exit != [signalled]:
        out["status"] = f"{trial.fault} ended the sweep with {trial.first_exit}, not {signalled}"
    elif sorted(statuses) != sorted(plan) or set(statuses.values()) != {"done"}:
        out["status"] = f"statuses {statuses} {errors}"
    else:
        out["status"] = True

    out["records"] = out["compute"] = True
    for name, point in plan.items():
        mine = records[records["run"] == name].sort_values("step")
        steps = [int(s) for s in mine["step"]]
        recipe = Recipe.model_validate(runs.set_index("run").loc[name, "config"]) if name in statuses else None
        if recipe is None or not steps:
            out["records"] = f"{name}: no records"
            continue
        if mine.duplicated("step").any():
            out["records"] = f"{name}: a step stored twice"
        elif steps != list(range(steps[-1] + 1)):
            missing = sorted(set(range(steps[-1] + 1)) - set(steps))
            out["records"] = f"{name}: steps missing {missing[:5]}"
        else:
            evaluated = set(mine.dropna(subset=["val_reward"])["step"].astype(int))
            wanted = {s for s in range(steps[-1] + 1) if recipe.is_eval_step(s)}
            if wanted - evaluated:
                out["records"] = f"{name}: evaluations missing at {sorted(wanted - evaluated)[:5]}"
        if out["compute"] is not True:
            continue
        hours = mine["gpu_hours"].to_numpy(dtype=float)
        planned = point.gpu_hours
        off = hours[-1] / planned - 1
        costs = [b - a for a, b in zip(hours[:-1], hours[1:])]
        allowed = hours[0] + LOST_BOUND * planned  # a job's start (what step 0 holds) and a tenth of the plan
        if abs(off) > COMPUTE_TOLERANCE:
            out["compute"] = f"{name}: {hours[-1]:.5f} of {planned:.5f} planned ({off:+.1%})"
        elif costs and min(costs) < -1e-12:
            out["compute"] = f"{name}: compute falls after step {costs.index(min(costs))}"
        elif costs and max(costs) > allowed:
            worst = costs.index(max(costs)) + 1
            out["compute"] = f"{name}: step {worst} cost {max(costs):.5f}, more than a start + a tenth of the plan"

    left = processes_of(box.cache)
    head_files = list((box.cache / "ray-heads").glob("*/ray-head.json"))
    temp_dirs = [path for path in box.heads if Path(path).exists()]
    if left:
        out["clean"] = f"{len(left)} processes left: {cmdline(left[0])[:80]}"
    elif head_files or temp_dirs:
        out["clean"] = f"head files {len(head_files)}, head temp dirs {len(temp_dirs)} left"
    else:
        out["clean"] = True

    out["once"] = overlapping_jobs(box) or True
    if loser is not None:
        code, text = loser
        lines = text.strip().splitlines()
        if code != 2 or len(lines) != 1 or "another driver" not in lines[0]:
            out["once"] = f"second driver: exit {code}, {len(lines)} lines: {(lines or [''])[-1][:120]}"
    return out


def overlapping_jobs(box: Sandbox) -> str | None:
    """A run two of whose jobs wrote records at the same time (trl: each job its own log of timed lines)."""
    for run_dir in box.shared.iterdir() if box.shared.exists() else []:
        spans = []
        for log in sorted((run_dir / "logs").glob("*.jsonl")):
            times = []
            for line in log.read_text(errors="replace").splitlines():
                try:
                    times.append(float(json.loads(line)["time"]))
                except (ValueError, KeyError, TypeError):
                    continue
            if times:
                spans.append((min(times), max(times), log.stem))
        spans.sort()
        for (_, end, first), (start, _, second) in zip(spans, spans[1:]):
            if start < end:
                return f"jobs {first} and {second} of one run trained at once"
    return None


# ------------------------------------------------------------------------------------------ one trial


def run_trial(
    trial: Trial, pg_url: str | None, pg_ctl: str | None, rng: random.Random, keep: Path | None = None
) -> Trial:
    if trial.fault == "pg_outage" and not (pg_url and pg_ctl):
        trial.skipped = "no PostgreSQL server to stop (run under .ci/run)"
        return trial
    started_wall = time.monotonic()
    box = Sandbox(trial, pg_url)
    try:
        drivers = [box.spawn("first")]
        started = time.monotonic()
        second = None
        if trial.fault != "none":
            second = inject(box, trial, drivers, started, rng, pg_ctl)
        loser = None
        for label, driver in (("first", drivers[0]), ("second", second)):
            if driver is None:
                continue
            code = wait_exit(driver, SWEEP_SECONDS)
            if code is None:  # a driver that does not end is a violation: stop it to go on
                os.killpg(driver.pid, signal.SIGKILL)
                code = "timeout"
            trial.first_exit.append(code)
            if code not in (0, -signal.SIGKILL):
                trial.log_tail[label] = box.stderr(label)[-1500:]
            if trial.fault == "two_drivers" and code == 2:
                loser = (code, box.stderr(label))
        if trial.fault == "two_drivers" and loser is None:
            loser = (trial.first_exit[-1], box.stderr("second"))
        rerun = box.spawn("rerun")
        trial.rerun_exit = wait_exit(rerun, SWEEP_SECONDS)
        if trial.rerun_exit is None:  # a rerun that does not end is a violation: stop it to go on
            os.killpg(rerun.pid, signal.SIGKILL)
            trial.rerun_exit = "timeout"
        if trial.rerun_exit != 0:
            trial.log_tail["rerun"] = box.stderr("rerun")[-1500:]
        time.sleep(1.0)  # the head's last processes exit a moment after the driver
        trial.invariants = check(box, trial, loser)
    finally:
        kill_all(processes_of(box.cache))
        if keep is not None and not trial.held:  # what a broken trial left, for a look
            shutil.copytree(box.root, keep / box.root.name, symlinks=True, ignore_dangling_symlinks=True)
        box.close()
        trial.wall_s = round(time.monotonic() - started_wall, 1)
    return trial


# ------------------------------------------------------------------------------------------ the campaign


def plan_trials(count: int, seed: int, faults: list[str], engines: list[str], durations: dict) -> list[Trial]:
    """Trial i: fault i mod len(faults), engine by turns per pass over the faults (so each fault meets every
    engine), moment and hold drawn from the seed."""
    rng = random.Random(seed)
    trials = []
    for number in range(count):
        fault = faults[number % len(faults)]
        engine = engines[(number // len(faults)) % len(engines)]
        low, high = 3.0, max(6.0, 0.85 * durations[engine])
        trials.append(
            Trial(
                number,
                engine,
                fault,
                moment_s=round(rng.uniform(low, high), 1),
                hold_s=round(rng.uniform(*OUTAGE_SECONDS), 1),
            )
        )
    return trials


def row(trial: Trial) -> str:
    """One line, within 80 columns: trial, engine, fault, moment, exit codes, invariants held."""
    if trial.skipped:
        return f"{trial.number:>2} {trial.engine:7s} {trial.fault:12s} skipped: {trial.skipped}"[:80]
    marks = "".join(
        "." if trial.invariants.get(name) is True else "x" for name in ("status", "records", "compute", "clean", "once")
    )
    moment = f"{trial.injected_s:5.1f}" if trial.injected_s is not None else "    -"
    first = ",".join(str(code) for code in trial.first_exit)
    held = "held" if trial.held else "BROKEN"
    return (
        f"{trial.number:>2} {trial.engine:7s} {trial.fault:12s} {moment} s  first {first:7s} "
        f"rerun {trial.rerun_exit!s:4s} {marks}  {held:6s} {trial.wall_s:4.0f} s"
    )[:80]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--faults", default=",".join(FAULTS), help="comma-separated kinds (default: all)")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--out", type=Path, default=RESULT)
    parser.add_argument("--no-control", action="store_true", help="skip the fault-free sweeps; moments up to 60 s")
    parser.add_argument("--keep", type=Path, help="copy the directory of every trial that broke an invariant here")
    args = parser.parse_args()
    faults, engines = args.faults.split(","), args.engines.split(",")
    unknown = sorted(set(faults) - set(FAULTS)) + sorted(set(engines) - set(ENGINES))
    if unknown:
        sys.exit(f"error: unknown fault or engine: {', '.join(unknown)}")
    pg_url, pg_ctl = os.environ.get("RLSCALE_TEST_PG_URL"), os.environ.get("RLSCALE_TEST_PG_CTL")
    # started in the background, this process ignores SIGINT and so would every driver: Ctrl-C in a terminal is not
    signal.signal(signal.SIGINT, signal.default_int_handler)
    began = time.time()

    if not args.no_control:
        print("control: one sweep per engine with no fault (its wall time bounds the moments)", flush=True)
    controls, durations = [], dict.fromkeys(engines, 70.0)
    for number, engine in enumerate([] if args.no_control else engines):
        control = run_trial(Trial(-1 - number, engine, "none", moment_s=0.0), pg_url, pg_ctl, random.Random(0))
        controls.append(control)
        durations[engine] = control.wall_s / 2  # the first sweep; the rerun has nothing left to do
        print(row(control), flush=True)

    print("trial engine  fault        moment   first   rerun  invariants", flush=True)
    print("(invariants: status records compute clean once; . held, x broken)", flush=True)
    trials = plan_trials(args.trials, args.seed, faults, engines, durations)
    rng = random.Random(args.seed + 1)
    summary = write_summary(args, engines, controls, [], len(trials), began)
    for done, trial in enumerate(trials, 1):
        run_trial(trial, pg_url, pg_ctl, rng, args.keep)
        print(row(trial), flush=True)
        for name, value in trial.invariants.items():
            if value is not True:
                print(f"   {name}: {value}"[:80], flush=True)
        summary = write_summary(args, engines, controls, trials[:done], len(trials), began)  # a cut campaign counts

    print(f"\n{summary['held']} of {summary['injected']} injected trials held every invariant", flush=True)
    for fault, entry in summary["by_fault"].items():
        engines_seen = ", ".join(f"{name} {n}" for name, n in entry["engines"].items())
        skipped = f", {entry['skipped']} not injected" if entry["skipped"] else ""
        print(f"  {fault:12s} {entry['held']}/{entry['trials'] - entry['skipped']} held ({engines_seen}{skipped})")
    print(f"wall time {summary['wall_seconds']} s; wrote {args.out}")


def write_summary(args, engines, controls, trials, planned: int, began: float) -> dict:
    """bench/results/faults.json for the trials run so far (of `planned`), rewritten after each trial."""
    by_fault = {}
    for trial in trials:
        entry = by_fault.setdefault(trial.fault, {"trials": 0, "held": 0, "skipped": 0, "engines": {}})
        entry["trials"] += 1
        entry["skipped"] += bool(trial.skipped)
        entry["held"] += trial.held
        entry["engines"][trial.engine] = entry["engines"].get(trial.engine, 0) + 1
    injected = [trial for trial in trials if not trial.skipped]
    summary = {
        "command": "bench/faults.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "host": {"cpus": len(os.sched_getaffinity(0)), "machine": platform.machine(), "load": os.getloadavg()},
        "seed": args.seed,
        "wall_seconds": round(time.time() - began),
        "study": {engine: study_spec(engine) for engine in engines},
        "controls": [asdict(control) | {"held": control.held} for control in controls],
        "trials": [asdict(trial) | {"held": trial.held} for trial in trials],
        "by_fault": by_fault,
        "held": sum(trial.held for trial in injected),
        "injected": len(injected),
        "trials_run": len(trials),
        "trials_planned": planned,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1, default=str) + "\n")
    return summary


if __name__ == "__main__":
    main()
