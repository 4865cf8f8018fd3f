"""Helpers of the TRL engine's end-to-end tests (test_trl_engine.py, test_setup_trl.py): a sweep driver in a process
of its own, and a kill -9 of it once its runs are past their first checkpoint."""

import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

from rlscale.db.store import Store

# `python -c DRIVER STUDY_FILE DB_URL RAY_ADDRESS SHARED_DIR`: the sweep as `rlscale sweep` runs it
DRIVER = textwrap.dedent("""
    import sys
    from rlscale.db.store import Store
    from rlscale.planner.study import load_study
    from rlscale.runner.sweep.driver import SweepDriver
    study_file, url, address, shared = sys.argv[1:]
    options = {"trl": {"shared_dir": shared, "poll_seconds": 0.2}}
    with Store(url) as store:
        SweepDriver(load_study(study_file), store, ray_address=address, engine_options=options).run()
""")


def kill_driver_past(
    args: list[str], url: str, study: str, cluster: str, *, step: int = 3, env: dict | None = None, seconds: float = 300
) -> list[str]:
    """Start the driver `args`, kill -9 its process group once a record of `study` reaches `step` (past the
    checkpoint at step 2), then stop its running jobs as a lost node would; returns those jobs' submission ids."""
    from ray.job_submission import JobSubmissionClient

    driver = subprocess.Popen(args, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    store_file = Path(url.removeprefix("sqlite:///"))
    try:
        deadline = time.time() + seconds
        while time.time() < deadline and driver.poll() is None:
            if store_file.exists():
                with Store(url) as store:
                    records = store.records_frame(study) if study in store.study_names() else []
                if len(records) and records["step"].max() >= step:
                    break
            time.sleep(0.3)
        assert driver.poll() is None, f"the driver ended before it could be killed: {driver.stderr.read()[-2000:]}"
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
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
