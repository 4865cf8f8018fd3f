import gc
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest
from helpers import run_cli
from rlscale.runner.engine import DevicesUnavailable, Engine, JobResult
from rlscale.runner.ray_head import WORKER_NICENESS_ENV, LocalHead, start_head

# every Ray cluster the tests start runs its workers at normal priority, as the clusters rlscale starts do: at Ray's
# nice 15 a busy host starves them and a test then races the host's load
os.environ.update(WORKER_NICENESS_ENV)


def pytest_collection_modifyitems(config, items):
    # In CI every backend must be there: a missing PostgreSQL is a failure, not a skip.
    if os.environ.get("CI") and not os.environ.get("RLSCALE_TEST_PG_URL"):
        raise pytest.UsageError("CI is set but RLSCALE_TEST_PG_URL is not: .ci/run must start PostgreSQL")
    # the slow end-to-end tests first (file order kept within each group): with `--dist worksteal` the quick ones
    # then fill both workers to the end, instead of one worker finishing a long test alone
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


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


@pytest.fixture
def cli(monkeypatch, capsys):
    """`cli("fit", "x.csv", "--json")` -> (exit code, stdout, stderr), in-process."""
    return lambda *args: run_cli(monkeypatch, capsys, *args)


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

    def run(self, recipe, *, run_key, on_records, until_step=None, should_stop=None, progress=None, **_):
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
