import gc
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from rlscale.runner.engine import DevicesUnavailable, Engine, JobResult


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


RAY = Path(sys.executable).with_name("ray")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_head(env: dict | None = None, *, cpus: int = 4, gpus: int = 8) -> tuple[subprocess.Popen, str, Path]:
    """A Ray head on loopback with the dashboard (the Jobs API), `gpus` logical GPUs (Ray places and releases GPU
    requests on them as on real ones), in its own temp dir and process group; returns once a job can be submitted."""
    temp = Path(tempfile.mkdtemp(prefix="rv", dir="/tmp"))
    port, dashboard, agent, agent_grpc, runtime_env, metrics = (_free_port() for _ in range(6))
    environment = {**os.environ, "RAY_AUTH_MODE": "disabled", **(env or {})}  # loopback; Ray 2.60 asks a token
    head = subprocess.Popen(
        [str(RAY), "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1",
         "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}", "--include-dashboard=true",
         # every port of its own: another Ray cluster on this machine (a parallel test) holds the defaults
         f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={agent_grpc}",
         f"--runtime-env-agent-port={runtime_env}", f"--metrics-export-port={metrics}",
         f"--num-cpus={cpus}", f"--num-gpus={gpus}", f"--temp-dir={temp}", "--disable-usage-stats"],
        start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=environment)
    address = f"http://127.0.0.1:{dashboard}"
    probe = ("from ray.job_submission import JobSubmissionClient; import sys; "
             "JobSubmissionClient(sys.argv[1]).submit_job(entrypoint='true', submission_id='probe')")
    deadline = time.time() + 120
    while True:  # up when the job agent takes a job (the dashboard answers a few seconds before that)
        if subprocess.run([sys.executable, "-c", probe, address], env=environment,
                          capture_output=True).returncode == 0:
            return head, address, temp
        if time.time() > deadline or head.poll() is not None:
            _stop_head(head, temp)
            raise RuntimeError(f"Ray's Jobs API did not come up: {head.stderr.read()[-2000:]}")
        time.sleep(0.5)


def _stop_head(head: subprocess.Popen, temp: Path) -> None:
    try:
        os.killpg(head.pid, signal.SIGTERM)
        head.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(head.pid, signal.SIGKILL)
        head.wait()
    except ProcessLookupError:
        pass
    shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster():
    """A Ray head with the Jobs API shared by the tests that submit jobs (tests/verl_standin.py's, TRL's); yields
    its address."""
    head, address, temp = _start_head()
    try:
        yield address
    finally:
        _stop_head(head, temp)


@pytest.fixture
def start_ray_head():
    """start(env) -> the address of a head of the test's own (e.g. with token authentication); stopped after."""
    heads = []

    def start(env: dict | None = None) -> str:
        head, address, temp = _start_head(env)
        heads.append((head, temp))
        return address

    yield start
    for head, temp in heads:
        _stop_head(head, temp)


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
                    on_records([{"step": s, "gpu_hours": 0.01 * s, "rollouts": s, "tokens": 0,
                                 "val_reward": 0.5 if s % 2 == 0 else None, "metrics": {}}
                                for s in range(self.reached.get(run_key, -1) + 1, step + 1)])
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
