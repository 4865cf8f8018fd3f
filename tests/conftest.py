import csv
import gc
import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from rlscale.fitting.sigmoid import sigmoid
from rlscale.planner.recipe import Recipe
from rlscale.runner.engine import DevicesUnavailable, Engine, JobResult
from rlscale.runner.ray_head import WORKER_NICENESS_ENV, LocalHead, start_head

# every Ray cluster the tests start runs its workers at normal priority, as the clusters rlscale starts do: at Ray's
# nice 15 a busy host starves them and a test then races the host's load
os.environ.update(WORKER_NICENESS_ENV)


def pytest_collection_modifyitems(config, items):
    # In CI every backend must be there: a missing PostgreSQL is a failure, not a skip.
    if os.environ.get("CI") and not os.environ.get("RLSCALE_TEST_PG_URL"):
        raise pytest.UsageError("CI is set but RLSCALE_TEST_PG_URL is not: .ci/run must start PostgreSQL")


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """Run in a fresh directory with a private cache and the default (SQLite) store inside it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLSCALE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("RLSCALE_DB", raising=False)
    return tmp_path


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request, tmp_path):
    """A URL to an empty database: a fresh SQLite file, or a fresh PostgreSQL schema dropped afterwards."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    base = os.environ.get("RLSCALE_TEST_PG_URL")
    if not base:
        pytest.skip("RLSCALE_TEST_PG_URL is not set (CI sets it; see .ci/run)")
    schema = f"rlscale_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base, pool_pre_ping=True)  # a test may restart the server meanwhile
    with admin.begin() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    # the schema goes first on the search path, so the store (and alembic's version table) live in it
    url = make_url(base).update_query_dict({"options": f"-csearch_path={schema}"})
    yield url.render_as_string(hide_password=False)
    gc.collect()  # close pooled connections of stores the test dropped
    with admin.begin() as conn:
        conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
    admin.dispose()


@pytest.fixture
def store(db_url):
    from rlscale.db.store import Store

    with Store(db_url) as store:
        yield store


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """Run `rlscale ARGS` in-process, as the console script does: (exit code, stdout, stderr)."""
    from rlscale.cli import main

    monkeypatch.setattr(sys, "argv", ["rlscale", *map(str, args)])
    try:
        main()
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def cli(monkeypatch, capsys):
    """`cli("fit", "x.csv", "--json")` -> (exit code, stdout, stderr), in-process."""
    return lambda *args: run_cli(monkeypatch, capsys, *args)


def spawn(args: list[str], log: Path, **options) -> subprocess.Popen:
    """Start `args` in a process group of its own, its stderr into the file `log`: a pipe nobody reads while the
    process runs fills up (64 KiB) and blocks it."""
    with open(log, "ab") as stderr:
        return subprocess.Popen(args, start_new_session=True, stdout=subprocess.DEVNULL, stderr=stderr, **options)


def tail(log: Path, chars: int = 2000) -> str:
    """The last `chars` characters of a spawned process's stderr."""
    return log.read_text(errors="replace")[-chars:] if log.exists() else ""


def _start_head(env: dict | None = None, *, cpus: int = 4, gpus: int = 8) -> LocalHead:
    """A Ray head (rlscale.runner.ray_head.start_head) with token auth off on loopback, `cpus` CPUs and `gpus` logical
    GPUs (Ray places and releases GPU requests on them as on real ones); returns once a job can be submitted (the
    job agent comes up a few seconds after the dashboard)."""
    environment = {"RAY_AUTH_MODE": "disabled", **(env or {})}  # Ray 2.60 asks a token otherwise
    head = start_head(cpus=cpus, gpus=gpus, env=environment)
    probe = (
        "from ray.job_submission import JobSubmissionClient; import sys; "
        "JobSubmissionClient(sys.argv[1]).submit_job(entrypoint='true', submission_id='probe')"
    )
    deadline = time.time() + 120
    while True:
        done = subprocess.run(
            [sys.executable, "-c", probe, head.address], env={**os.environ, **environment}, capture_output=True
        )
        if done.returncode == 0:
            return head
        if time.time() > deadline or not head.running():
            head.stop()
            raise RuntimeError(f"Ray's Jobs API did not come up: {done.stderr.decode(errors='replace')[-2000:]}")
        time.sleep(0.5)


@pytest.fixture(scope="session")
def cluster():
    """A Ray head with the Jobs API shared by the tests that submit jobs (tests/verl_standin.py's, TRL's); yields
    its address."""
    head = _start_head()
    try:
        yield head.address
    finally:
        head.stop()


@pytest.fixture
def start_ray_head():
    """start(env) -> the address of a head of the test's own (e.g. with token authentication); stopped after."""
    heads = []

    def start(env: dict | None = None) -> str:
        heads.append(_start_head(env))
        return heads[-1].address

    yield start
    for head in heads:
        head.stop()


class PacedEngine(Engine):
    """Steps of `seconds` each, a checkpoint (and its records) every 2 steps, resumable; the first call for lr 1e-4
    finds its devices taken (this test isolates the driver's queue from Ray on purpose). Thread-safe: the driver
    calls it from a thread per run."""

    name = "paced"

    def __init__(self, seconds: float = 0.0):
        self.seconds = seconds
        self.calls: list[float] = []
        self.reached: dict[str, int] = {}
        self.lock = threading.Lock()
        self.in_flight = self.most_in_flight = 0

    def run(self, recipe, *, run_key, on_records, until_step=None, should_stop=None, progress=None):
        with self.lock:
            self.calls.append(recipe.lr)
            if recipe.lr == 1e-4 and self.calls.count(1e-4) == 1:
                raise DevicesUnavailable("Total available GPUs 0 is less than total desired GPUs 2")
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            start = self.reached.get(run_key, -1) + 1
            last = until_step or recipe.steps
            for step in range(start, last + 1):
                time.sleep(self.seconds)
                if step % 2 == 0 or step == last:
                    on_records(
                        [
                            {
                                "step": s,
                                "gpu_hours": 0.01 * s,
                                "rollouts": s,
                                "tokens": 0,
                                "val_reward": 0.5 if s % 2 == 0 else None,
                                "metrics": {},
                            }
                            for s in range(self.reached.get(run_key, -1) + 1, step + 1)
                        ]
                    )
                    self.reached[run_key] = step
            return JobResult(steps=self.reached[run_key])
        finally:
            with self.lock:
                self.in_flight -= 1


@pytest.fixture
def paced_engine():
    """PacedEngine(seconds): an engine whose runs take `seconds` a step and store records at checkpoints, with no
    Ray (a test that isolates the sweep driver from the jobs on purpose)."""
    return PacedEngine


# ------------------------------------------------------------------------------------------ shared test helpers
# (test modules import these from conftest; no test module imports another)

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("optimal_n_recovery", ROOT / "bench" / "optimal_n_recovery.py")
bench = importlib.util.module_from_spec(_spec)  # synthetic IsoCompute studies with a known n*
_spec.loader.exec_module(bench)


def seed_isocompute(url, name, truth, c_obs, prompts=(16, 32), fit=None):
    """Store a synthetic IsoCompute study (runs and records) and return nothing. fit: the study's `fit` section."""
    from rlscale.db.store import Store
    from rlscale.planner.study_file import parse_study

    runs, records = bench.synthetic_study(truth, c_obs, prompts=prompts)
    spec = parse_study(
        {
            "name": name,
            "method": "isocompute",
            "compute": {"unit": "gpu_hours", "budget": c_obs, "profile": "tiny-cpu"},
            "parameters": {
                "prompts_per_batch": {"values": list(prompts)},
                "rollouts": {"values": list(bench.ROLLOUTS)},
            },
            **({"fit": fit} if fit else {}),
        },
        file="test",
    ).to_spec()
    store = Store(url)
    store.upsert_study(name, spec)
    for run in runs.to_dict("records"):
        config = Recipe(prompts_per_batch=run["prompts_per_batch"], rollouts=run["rollouts"]).to_json()
        run_id = store.ensure_run(name, run["run"], config)
        mine = records[records["run"] == run["run"]]
        store.add_records(
            run_id,
            [
                {
                    "step": r.step,
                    "gpu_hours": r.gpu_hours,
                    "val_reward": r.val_reward,
                    "metrics": {"truncation_rate": r.truncation_rate},
                }
                for r in mine.itertuples()
            ],
        )
        store.set_run_status(run_id, "done")
    store.close()


# true asymptotes of the synthetic LOO study (seed_loo): only the DAPO revert is beyond the 0.02 noise band
TRUE_A = {"baseline": 0.62, "dapo_loss": 0.52, "sample_average": 0.617, "no_fp32_head": 0.612}


def seed_loo(url: str, sweep_names: bool = False) -> str:
    """Store the runs of studies/scalerl_loo.yaml with synthetic records; returns the study name. sweep_names:
    name the runs as a sweep does (`<variant>/s<seed>`, the study has 3 seeds)."""
    from rlscale.db.store import Store
    from rlscale.planner.planning import plan_study
    from rlscale.planner.study_file import load_study
    from rlscale.runner.sweep.state import run_name

    study = load_study(ROOT / "studies" / "scalerl_loo.yaml")
    store = Store(url)
    store.upsert_study(study.name, study.to_spec())
    rng = np.random.default_rng(0)
    budget = study.compute.budget
    for run in plan_study(study).runs:
        A = TRUE_A.get(run.name, 0.615)
        name = run_name(run, several_seeds=True) if sweep_names else run.name
        run_id = store.ensure_run(study.name, name, run.recipe.to_json(), seed=run.seed)
        steps = np.arange(0, 201, 5)
        hours = budget * steps / steps[-1]
        reward = rng.binomial(4096, sigmoid(hours, A, 1.6, budget / 15, 0.1)) / 4096  # the plateau is seen
        store.add_records(
            run_id,
            [
                {"step": int(s), "gpu_hours": float(h), "val_reward": float(r), "metrics": {"truncation_rate": 0.01}}
                for s, h, r in zip(steps, hours, reward)
            ],
        )
        store.set_run_status(run_id, "done")
    store.close()
    return study.name


NAMES = [
    "qwen2.5-7b/lr=1e-6,bs=256",  # verl / W&B group names
    "GRPO (clip 0.2)",
    "dainty-sun-42",  # a W&B default
    "grpo/seed_1",  # a TensorBoard subdirectory
    "[bold]x[/bold]",  # Rich markup, shown literally
    "Модель α, 温度 0.7",  # non-ASCII letters
    "cost $5 *draft* _v2",  # mathtext and markdown punctuation
    "r" * 200,  # the longest a name may be
]


def curves_csv(path, names, *, points: int = 25) -> None:
    """One clean sigmoid per name, asymptotes 0.5, 0.53, ... (csv quotes the commas)."""
    compute = np.geomspace(10, 2000, points)
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["run", "compute", "reward"])
        for i, name in enumerate(names):
            for c, r in zip(compute, sigmoid(compute, 0.5 + 0.03 * i, 1.5, 300.0, 0.1)):
                out.writerow([name, f"{c:.4f}", f"{r:.5f}"])


def script_argv(text: str, tmp_path: Path) -> list[str]:
    """The argv bash passes to `python3 -m MODULE` when it runs an exported script (python3 is a stand-in that
    prints its argv), without the `-m MODULE`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "python3"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    fake.chmod(0o755)
    script = tmp_path / "export.sh"
    script.write_text(text)
    done = subprocess.run(
        ["bash", str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
    )
    assert done.returncode == 0, done.stderr
    argv = json.loads(done.stdout)
    assert argv[0] == "-m"
    return argv[2:]


REWARD = "val-core/openai/gsm8k/reward/mean@1"


def write_events(directory, steps: dict[int, dict[str, float]], *, suffix: str = ""):
    """One event file in `directory` with the given scalars per step, as tensorboard's writer stores them."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(directory), filename_suffix=suffix)
    for step, scalars in steps.items():
        values = [summary_pb2.Summary.Value(tag=tag, simple_value=value) for tag, value in scalars.items()]
        writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=values)))
    writer.close()
    return next(p for p in directory.iterdir() if p.name.endswith(suffix) and "tfevents" in p.name)


def python_of(env: str) -> Path:
    """The Python of a checker venv (scripts/checker_envs.sh); a failure in CI, a skip elsewhere, when it is missing."""
    python = ROOT / env / "bin" / "python"
    if not python.exists():
        message = f"{env} is missing: run scripts/checker_envs.sh (make setup builds it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return python


# ------------------------------------------------------------------ the TRL engine's end-to-end tests
# `python -c TRL_DRIVER STUDY_FILE DB_URL RAY_ADDRESS SHARED_DIR`: the sweep as `rlscale sweep` runs it
TRL_DRIVER = textwrap.dedent("""
    import sys
    from rlscale.db.store import Store
    from rlscale.planner.study_file import load_study
    from rlscale.runner.sweep.driver import SweepDriver
    study_file, url, address, shared = sys.argv[1:]
    options = {"trl": {"shared_dir": shared, "poll_seconds": 0.2}}
    with Store(url) as store:
        SweepDriver(load_study(study_file), store, ray_address=address, engine_options=options).run()
""")


def kill_driver_when(args: list[str], url: str, study: str, reached, *, env: dict | None = None, seconds: float = 300):
    """Start the driver `args` (stderr to driver.log beside the store) and kill -9 its process group once
    `reached(records of study)` holds; fails if the driver ends first or `seconds` pass."""
    from rlscale.db.store import Store

    store_file = Path(url.removeprefix("sqlite:///"))
    log = store_file.with_name("driver.log")
    driver = spawn(args, log, env=env)
    try:
        deadline = time.time() + seconds
        while time.time() < deadline and driver.poll() is None:
            if store_file.exists():
                with Store(url) as store:
                    records = store.records_frame(study) if study in store.study_names() else []
                if len(records) and reached(records):
                    break
            time.sleep(0.3)
        assert driver.poll() is None, f"the driver ended before it could be killed: {tail(log)}"
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()


def kill_driver_past(
    args: list[str], url: str, study: str, cluster: str, *, step: int = 3, env: dict | None = None, seconds: float = 300
) -> list[str]:
    """Start the driver `args`, kill -9 its process group once a record of `study` reaches `step` (past the
    checkpoint at step 2), then stop its running jobs as a lost node would; returns those jobs' submission ids."""
    from ray.job_submission import JobSubmissionClient

    kill_driver_when(args, url, study, lambda records: records["step"].max() >= step, env=env, seconds=seconds)
    client = JobSubmissionClient(cluster)
    stopped = [
        j.submission_id
        for j in client.list_jobs()
        if j.submission_id.startswith(f"{study}-") and str(j.status.value) in ("PENDING", "RUNNING")
    ]
    for job in stopped:
        client.stop_job(job)
    while any(str(client.get_job_status(job).value) in ("PENDING", "RUNNING") for job in stopped):
        time.sleep(0.2)
    return stopped
