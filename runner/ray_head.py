"""The one local Ray head (a sweep with no cluster named, the tests, the benchmarks) and how this process reaches a
cluster; a head file lets a driver restarted after kill -9 adopt the head and its jobs."""

import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from rlscale.base.errors import UserError, first_line
from rlscale.base.files import write_whole

HEAD_FILE = "ray-head.json"
START_SECONDS = 300.0  # a head with its dashboard and job agent takes 5-30 s on 2 busy cores
START_ATTEMPTS = 6  # `ray start` gives up when its raylet is not registered in 30 s (twice running on a busy CI host)
RETRY_SECONDS = 60.0  # an attempt needs this long; with less left, the first failure's cause is the one reported
CPUS_ENV = "RLSCALE_RAY_CPUS"  # logical CPUs a local head advertises (default: this host's cores)
# Ray's workers run at nice 15, starved by any busy process on a shared host (measured: 30-50x slower steps)
WORKER_NICENESS_ENV = {"RAY_worker_niceness": "0"}


def local_cpus() -> int:
    """CPUs a local head advertises: RLSCALE_RAY_CPUS (UserError unless an integer > 0), else this process's cores."""
    text = os.environ.get(CPUS_ENV, "").strip()
    if not text:
        return len(os.sched_getaffinity(0))
    if not text.isdigit() or int(text) < 1:
        raise UserError(f"expected a positive whole number of CPUs, got {text!r}", field=CPUS_ENV)
    return int(text)


def use_token_if_any() -> None:
    """Use a Ray token the way `ray.init` and `ray start` find one (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH,
    ~/.ray/auth_token) when RAY_AUTH_MODE is unset, in this process and the processes it starts."""
    from ray._private.authentication.authentication_token_setup import maybe_enable_token_auth_if_token_available

    quiet = logging.getLogger("ray._private.authentication.authentication_token_setup")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # Ray says it found a token: true, and not a line the user needs
    try:
        maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    finally:
        quiet.setLevel(level)


def jobs_client(address: str | None):
    """A JobSubmissionClient for the dashboard at `address` (RAY_ADDRESS when None) with the token Ray's clients would
    use; UserError (why, and what to set) when the cluster cannot be reached."""
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    use_token_if_any()
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


def connect(address: str | None, *, cpus: int | None = None) -> "LocalHead | None":
    """Connect this process's Ray driver to the GCS at `address` (or RAY_ADDRESS), else to a local head started here,
    returned for `disconnect`; never Ray's own fallback (/tmp/ray/ray_current_cluster, possibly long dead)."""
    import ray
    from ray._private import auto_init_hook

    # a Ray call after disconnect (a run's thread as Ctrl-C ends the sweep) must raise, not start a local instance
    # whose processes share this driver's process group and die with it
    auto_init_hook.enable_auto_connect = False
    address = address or os.environ.get("RAY_ADDRESS") or None
    head = None if address else start_head(cpus=max(local_cpus(), cpus or 0))
    use_token_if_any()
    kept = signal.getsignal(signal.SIGTERM)  # ray.init puts its own (sys.exit) in place of the process's
    try:
        ray.init(address=head.gcs_address if head else address, log_to_driver=False, logging_level="ERROR")
    except (ConnectionError, ray.exceptions.AuthenticationError) as err:
        if head is not None:
            head.stop()
        raise UserError(
            f"cannot join the Ray cluster at {address} ({str(err).splitlines()[0]}); "
            "check --ray-address, and RAY_AUTH_TOKEN for a cluster with token auth",
            field="--ray-address",
        ) from None
    finally:
        if threading.current_thread() is threading.main_thread() and kept is not None:
            signal.signal(signal.SIGTERM, kept)
    return head


PROBE_SECONDS = 10.0  # a head's GCS (or client server) accepts a TCP connection well within this


def check_driver_address(address: str, *, field: str = "--ray-address") -> None:
    """UserError (why, what to pass) unless `address`, where a Ray driver joins a cluster (HOST:PORT of its GCS,
    ray://HOST:PORT, or auto), accepts a connection within PROBE_SECONDS; a sweep checks before it stores anything
    (`ray.init` would wait 60 s, then end the process). field: where the address came from (RAY_ADDRESS)."""
    from ray._private.services import canonicalize_bootstrap_address

    if address.startswith(("http://", "https://")):
        raise UserError(
            f"{address} is a dashboard address; the builtin engine joins the cluster as a driver: pass its GCS "
            "address (HEAD:6379), ray://HEAD:10001 or auto",
            field=field,
        )
    try:
        target = address
        if target == "auto":  # the cluster Ray would find: RAY_ADDRESS, else the last `ray start` on this machine
            target = os.environ.get("RAY_ADDRESS") or canonicalize_bootstrap_address(target) or ""
        host, colon, port = target.removeprefix("ray://").rpartition(":")
        if not colon or not port.isdigit():
            raise ValueError("expected HOST:PORT")
        socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_SECONDS).close()
    except (OSError, ValueError) as err:  # refused, unresolvable, timed out, no cluster found for auto, no port
        raise UserError(
            f"cannot reach a Ray cluster at {address} ({first_line(err)}); start one (`ray start --head`) and pass "
            f"its address, or leave {field} out to start one here",
            field=field,
        ) from None


def disconnect(head: "LocalHead | None") -> None:
    """Disconnect this process's Ray driver, and stop `head` (what `connect` started, if anything)."""
    import ray

    ray.shutdown()
    if head is not None:
        head.stop()


@dataclass
class LocalHead:
    """A Ray head started on this machine: its Jobs API (http://127.0.0.1:PORT), the GCS address a Ray driver joins
    (127.0.0.1:PORT), the `ray start` process (the leader of its process group) and its temp dir."""

    address: str
    gcs_address: str
    pid: int
    temp_dir: str

    def running(self) -> bool:
        """The `ray start` process runs (it exits when one of the head's processes dies)."""
        return _running(self.pid)

    def alive(self) -> bool:
        """The head's process runs and its dashboard answers, even if refusing us (a token this process lacks)."""
        if not _running(self.pid):
            return False
        try:
            urllib.request.urlopen(f"{self.address}/api/version", timeout=10).close()
        except urllib.error.HTTPError:  # it answered, refusing this client
            return True
        except OSError:  # not up (yet), or gone
            return False
        return True

    def ready(self) -> bool:
        """Alive, and the dashboard reports the head node's devices (what admission reads), or refuses this client."""
        from rlscale.runner.cluster import dashboard_nodes

        if not self.alive():
            return False
        try:
            return bool(dashboard_nodes(jobs_client(self.address)))
        except UserError:  # refused: its token is not this process's to use
            return True
        except Exception:  # the dashboard's first report is a few seconds behind the Jobs API
            return False

    def stop(self, head_file: Path | None = None) -> None:
        """Stop the head and every process it started; remove its temp dir and `head_file`. Jobs' processes get
        SIGKILL first (Ray waits for them), then `ray start` SIGTERM (~2 s), then SIGKILL to what is left."""
        _kill([pid for pid in self.processes() if _session(pid) != self.pid])  # jobs first: Ray waits for them
        if self.temp_dir in _cmdline(self.pid):  # not a process that took the pid of a head long gone
            try:
                os.kill(self.pid, signal.SIGTERM)
            except OSError:
                pass
            _wait_gone([self.pid], 30.0)
        _kill(self.processes())
        try:  # `ray start` of this process's own: reaped, so that no zombie stays listed among the head's processes
            os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            pass
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        if head_file is not None:
            head_file.unlink(missing_ok=True)

    def processes(self) -> list[int]:
        """The processes of this head still running: Ray's (the session `ray start` leads) and its jobs' (their
        environment names its GCS port), this process and its parents aside."""
        mine = {os.getpid(), os.getppid()}
        port = self.gcs_address.rpartition(":")[2]
        found = []
        for entry in Path("/proc").iterdir():
            pid = int(entry.name) if entry.name.isdigit() else 0
            if not pid or pid in mine:
                continue
            address = next((item for item in _environ(pid) if item.startswith(b"RAY_ADDRESS=")), b"")
            if _session(pid) == self.pid or address.endswith(f":{port}".encode()):
                found.append(pid)
        return found


def local_head(directory: Path, *, cpus: int | None = None) -> LocalHead:
    """The live head recorded in `directory`/ray-head.json, else a new one (max(cpus, local_cpus())) recorded there."""
    head_file = directory / HEAD_FILE
    try:
        recorded = LocalHead(**json.loads(head_file.read_text()))
    except (OSError, ValueError, TypeError):
        recorded = None
    if recorded is not None:
        if recorded.alive():
            return recorded
        recorded.stop()  # what a head that died leaves: processes of its session, its jobs, its temp dir
    return start_head(cpus=max(local_cpus(), cpus or 0), head_file=head_file)


def start_head(
    *, cpus: int | None = None, gpus: int | None = None, env: dict | None = None, head_file: Path | None = None
) -> LocalHead:
    """`ray start --head` on loopback with ports, a temp dir and a process group of its own; returns once the dashboard
    reports the node. `head_file` is written once the process exists, so a driver killed meanwhile leaves it found.
    A `ray start` that gives up on its own (its raylet's fixed 30 s wait on a busy host) is tried again, on new ports,
    up to START_ATTEMPTS times within START_SECONDS."""
    deadline = time.monotonic() + START_SECONDS
    attempt = 1
    while True:
        head, process = _launch(cpus=cpus, gpus=gpus, env=env, head_file=head_file)
        while not head.ready():
            if process.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        else:
            return head
        code = process.poll()  # before stop(), which reaps it
        why = start_failure(code, (Path(head.temp_dir) / "head.log").read_text(errors="replace"))
        head.stop(head_file)
        if not _again(code, attempt) or time.monotonic() > deadline - RETRY_SECONDS:
            raise UserError(
                f"could not start a local Ray head ({why[:200]}); start one yourself and pass --ray-address",
                field="--ray-address",
            )
        attempt += 1


def _again(returncode: int | None, attempt: int) -> bool:
    """Whether a failed start is worth another: `ray start` exited with an error by itself (not killed, not stopped
    by `ray stop`'s SIGTERM, which exits 0, not still starting at the deadline) and attempts remain."""
    return returncode is not None and returncode > 0 and attempt < START_ATTEMPTS


def _launch(
    *, cpus: int | None, gpus: int | None, env: dict | None, head_file: Path | None
) -> tuple[LocalHead, subprocess.Popen]:
    """One `ray start --head --block` on fresh ports and temp dir, recorded in `head_file`; not waited for."""
    ray = Path(sys.executable).with_name("ray")
    temp = tempfile.mkdtemp(prefix="rlscale-ray-", dir="/tmp")  # short: Ray's socket paths have a length limit
    port, dashboard, agent, agent_grpc, runtime_env, metrics = free_ports(6)
    command = [
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
        f"--num-cpus={cpus or local_cpus()}",
        *([f"--num-gpus={gpus}"] if gpus is not None else []),
        f"--temp-dir={temp}",
        "--disable-usage-stats",
    ]
    with open(Path(temp) / "head.log", "wb") as log:  # the head keeps its own descriptor to it
        process = subprocess.Popen(
            command,
            start_new_session=True,
            env={**os.environ, **WORKER_NICENESS_ENV, **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    head = LocalHead(f"http://127.0.0.1:{dashboard}", f"127.0.0.1:{port}", process.pid, temp)
    if head_file is not None:
        write_whole(head_file, json.dumps(asdict(head)))
    return head, process


def start_failure(returncode: int | None, log_text: str) -> str:
    """Why `ray start` gave no head: the signal that ended it, else its log's last error line, else its exit code
    (a SIGTERM it handled, as `ray stop` sends, leaves only warnings)."""
    if returncode is not None and returncode < 0:
        return f"`ray start` ended by {signal.Signals(-returncode).name}"
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"error|exception|failed|refused|denied|no space", line, re.I)]
    if errors:
        said = errors[-1]
    elif returncode is not None:
        return f"`ray start` exited with code {returncode} before the head was up"
    else:
        said = next((line for line in reversed(lines) if "WARNING" not in line), "no output")
    return said if returncode is not None else f"not ready in {START_SECONDS:.0f} s: {said}"


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports free on loopback now."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _wait_gone(pids: list[int], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_running(pid) for pid in pids):
        time.sleep(0.2)


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    _wait_gone(pids, 10.0)


def _session(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[3])
    except (OSError, ValueError, IndexError):
        return None


def _environ(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _running(pid: int) -> bool:
    try:  # WNOWAIT: a child of ours that exited stays for its Popen to reap, with its exit code (start_head reads it)
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return False
    except ChildProcessError:  # not our child: a head adopted from an earlier driver
        pass
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True
