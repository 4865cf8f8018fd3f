"""Reaching the user's Ray cluster as it is: a sweep with no cluster named starts a local head and stops it at the end
(adopting it after kill -9 of its driver, starting another when it dies under the sweep), a cluster that cannot be
reached or refuses the client is one line and exit 2 with nothing stored, and a token is found the way Ray's own
clients find it."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, spawn, tail
from rlscale.db.store import Store

# a short TRL run on the tiny policy (what tests/test_trl_engine.py trains, fewer steps)
RECIPE = dict(
    engine="trl",
    model="tiny",
    task="arithmetic",
    prompts_per_batch=4,
    rollouts=2,
    steps=6,
    loss="dapo",
    loss_agg="token",
    adv_norm="group",
    zero_variance_filter=False,
    no_positive_resampling=None,
    length_control="truncate",
    max_new_tokens=8,
    lr=1e-4,
    lr_reference_batch=8,
    lr_warmup_steps=0,
    eval_every=3,
    eval_prompts=8,
    eval_samples=2,
    checkpoint_every=2,
    trainer_devices=1,
)
RECIPE["async"] = "sync"

DRIVER = textwrap.dedent("""
    import sys
    from rlscale.db.store import Store
    from rlscale.planner.study_file import load_study
    from rlscale.runner.sweep.driver import SweepDriver
    study_file, url, shared = sys.argv[1:]
    with Store(url) as store:
        SweepDriver(load_study(study_file), store, engine_options={"trl": {"shared_dir": shared,
                                                                          "poll_seconds": 0.2}}).run()
""")


def write_study(path: Path, name: str, **recipe) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "method": "grid",
                "recipe": {**RECIPE, **recipe},
                "parameters": {"rollouts": {"values": [2]}},
            }
        )
    )
    return path


def head_processes(head: dict) -> list[int]:
    """The processes of a head recorded in a head file: Ray's and its jobs'."""
    from rlscale.runner.ray_head import LocalHead

    return LocalHead(**head).processes()


@pytest.mark.slow
def test_a_sweep_with_no_cluster_named_starts_a_head_adopts_it_after_kill_9_and_stops_it(tmp_path):
    pytest.importorskip("trl")
    study = write_study(tmp_path / "local.yaml", "local", steps=40)
    url, shared = f"sqlite:///{tmp_path / 'store.db'}", tmp_path / "shared"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RLSCALE_CACHE": str(tmp_path / "cache")}
    args = [sys.executable, "-c", DRIVER, str(study), url, str(shared)]
    driver = spawn(args, log := tmp_path / "driver.log", env=env)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and driver.poll() is None:  # a job that has stored a step: the head is up
            if (tmp_path / "store.db").exists():
                with Store(url) as store:
                    if "local" in store.study_names() and len(store.records_frame("local")) >= 2:
                        break
            time.sleep(0.5)
        assert driver.poll() is None, tail(log, 3000)
        (head_file,) = (tmp_path / "cache" / "ray-heads").glob("*/ray-head.json")  # one per study and store
        head = json.loads(head_file.read_text())
        assert head["address"].startswith("http://127.0.0.1:") and head_processes(head)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver's group only: the head has a session of its own
        driver.wait()
    assert head_processes(head)  # it outlived its driver, with the run's job on it
    restarted = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    with Store(url) as store:
        records, runs = store.records_frame("local"), store.runs_frame("local")
    assert list(runs["status"]) == ["done"] and sorted(records["step"]) == list(range(41))
    # the restarted driver adopted the head (and the job still running on it), then stopped it at the end
    from ray.job_submission import JobSubmissionClient  # noqa: F401  (imported before the head is gone)

    assert not head_file.exists()
    deadline = time.time() + 60
    while head_processes(head) and time.time() < deadline:
        time.sleep(0.5)
    assert head_processes(head) == []
    jobs = sorted(path.name for path in (shared).glob("*/logs/*.jsonl"))
    assert len(jobs) == 1  # one job: adopted, not submitted a second time


@pytest.mark.slow
def test_a_head_that_dies_under_a_builtin_sweep_is_replaced_and_the_runs_resume_from_their_checkpoints(
    tmp_path, monkeypatch
):
    from rlscale.planner.study_file import load_study
    from rlscale.runner.sweep.driver import SweepDriver

    monkeypatch.setenv("RLSCALE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("RLSCALE_FAULT_DIR", str(tmp_path))
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # the job's verifier holds it while the head dies
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    study = write_study(
        tmp_path / "dies.yaml",
        "dies",
        engine="builtin",
        steps=40,
        checkpoint_every=4,
        eval_every=4,
        generator_devices=1,
        verifier="fault_verifiers:hold_while_told",
    )
    url = f"sqlite:///{tmp_path / 'store.db'}"
    killed = {}

    def kill_the_head_at_step_5():
        deadline = time.time() + 600
        with Store(url) as reader:  # the run stored its first checkpoint (steps 0-4): hold it in step 5
            while time.time() < deadline and not (
                "dies" in reader.study_names() and len(reader.records_frame("dies")) >= 5
            ):
                time.sleep(0.2)
        (tmp_path / "hold").touch()
        try:  # the job is let go whatever happens here: a killer that fails fails the test, it does not hang it
            while time.time() < deadline and not (tmp_path / "held").exists():
                time.sleep(0.05)
            (head_file,) = (tmp_path / "cache" / "ray-heads").glob("*/ray-head.json")
            killed["head"] = json.loads(head_file.read_text())
            for pid in head_processes(killed["head"]):
                with contextlib.suppress(ProcessLookupError):  # gone with the GCS or raylet killed before it
                    os.kill(pid, signal.SIGKILL)
        finally:
            (tmp_path / "hold").unlink()

    killer = threading.Thread(target=kill_the_head_at_step_5)
    killer.start()
    with Store(url) as store:
        driver = SweepDriver(load_study(study), store, max_retries=0)  # no retry spent on a dead head
        summary = driver.run()
        records, runs = store.records_frame("dies"), store.runs_frame("dies")
    killer.join()
    assert driver.cluster.restarts == 1 and summary.count("done") == 1 and list(runs["status"]) == ["done"]
    assert sorted(records["step"]) == list(range(41))  # every step once: resumed from a checkpoint, not from 0
    assert records.sort_values("step")["gpu_hours"].is_monotonic_increasing
    # the dead head left nothing, and the new one was stopped at the end
    assert head_processes(killed["head"]) == [] and not os.path.exists(killed["head"]["temp_dir"])
    assert not list((tmp_path / "cache" / "ray-heads").glob("*/ray-head.json"))


def test_a_dead_head_is_replaced_once_however_many_runs_find_it_dead(tmp_path, monkeypatch):
    import rlscale.runner.ray_head as ray_head
    from rlscale.runner.sweep.head import SweepCluster

    class Head:
        """Stands in for a LocalHead on purpose: this test isolates the replacement's bookkeeping from Ray."""

        def __init__(self, number: int):
            self.address, self.gcs_address = f"http://head{number}:8265", f"head{number}:6379"
            self.dead = self.stopped = False

        def alive(self) -> bool:
            return not self.dead

        def running(self) -> bool:
            return not self.dead

        def stop(self, head_file=None) -> None:
            self.stopped = True

    heads: list[Head] = []
    monkeypatch.setattr(ray_head, "local_head", lambda directory, cpus=0: heads.append(Head(len(heads))) or heads[-1])
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cluster = SweepCluster(None, tmp_path)
    assert cluster.address_for("builtin") == "head0:6379" and cluster.address_for("trl") == "http://head0:8265"
    generations = [cluster.enter() for _ in range(3)]  # three runs in flight
    heads[0].dead = True
    closed, ended, again = [], [], []

    def job_fails(generation: int) -> None:
        cluster.leave()
        again.append(cluster.recover(generation, lambda: closed.append(len(heads)), lambda: ended.append(len(heads))))

    threads = [threading.Thread(target=job_fails, args=(generation,)) for generation in generations]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # every run goes again on one new head; the engines were dropped once, before it started, the dead one stopped
    assert again == [True, True, True] and len(heads) == 2 and closed == [1] and heads[0].stopped
    assert ended == [1]  # the engines' processes were ended once, on the dead head, not waited for
    assert cluster.address_for("trl") == "http://head1:8265" and cluster.restarts == 1
    generation = cluster.enter()  # a job that fails on a live head failed on its own: it spends an attempt
    cluster.leave()
    assert cluster.recover(generation, lambda: closed.append(len(heads))) is False and closed == [1]


def test_a_jobs_api_run_on_a_new_head_starts_at_its_checkpoints_compute_and_numbers_after_the_old_jobs(tmp_path):
    from rlscale.runner.jobs_api import RunDir, resume_seconds

    stored = {step: step / 3600 for step in range(10)}  # a job's records to step 9; checkpoints at 4 and 8
    # a new head knows none of the run's jobs (otherwise: 0 device-seconds of them); the store says where the
    # run's compute stood at the checkpoint it resumes from
    assert resume_seconds(8, stored.get, otherwise=0.0) == 8.0  # step 9's lost work is not charged
    assert resume_seconds(0, stored.get, otherwise=5.0) == 0.0  # no checkpoint: everything is redone
    # a redo from the start after step 0 was stored (13.8 s: a job's start and first evaluation): its step 0 is not
    # stored again, so its later steps count from there, or the run's compute would fall after step 0
    assert resume_seconds(0, {0: 13.8 / 3600}.get, otherwise=5.0) == pytest.approx(13.8)
    assert resume_seconds(0, {}.get, otherwise=5.0) == 0.0  # killed before any record: nothing lost is charged
    assert resume_seconds(12, stored.get, otherwise=5.0) == 5.0  # no record there (an engine used alone)
    run_dir = RunDir(tmp_path / "faults-1-abc")
    for name in ("jobs/faults-1-abc-1.json", "logs/faults-1-abc-1.jsonl", "logs/faults-1-abc-2.jsonl"):
        (run_dir.root / name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir.root / name).touch()
    assert run_dir.jobs_written("faults-1-abc") == 2  # the next job is -3: it never reads job 1's log as its own


def test_a_cluster_that_cannot_be_reached_is_one_line_and_nothing_is_stored(tmp_path, cli):
    study = write_study(tmp_path / "away.yaml", "away")
    db = tmp_path / "store.db"
    code, out, err = cli("sweep", study, "--db", f"sqlite:///{db}", "--ray-address", "http://127.0.0.1:9")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "cannot reach a Ray cluster at http://127.0.0.1:9" in err and "--ray-address" in err
    assert not db.exists()


@pytest.mark.parametrize("command", ["sweep", "run"])
@pytest.mark.parametrize("address", ["127.0.0.1:{port}", "ray://127.0.0.1:{port}", "http://127.0.0.1:8265"])
def test_a_builtin_sweep_or_run_whose_cluster_cannot_be_joined_is_one_line_and_stores_nothing(
    tmp_path, cli, command, address
):
    from rlscale.runner.ray_head import free_ports

    address = address.format(port=free_ports(1)[0])  # nothing listens there
    db = tmp_path / "store.db"
    target = ROOT / ("studies/quickstart.yaml" if command == "sweep" else "recipes/tiny_scalerl.yaml")
    code, out, err = cli(command, str(target), "--db", f"sqlite:///{db}", "--ray-address", address)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: --ray-address: ") and address in err
    assert not db.exists()


def test_a_driver_address_that_accepts_a_connection_passes_the_check():
    import socket

    from rlscale.runner.ray_head import check_driver_address

    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        check_driver_address(f"127.0.0.1:{port}")
        check_driver_address(f"ray://127.0.0.1:{port}")


@pytest.mark.slow
def test_a_token_is_found_as_rays_own_clients_find_it(tmp_path, start_ray_head):
    token = "rlscale-test-token-" + "0" * 13
    address = start_ray_head({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token})
    study = write_study(tmp_path / "auth.yaml", "auth")
    db = tmp_path / "store.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
    env["HOME"] = str(tmp_path)  # no ~/.ray/auth_token of this machine's earlier clusters
    rlscale = [
        str(Path(sys.executable).with_name("rlscale")),
        "sweep",
        str(study),
        "--db",
        f"sqlite:///{db}",
        "--ray-address",
        address,
    ]
    refused = subprocess.run(rlscale, capture_output=True, text=True, env=env, timeout=120)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr[-2000:]
    assert "RAY_AUTH_TOKEN" in refused.stderr and not db.exists()
    # the token where `ray start` and `ray.init` look for one (RAY_AUTH_MODE unset): the client uses it
    (tmp_path / "token").write_text(token)
    probe = "from rlscale.runner.ray_head import jobs_client; import sys; print(jobs_client(sys.argv[1]).list_jobs())"
    found = subprocess.run(
        [sys.executable, "-c", probe, address],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "RAY_AUTH_TOKEN_PATH": str(tmp_path / "token")},
    )
    assert found.returncode == 0 and "submission_id='probe'" in found.stdout, found.stderr[-2000:]
    assert found.stderr.strip() == ""  # not a line of Ray's warnings on the user's terminal


def test_the_head_file_names_the_head_before_it_is_up_so_a_killed_starter_leaves_none_unknown(tmp_path, monkeypatch):
    from rlscale.runner.ray_head import HEAD_FILE, LocalHead, local_head

    recorded = []
    ready = LocalHead.ready

    def recording_ready(self):
        recorded.append(json.loads((tmp_path / HEAD_FILE).read_text())["pid"] == self.pid)
        return ready(self)

    monkeypatch.setattr(LocalHead, "ready", recording_ready)
    head = local_head(tmp_path)
    try:
        assert recorded and all(recorded)  # named from its first readiness check on
    finally:
        head.stop(tmp_path / HEAD_FILE)
    assert not (tmp_path / HEAD_FILE).exists() and not head.processes()


@pytest.mark.slow
def test_a_ray_call_after_disconnect_raises_and_starts_no_local_instance():
    # a run's thread may still call Ray as Ctrl-C ends the sweep: Ray's auto-init would start a stray instance
    code = textwrap.dedent(
        """
        import ray
        from rlscale.runner.ray_head import connect, disconnect

        disconnect(connect(None, cpus=1))
        try:
            ray.put(1)
        except Exception as err:
            print("raised", type(err).__name__)
        print("initialized", ray.is_initialized())
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=360)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "raised" in done.stdout and "initialized False" in done.stdout
    assert "Started a local Ray instance" not in done.stderr


def test_a_head_that_fails_to_start_is_explained_by_its_signal_or_error_line_not_a_warning():
    from rlscale.runner.ray_head import start_failure

    log = (
        "2026-11-27 20:34:50,731 WARNING authentication_token_setup.py:85 -- Token authentication is enabled\n"
        "ValueError: port 6379 already in use\n"
        "2026-11-27 20:34:51,002 WARNING worker.py:1 -- Set RAY_AUTH_TOKEN to silence this\n"
    )
    assert start_failure(-9, log) == "`ray start` ended by SIGKILL"
    assert start_failure(1, log) == "ValueError: port 6379 already in use"
    assert start_failure(0, log.replace("ValueError: port 6379 already in use\n", "")) == (
        "`ray start` exited with code 0 before the head was up"  # it handled a SIGTERM: warnings only
    )
    assert start_failure(None, "") == "not ready in 300 s: no output"


def test_a_ray_start_that_gives_up_by_itself_is_tried_again_on_new_ports(tmp_path, monkeypatch):
    # Ray's raylet waits a fixed 30 s to register; on a busy host `ray start` then exits 1 with this line
    from rlscale.runner.ray_head import HEAD_FILE, local_head

    real = Path(sys.executable).with_name("ray")
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "ray"
    fake.write_text(
        "#!/bin/sh\n"
        f'if [ ! -e "{tmp_path}/tried" ]; then touch "{tmp_path}/tried"; echo "Exception: The current node timed '
        'out during startup." ; exit 1; fi\n'
        f'exec "{real}" "$@"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    head = local_head(tmp_path)
    try:
        assert (tmp_path / "tried").exists() and head.running()
        assert json.loads((tmp_path / HEAD_FILE).read_text())["pid"] == head.pid  # the second head is recorded
    finally:
        head.stop(tmp_path / HEAD_FILE)
    assert not head.processes()


def test_only_a_start_that_ended_by_itself_with_attempts_left_is_tried_again():
    from rlscale.runner.ray_head import START_ATTEMPTS, _again

    assert _again(1, 1) and _again(1, START_ATTEMPTS - 1)
    assert not _again(0, 1)  # `ray stop`'s SIGTERM, handled: someone meant it
    assert not _again(1, START_ATTEMPTS)  # the last attempt's failure is the user's error
    assert not _again(-9, 1)  # killed: someone meant it
    assert not _again(None, 1)  # still starting at the deadline
