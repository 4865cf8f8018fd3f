"""Reaching a Ray cluster the way Ray's own clients do, and a local head for sweeps that name none.

A sweep of the Jobs-API engines (verl, trl) without --ray-address or RAY_ADDRESS starts a Ray head on this machine
with the Jobs API (loopback only, ports of its own, this host's cores and GPUs), as builtin starts its local Ray,
and stops it when the sweep ends. Its address is kept in <shared_dir>/ray-head.json: a driver restarted after
kill -9 adopts the head and the jobs still running on it instead of starting a second one beside them.
"""

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rlscale.runner.cluster import WORKER_NICENESS_ENV

from rlscale.base.errors import UserError

HEAD_FILE = "ray-head.json"
START_SECONDS = 180.0  # a head with its dashboard and job agent takes 5-30 s on 2 busy cores


def jobs_client(address: str | None):
    """A JobSubmissionClient for the cluster at `address` (the dashboard, http://HEAD:8265; RAY_ADDRESS when None).
    A token is used as `ray.init` and `ray start` find one (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token)
    when RAY_AUTH_MODE is unset. UserError (one line: why, and what to set) when the cluster cannot be reached."""
    from ray._private.authentication.authentication_token_setup import maybe_enable_token_auth_if_token_available
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    quiet = logging.getLogger("ray._private.authentication.authentication_token_setup")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # Ray says it found a token: true, and not a line the user needs
    try:
        maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    finally:
        quiet.setLevel(level)
    shown = address or os.environ.get("RAY_ADDRESS") or "RAY_ADDRESS"
    try:
        return JobSubmissionClient(address)
    except AuthenticationError as err:
        first = str(err).splitlines()[0]
        raise UserError(
            f"the Ray cluster at {shown} refused this client ({first}); set RAY_AUTH_TOKEN (or "
            "RAY_AUTH_TOKEN_PATH) to the cluster's token",
            field="--ray-address",
        ) from None
    except ConnectionError as err:
        first = str(err).splitlines()[0]
        raise UserError(
            f"cannot reach a Ray cluster at {shown} ({first}); start one (`ray start --head`) and pass "
            "its dashboard address, e.g. --ray-address http://HEAD:8265, or leave --ray-address out to "
            "start one here",
            field="--ray-address",
        ) from None


@dataclass
class LocalHead:
    """A Ray head this sweep started (or adopted): its Jobs API address, the process group to stop, its temp dir."""

    address: str
    pid: int
    temp_dir: str

    def alive(self) -> bool:
        """The head's process runs and its Jobs API answers (with the token Ray's clients would use)."""
        if not _running(self.pid):
            return False
        try:
            jobs_client(self.address).list_jobs()
        except Exception:  # not up (yet), or gone
            return False
        return True

    def ready(self) -> bool:
        """Alive, and the dashboard reports the head node's devices (what admission reads)."""
        from rlscale.runner.cluster import dashboard_nodes

        try:
            return bool(self.alive() and dashboard_nodes(jobs_client(self.address)))
        except Exception:  # the dashboard's first report is a few seconds behind the Jobs API
            return False

    def stop(self, head_file: Path | None = None) -> None:
        """Stop the head and every process it started; forget it. `ray start` shuts its cluster down on SIGTERM
        (~2 s); SIGTERM to its whole group instead leaves it waiting on children already gone (30 s and more)."""
        for kill, sig, wait in ((os.kill, signal.SIGTERM, 30.0), (os.killpg, signal.SIGKILL, 10.0)):
            try:
                kill(self.pid, sig)
            except OSError:
                continue  # the head is gone; its group may still hold leftovers (the dashboard's forkserver)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and _running(self.pid):
                time.sleep(0.2)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        if head_file is not None:
            head_file.unlink(missing_ok=True)


def local_head(shared_dir: Path) -> LocalHead:
    """The local head recorded in `shared_dir` if it is still alive, else a new one (recorded there)."""
    head_file = shared_dir / HEAD_FILE
    try:
        recorded = LocalHead(**json.loads(head_file.read_text()))
    except (OSError, ValueError, TypeError):
        recorded = None
    if recorded is not None and recorded.alive():
        return recorded
    head = start_head()
    head_file.parent.mkdir(parents=True, exist_ok=True)
    partial = head_file.with_name(head_file.name + ".partial")
    partial.write_text(json.dumps(asdict(head)))
    partial.replace(head_file)
    return head


def start_head() -> LocalHead:
    """`ray start --head` on loopback with the dashboard and job agent, in a process group of its own (so it outlives
    a killed driver), this host's cores; returns once the Jobs API answers."""
    ray = Path(sys.executable).with_name("ray")
    temp = tempfile.mkdtemp(prefix="rlscale-ray-", dir="/tmp")  # short: Ray's socket paths have a length limit
    port, dashboard, agent, agent_grpc, runtime_env, metrics = _free_ports(6)
    cores = len(os.sched_getaffinity(0))
    log = open(Path(temp) / "head.log", "wb")  # noqa: SIM115 (the head writes to it while it runs)
    head = subprocess.Popen(
        [
            str(ray),
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--node-ip-address=127.0.0.1",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dashboard}",
            "--include-dashboard=true",
            f"--dashboard-agent-listen-port={agent}",
            f"--dashboard-agent-grpc-port={agent_grpc}",
            f"--runtime-env-agent-port={runtime_env}",
            f"--metrics-export-port={metrics}",
            f"--num-cpus={cores}",
            f"--temp-dir={temp}",
            "--disable-usage-stats",
        ],
        start_new_session=True,
        env={**os.environ, **WORKER_NICENESS_ENV},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    local = LocalHead(f"http://127.0.0.1:{dashboard}", head.pid, temp)
    deadline = time.monotonic() + START_SECONDS
    while not local.ready():
        if head.poll() is not None or time.monotonic() > deadline:
            tail = (Path(temp) / "head.log").read_text(errors="replace").strip().splitlines()[-1:]
            local.stop()
            raise UserError(
                f"could not start a local Ray head ({tail[0][:200] if tail else 'no output'}); start "
                "one yourself and pass --ray-address",
                field="--ray-address",
            )
        time.sleep(0.5)
    return local


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _running(pid: int) -> bool:
    """Whether the process runs (a child of this process that ended is reaped, not counted as running)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:  # not our child: a head adopted from an earlier driver
        pass
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True
