"""Reaching the user's Ray cluster as it is: a sweep of Jobs-API runs with no cluster named starts a local head and
stops it at the end (adopting it after kill -9 of its driver), a cluster that cannot be reached or refuses the
client is one line and exit 2 with nothing stored, and a token is found the way Ray's own clients find it."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from helpers import spawn, tail
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


def head_processes(temp_dir: str) -> list[int]:
    import psutil

    return [p.pid for p in psutil.process_iter(["cmdline"]) if temp_dir in " ".join(p.info["cmdline"] or [])]


@pytest.mark.slow
def test_a_sweep_with_no_cluster_named_starts_a_head_adopts_it_after_kill_9_and_stops_it(tmp_path):
    pytest.importorskip("trl")
    study = write_study(tmp_path / "local.yaml", "local", steps=40)
    url, shared = f"sqlite:///{tmp_path / 'store.db'}", tmp_path / "shared"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
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
        head = json.loads((shared / "ray-head.json").read_text())
        assert head["address"].startswith("http://127.0.0.1:") and head_processes(head["temp_dir"])
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver's group only: the head has a session of its own
        driver.wait()
    assert head_processes(head["temp_dir"])  # it outlived its driver, with the run's job on it
    restarted = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    with Store(url) as store:
        records, runs = store.records_frame("local"), store.runs_frame("local")
    assert list(runs["status"]) == ["done"] and sorted(records["step"]) == list(range(41))
    # the restarted driver adopted the head (and the job still running on it), then stopped it at the end
    from ray.job_submission import JobSubmissionClient  # noqa: F401  (imported before the head is gone)

    assert not (shared / "ray-head.json").exists()
    deadline = time.time() + 60
    while head_processes(head["temp_dir"]) and time.time() < deadline:
        time.sleep(0.5)
    assert head_processes(head["temp_dir"]) == []
    jobs = sorted(path.name for path in (shared).glob("*/logs/*.jsonl"))
    assert len(jobs) == 1  # one job: adopted, not submitted a second time


def test_a_cluster_that_cannot_be_reached_is_one_line_and_nothing_is_stored(tmp_path, cli):
    study = write_study(tmp_path / "away.yaml", "away")
    db = tmp_path / "store.db"
    code, out, err = cli("sweep", study, "--db", f"sqlite:///{db}", "--ray-address", "http://127.0.0.1:9")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "cannot reach a Ray cluster at http://127.0.0.1:9" in err and "--ray-address" in err
    assert not db.exists()


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
