"""`rlscale dashboard` at 16, 50 and 500 runs: what a study page weighs, how soon it is drawn, what the server does.

For each study size (IsoCompute sweeps of synthetic ScaleRL curves, 100 evaluations a run, in SQLite):
  page weight:   every response body of a fresh load (a new browser context: nothing cached), the page with its
                 data, styles, scripts and the first poll: as sent (the server gzips), decoded, and each part
  first render:  ms from navigation to the page's charts and table drawn (page.js sets body[data-rendered] with
                 performance.now()), median of --renders fresh loads of a server that has the study built
  server:        seconds to build the study on its first request (every run fitted), until its decision is shown,
                 and to answer a refresh after one new record (the records added since, one refit, the parts that
                 changed), with that answer's size
  latency:       seconds from a record's commit (a second writer adds one evaluation to a run in flight) to the page
                 drawing it (the curves chart's evaluation count moving), over --repeats records; polls once a second
The dashboard and headless Chromium (playwright, /usr/bin/chromium) run in this process's machine. Screenshots: a
4-run study's page (bench/results/dashboard.png, the README's) and the 500-run one's runs over their axes and their
curves (dashboard_500.png).
Usage: nice .venv/bin/python bench/dashboard.py [--sizes 16,50,500] [--repeats 10] [--renders 5]
Prints the numbers and writes bench/results/dashboard.json.
"""

import argparse
import datetime
import gzip
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlscale.db.store import Store  # noqa: E402
from rlscale.fitting.sigmoid import sigmoid  # noqa: E402
from rlscale.planner.study_file import load_study  # noqa: E402

RESULTS = ROOT / "bench" / "results"
EVALUATIONS = 100
RECIPE = {"model": "tiny", "task": "arithmetic", "async": "pipeline", "lr": 1e-4, "eval_every": 10}
# runs -> the study's axes (IsoCompute over B_p x n, and lr and the loss where there are more runs)
AXES = {
    4: {"prompts_per_batch": [16], "rollouts": [2, 4, 8, 16]},
    16: {"prompts_per_batch": [8, 16, 32, 64], "rollouts": [2, 4, 8, 16]},
    50: {"prompts_per_batch": [8, 16, 32, 64, 128], "rollouts": [2, 4, 8, 16, 32], "lr": [1e-4, 3e-4]},
    500: {
        "prompts_per_batch": [8, 16, 32, 64, 128],
        "rollouts": [2, 4, 8, 16, 32],
        "lr": [5e-5, 1e-4, 2e-4, 3e-4, 5e-4],
        "loss": ["cispo", "gspo", "dapo", "grpo"],
    },
}
LOSS_GAIN = {"cispo": 0.0, "gspo": -0.01, "dapo": -0.03, "grpo": -0.05}


class Background:
    """`app` served on a thread of this process, on a free port of 127.0.0.1 (port 0) unless given; a context
    manager whose `url` is the server's address, stopped on exit."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0):
        import uvicorn

        self.server = uvicorn.Server(
            uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="on")
        )
        self.thread = threading.Thread(target=self.server.run, name="dashboard", daemon=True)
        self.url = ""

    def __enter__(self) -> "Background":
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the dashboard did not start")
            time.sleep(0.02)
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}/"
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def seed_study(store, tmp: Path, name: str, runs: int, rng) -> None:
    """An IsoCompute study of `runs` runs whose records are synthetic ScaleRL curves (binomial noise), EVALUATIONS
    each, with a sweep's statuses: most done, one in ten stopped by the rule, two in flight on 2 GPUs, one queued."""
    spec = {
        "name": name,
        "description": f"synthetic curves: the dashboard's benchmark ({runs} runs)",
        "method": "isocompute",
        "compute": {"unit": "gpu_hours", "budget": 0.05, "scope": "per_run", "profile": "tiny-cpu"},
        "early_terminate": {"type": "asymptote", "min_fraction": 0.25},
        "recipe": RECIPE,
        "parameters": {key: {"values": values} for key, values in AXES[runs].items()},
    }
    (tmp / f"{name}.yaml").write_text(yaml.safe_dump(spec))
    study = load_study(tmp / f"{name}.yaml")
    store.upsert_study(name, study.to_spec())
    from rlscale.planner.planning import planned_runs

    points = planned_runs(study)
    assert len(points) == runs, (name, len(points))
    hours = np.linspace(0.0, 0.05, EVALUATIONS + 1)[1:]
    logged = []
    for point in points:
        recipe = point.recipe
        n, bp = recipe.rollouts, recipe.prompts_per_batch
        lr_gain = -0.2 * abs(np.log10(recipe.lr / 2e-4))
        asymptote = 0.55 + 0.05 * np.log2(n) - 0.01 * np.log2(bp) + lr_gain + LOSS_GAIN[recipe.loss]
        reward = rng.binomial(1536, sigmoid(hours, min(asymptote, 0.95), 1.6, 0.004 * n**0.5, 0.12)) / 1536
        records = [
            {"step": 10 * (k + 1), "gpu_hours": float(h), "val_reward": float(r)}
            for k, (h, r) in enumerate(zip(hours, reward))
        ]
        logged.append((point.name, recipe.to_json(), records))
    store.import_runs(name, logged)  # one transaction; imported runs are done, the statuses follow
    ids = store.runs_frame(name)["run_id"].tolist()
    for i, run_id in enumerate(ids):
        if i % 10 == 1:
            store.set_run_status(run_id, "stopped", error="asymptote at most 0.581 < best run's lower bound 0.712")
        elif i in (len(ids) - 3, len(ids) - 2):
            store.set_run_status(run_id, "running", error="on 2 GPU")
        elif i == len(ids) - 1:
            store.set_run_status(run_id, "pending")


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=600) as response:
        return json.loads(response.read())


def settled(url: str, deadline_s: float = 900) -> dict:
    """The study's JSON once its decision is worked out (polled)."""
    deadline = time.monotonic() + deadline_s
    while "working out the decision" in (payload := get_json(url))["sections"]["decision"].lower():
        if time.monotonic() > deadline:
            raise RuntimeError("the decision was not worked out")
        time.sleep(0.2)
    return payload


def fresh_load(browser, url: str) -> dict:
    """One load in a new context (nothing cached): ms to first render, and every response body by part."""
    context = browser.new_context(viewport={"width": 1250, "height": 1000})
    page = context.new_page()
    responses = []
    page.on("response", lambda response: responses.append(response))
    started = time.perf_counter()
    page.goto(url)
    page.locator("body[data-rendered]").wait_for(timeout=120_000)
    wall = time.perf_counter() - started
    rendered_ms = int(page.get_attribute("body", "data-rendered"))
    page.locator("#live-status", has_text="live: last change").wait_for(timeout=60_000)  # the first poll
    parts = {}
    for response in responses:
        body = response.body()
        name = response.url.rsplit("/", 1)[-1].split("?")[0]
        kind = "poll" if "/api/" in response.url else ("page" if "/study/" in response.url else name)
        entry = parts.setdefault(kind, {"sent": 0, "bytes": 0, "gzip": 0})
        entry["sent"] += response.request.sizes()["responseBodySize"]
        entry["bytes"] += len(body)
        entry["gzip"] += len(gzip.compress(body, 6))
    context.close()
    return {"rendered_ms": rendered_ms, "wall_s": wall, "parts": parts}


def refresh_after_record(base: str, study: str, store, run_id: int, repeats: int) -> dict:
    """Seconds the server takes to answer a page's refresh after one new record, and the answer's bytes."""
    stamp = get_json(base + f"api/study/{study}")["stamp"]
    last = store.records_frame(study)
    step, hours = int(last["step"].max()), float(last["gpu_hours"].max())
    seconds, sizes, sent = [], [], []
    for _ in range(repeats):
        step, hours = step + 10, hours * 1.001
        store.add_records(run_id, [{"step": step, "gpu_hours": hours, "val_reward": 0.6}])
        started = time.perf_counter()
        with urllib.request.urlopen(base + f"api/study/{study}?since={stamp}", timeout=600) as response:
            body = response.read()
        seconds.append(time.perf_counter() - started)
        payload = json.loads(body)
        assert list(payload.get("runs", {})) == [str(run_id)], "a refresh sent more than the run that changed"
        stamp = payload["stamp"]
        sizes.append(len(body))
        sent.append(len(gzip.compress(body, 6)))
    return {
        "median_s": round(statistics.median(seconds), 3),
        "max_s": round(max(seconds), 3),
        "bytes": int(statistics.median(sizes)),
        "gzip": int(statistics.median(sent)),
        "repeats": repeats,
    }


def latency(page, store, study: str, run_id: int, repeats: int) -> dict:
    """Seconds from a record's commit to the page drawing it, `repeats` times (one record each)."""
    last = store.records_frame(study)
    step, hours = int(last["step"].max()), float(last["gpu_hours"].max())
    out = []
    for k in range(repeats):
        shown = int(page.get_attribute("#chart-curves", "data-evaluations"))
        time.sleep(0.3 + 0.7 * (k % 4) / 4)  # records land at every phase of the page's one-second poll
        step, hours = step + 10, hours * 1.001
        store.add_records(run_id, [{"step": step, "gpu_hours": hours, "val_reward": 0.6}])
        stored = time.perf_counter()
        page.locator(f'#chart-curves[data-evaluations="{shown + 1}"]').wait_for(timeout=60_000)
        out.append(time.perf_counter() - stored)
    ordered = sorted(out)
    return {
        "median": round(statistics.median(out), 3),
        "p90": round(ordered[max(0, int(0.9 * len(ordered)) - 1)], 3),
        "min": round(ordered[0], 3),
        "max": round(ordered[-1], 3),
        "repeats": len(out),
        "poll_s": 1.0,
    }


def measure_size(browser, base: str, writer, runs: int, args) -> dict:
    study = f"runs{runs}"
    started = time.perf_counter()
    get_json(base + f"api/study/{study}")  # the first request builds the study: every run fitted
    cold = time.perf_counter() - started
    settled(base + f"api/study/{study}")
    decided = time.perf_counter() - started
    loads = [fresh_load(browser, base + f"study/{study}") for _ in range(args.renders)]
    parts = loads[0]["parts"]
    in_flight = writer.runs_frame(study)
    run_id = int(in_flight.loc[in_flight["status"] == "running", "run_id"].iloc[0])
    refresh = refresh_after_record(base, study, writer, run_id, max(3, args.repeats // 2))
    page = browser.new_page(viewport={"width": 1250, "height": 1000})
    page.goto(base + f"study/{study}")
    page.locator("#live-status", has_text="live: last change").wait_for(timeout=60_000)
    delays = latency(page, writer, study, run_id, args.repeats)
    if runs == 500:  # the runs over their axes and their curves, as they look at 500 runs
        top = page.locator("#section-parallel").bounding_box()
        bottom = page.locator("#section-curves").bounding_box()
        clip = {"x": 0, "y": top["y"] - 8, "width": 1250, "height": bottom["y"] + bottom["height"] - top["y"] + 16}
        page.screenshot(path=str(RESULTS / "dashboard_500.png"), full_page=True, clip=clip)
    page.close()
    rendered = sorted(load["rendered_ms"] for load in loads)
    return {
        "runs": runs,
        "evaluations_per_run": EVALUATIONS,
        "axes": {key: len(values) for key, values in AXES[runs].items()},
        "page": {
            "sent_bytes": sum(p["sent"] for p in parts.values()),
            "bytes": sum(p["bytes"] for p in parts.values()),
            "gzip": sum(p["gzip"] for p in parts.values()),
            "parts": parts,
        },
        "first_render_ms": {"median": statistics.median(rendered), "min": rendered[0], "max": rendered[-1]},
        "load_to_render_s": round(statistics.median(load["wall_s"] for load in loads), 3),
        "renders": len(loads),
        "server": {"cold_build_s": round(cold, 2), "until_decision_s": round(decided, 2), "refresh": refresh},
        "latency_s": delays,
    }


def matplotlib_svg(store, study: str) -> dict:
    """The same curves as the report's matplotlib figure, written as SVG: bytes and seconds."""
    import pandas as pd
    from rlscale.fitting.curves import run_curves

    from rlscale.views.plots import plot_study

    runs, records = store.runs_frame(study), store.records_frame(study)
    started = time.perf_counter()
    curves, _ = run_curves(records, runs, bootstrap=100)
    fitted = time.perf_counter()
    path = Path(tempfile.mkdtemp()) / "curves.svg"
    plot_study(records, curves[pd.notna(curves["A"])], path, compute_col="gpu_hours", reward_col="val_reward")
    return {
        "bytes": path.stat().st_size,
        "seconds_to_draw": round(time.perf_counter() - fitted, 2),
        "seconds_to_fit": round(fitted - started, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16,50,500", help="study sizes, in runs (of 4, 16, 50, 500)")
    parser.add_argument("--repeats", type=int, default=10, help="records per latency measurement")
    parser.add_argument("--renders", type=int, default=5, help="fresh loads per first-render measurement")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    from playwright.sync_api import sync_playwright

    from rlscale.dashboard.app import create_app
    from rlscale.views.page import asset

    tmp = Path(tempfile.mkdtemp(prefix="dashbench"))
    url = f"sqlite:///{tmp / 'store.db'}"
    rng = np.random.default_rng(0)
    with Store(url) as store:
        for runs in sorted({*sizes, 4}):
            seed_study(store, tmp, f"runs{runs}", runs, rng)
    browser_path = shutil.which("chromium") or "/usr/bin/chromium"
    measured = []
    with Background(create_app(url)) as server, sync_playwright() as playwright, Store(url) as writer:
        browser = playwright.chromium.launch(executable_path=browser_path, args=["--no-sandbox"])
        for runs in sizes:
            measured.append(measure_size(browser, server.url, writer, runs, args))
            print(json.dumps(measured[-1], indent=2), flush=True)
        shot = browser.new_page(viewport={"width": 1250, "height": 900})
        shot.goto(server.url + "study/runs4")
        shot.locator("#decision .headline.decided").wait_for(timeout=300_000)  # the decision's thread
        shot.locator("#chart-frontier canvas").wait_for(timeout=30_000)
        shot.screenshot(path=str(RESULTS / "dashboard.png"), full_page=True)
        version = browser.version
        browser.close()
        svg = matplotlib_svg(writer, f"runs{sizes[0]}")
    options = [f"--{k} {v}" for k, v in vars(args).items() if v != parser.get_default(k)]
    result = {
        "command": " ".join(["nice .venv/bin/python bench/dashboard.py", *options]),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "host": f"{platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
        "browser": f"Chromium {version} (headless, playwright)",
        "studies": "IsoCompute, synthetic ScaleRL curves, 100 evaluations a run, SQLite",
        "sizes": measured,
        "alternatives": {
            "uplot_js_bytes": len(asset("uPlot.iife.min.js")),
            "uplot_js_gzip": len(gzip.compress(asset("uPlot.iife.min.js"), 6)),
            f"matplotlib_svg_{sizes[0]}_runs": svg,
        },
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "dashboard.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "sizes"}, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
