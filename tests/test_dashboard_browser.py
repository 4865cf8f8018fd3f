"""`rlscale dashboard` in headless Chromium (playwright, the system's /usr/bin/chromium) against a sweep running in
another process: the real sweep driver (runner/sweep/driver.py: planning, the rung scheduler, the asymptote rule,
the store's one writer) with an engine that replays known sigmoid curves instead of training. A replay keeps the
test to seconds on 2 cores and lets the test release each evaluation of one run itself, so it waits for states,
not for time; the driver, the store and the page are the real ones. Ray and training are covered by the sweep's
own tests. The first study's rule stops two runs early; the second study's run is released one evaluation at a
time; a run with a hostile name is imported beside it, as `rlscale import` would."""

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from helpers import bench_module
from rlscale.db.store import Store

pytestmark = pytest.mark.slow

HOSTILE = "<img src=x onerror=\"document.title='pwned'\">"
RECIPE = {
    "prompts_per_batch": 8,
    "rollouts": 4,
    "eval_prompts": 16,
    "eval_samples": 2,
    "async": "sync",
    "lr_reference_batch": 256,
    "eval_every": 2,
    "checkpoint_every": 2,
}
SWEEP = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import numpy as np
    from rlscale.db.store import Store
    from rlscale.fitting.sigmoid import sigmoid
    from rlscale.planner.study_file import load_study
    from rlscale.runner.engine import Engine, JobResult
    from rlscale.runner.sweep.driver import SweepDriver

    class Replay(Engine):
        # known curves by lr, 0.01 device-hours a step; with a gate, evaluation k waits until the gate file says k
        name = "replay"
        ASYMPTOTE = {1e-4: 0.50, 2e-4: 0.62, 3e-4: 0.80, 4e-4: 0.66}

        def __init__(self, gate=None):
            self.reached, self.gate = {}, gate

        def reward(self, lr, step):
            truth = float(sigmoid(0.01 * step, self.ASYMPTOTE[lr], 2.0, 0.15, 0.1)) if step else 0.1
            return np.random.default_rng(int(lr * 1e5) * 1000 + step).binomial(4096, truth) / 4096

        def released(self):
            try:
                return int(self.gate.read_text() or 0)
            except (FileNotFoundError, ValueError):
                return 0

        def run(self, recipe, *, run_key, on_records, until_step=None, should_stop=None, **_):
            start = self.reached.get(run_key, 0)
            last = until_step or recipe.steps
            batch, stopped = [], None
            for step in (range(start + 1, last + 1) if start else range(0, last + 1)):
                while self.gate is not None and step % 2 == 0 and self.released() < step // 2:
                    time.sleep(0.02)
                batch.append({"step": step, "gpu_hours": 0.01 * step, "rollouts": 0, "tokens": 0, "metrics": {},
                              "val_reward": self.reward(recipe.lr, step) if step % 2 == 0 else None})
                if step % 2 == 0 or step == last:
                    on_records(batch)
                    batch, self.reached[run_key] = [], step
                    stopped = should_stop() if should_stop else None
                    if stopped:
                        break
            return JobResult(steps=self.reached[run_key], stopped=stopped is not None, stop_reason=stopped or "")

    url, rungs, paced, gate = sys.argv[1:]
    with Store(url) as store:
        SweepDriver(load_study(rungs), store, engine=Replay()).run()
        SweepDriver(load_study(paced), store, engine=Replay(Path(gate))).run()
""")


def _study(path: Path, name: str, lrs: list, steps: int, **spec) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "method": "grid",
                "recipe": {**RECIPE, "steps": steps},
                "parameters": {"lr": {"values": lrs}},
                **spec,
            }
        )
    )
    return path


def _until(check, seconds: float, what: str):
    """What check() returns once it is not None (polled every 0.1 s for at most `seconds`)."""
    deadline = time.monotonic() + seconds
    while (found := check()) is None:
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return found


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """The sweep in a process of its own (its own process group, killed at the end); yields (url, gate file)."""
    tmp = tmp_path_factory.mktemp("dash")
    url, gate = f"sqlite:///{tmp / 'store.db'}", tmp / "gate"
    rungs = _study(
        tmp / "rungs.yaml",
        "rungs",
        [1e-4, 2e-4, 3e-4, 4e-4],
        80,
        early_terminate={"type": "asymptote", "min_fraction": 0.25},
    )
    paced = _study(tmp / "paced.yaml", "paced", [3e-4], 60)
    gate.write_text("3")  # the paced run's first evaluations, so its curve has points when the page opens
    process = subprocess.Popen(
        [sys.executable, "-c", SWEEP, url, str(rungs), str(paced), str(gate)],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        yield url, gate, process
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture(scope="module")
def dashboard(sweep):
    from rlscale.dashboard.app import create_app

    url = sweep[0]
    _until(lambda: True if Path(url.removeprefix("sqlite:///")).exists() else None, 60, "the sweep's store")
    with bench_module("dashboard").Background(create_app(url)) as server:
        yield server.url


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed: .ci/run installs Debian's chromium")
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    """A fresh page that records console errors and uncaught exceptions (a CSP violation is a console error)."""
    page = browser.new_page(viewport={"width": 1250, "height": 1000})
    page.problems = []
    page.on("console", lambda message: page.problems.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: page.problems.append(str(error)))
    page.on("dialog", lambda dialog: (page.problems.append(f"dialog: {dialog.message}"), dialog.dismiss()))
    yield page
    page.close()


def _finished(url: str, study: str):
    """The study's runs once its sweep is over (every run done or stopped)."""
    with Store(url, read_only=True) as store:

        def finished():
            runs = store.runs_frame(study)
            return runs if runs["status"].isin(["done", "stopped"]).all() else None

        return _until(finished, 120, f"the {study} study to finish")


def _evaluations(page) -> int:
    """The evaluations behind the curves chart (each run draws at most CURVE_POINTS of them)."""
    return int(page.get_attribute("#chart-curves", "data-evaluations") or 0)


def test_the_study_page_loads_from_the_index_without_console_errors(dashboard, page):
    page.goto(dashboard)
    page.get_by_role("link", name="rungs").wait_for(timeout=60_000)
    page.get_by_role("link", name="rungs").click()
    page.locator("#chart-curves[data-points]").wait_for(timeout=60_000)
    assert page.locator("#runs tbody tr").count() == 4
    assert page.locator("#chart-curves canvas").count() >= 1  # uPlot drew the curves
    assert page.locator("#chart-parallel canvas").count() == 1  # and the runs over their axes
    page.locator("#live-status", has_text="live: last change").wait_for(timeout=10_000)  # a refresh came back
    assert page.problems == []


def test_a_new_evaluation_appears_within_seconds(sweep, dashboard, page):
    _, gate, _ = sweep
    with Store(sweep[0], read_only=True) as store:

        def evaluated():
            done = "paced" in store.study_names() and store.records_frame("paced")["val_reward"].notna().sum() >= 4
            return True if done else None

        _until(evaluated, 120, "the paced run's first evaluations")
    page.goto(dashboard + "study/paced")
    page.locator("#chart-curves[data-points]").wait_for(timeout=30_000)
    for released in (4, 5):
        before = _evaluations(page)
        gate.write_text(str(released))
        # stored by the sweep's process, then shown: the page polls every second
        page.locator(f'#chart-curves[data-evaluations="{before + 1}"]').wait_for(timeout=5_000)
    assert page.problems == []


def test_a_run_stopped_early_is_shown_as_stopped_with_the_reason_the_sweep_stored(sweep, dashboard, page):
    page.goto(dashboard + "study/rungs")
    stopped = page.locator("#runs tr.status-stopped")
    runs = _finished(sweep[0], "rungs")
    reasons = {row["run"]: row["error"] for row in runs.to_dict("records") if row["status"] == "stopped"}
    assert reasons, "the rule stopped no run: the test shows nothing"
    page.locator("#flight", has_text="0 in flight").wait_for(timeout=10_000)
    assert stopped.count() == len(reasons)
    for run, reason in reasons.items():
        item = page.locator("#stopped li", has_text=run)
        assert item.inner_text() == f"{run}: {reason}"
    assert page.problems == []


def test_runs_are_filtered_by_status_and_by_a_range_dragged_on_an_axis_and_grouped_by_one(sweep, dashboard, page):
    runs = _finished(sweep[0], "rungs")
    stopped = int((runs["status"] == "stopped").sum())
    page.goto(dashboard + "study/rungs")
    page.locator("#flight", has_text="0 in flight").wait_for(timeout=30_000)
    rows = page.locator("#runs tbody tr")
    assert rows.count() == 4
    page.locator('#controls input[data-status="stopped"]').uncheck()
    assert rows.count() == 4 - stopped and page.locator("#runs tr.status-stopped").count() == 0
    page.locator('#controls input[data-status="stopped"]').check()
    assert rows.count() == 4
    # lr is the first axis, at the chart's left edge (50 px in): keep its upper half (3e-4 and 4e-4)
    box = page.locator("#chart-parallel canvas").bounding_box()
    x, top, bottom = box["x"] + 50, box["y"] + 34, box["y"] + box["height"] - 24
    page.mouse.move(x, top - 2)
    page.mouse.down()
    page.mouse.move(x, (top + bottom) / 2 - 5, steps=5)
    page.mouse.up()
    shown = [rows.nth(i).locator("td").first.inner_text() for i in range(rows.count())]
    assert sorted(shown) == sorted(runs["run"].tolist()[2:])  # the study's runs by lr: 1e-4, 2e-4, 3e-4, 4e-4
    page.get_by_role("button", name="clear ranges").click()
    assert rows.count() == 4
    page.locator("#group-by").select_option("status")
    assert sorted(page.locator("#legend .legend-item").all_inner_texts()) == sorted(runs["status"].unique())
    assert page.problems == []


def test_a_hostile_run_name_is_shown_as_text_and_runs_nothing(sweep, dashboard, page):
    with Store(sweep[0]) as store:  # an import beside the sweep: the test is a second writer, as `rlscale import` is
        _until(lambda: True if "paced" in store.study_names() else None, 120, "the paced study")
        store.import_runs(
            "paced",
            [
                (
                    HOSTILE,
                    {"source": "import"},
                    [{"step": s, "gpu_hours": 0.01 * s, "val_reward": 0.1 + 0.005 * s} for s in range(0, 40, 2)],
                )
            ],
        )
    page.goto(dashboard + "study/paced")
    row = page.locator("#runs tbody tr", has_text="onerror")
    row.wait_for(timeout=30_000)
    assert row.locator("td").first.inner_text() == HOSTILE
    assert page.locator("#runs img").count() == 0 and page.locator("img[src=x]").count() == 0
    page.locator("#live-status", has_text="live: last change").wait_for(timeout=10_000)  # after a live refresh too
    assert page.locator("img[src=x]").count() == 0
    assert page.title() == "paced: study" and page.problems == []
