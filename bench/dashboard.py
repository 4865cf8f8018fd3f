"""`rlscale dashboard`: what a study page weighs and how soon a stored record is on the screen.

  page weight: bytes the browser transfers to show a study of 16 runs x 100 evaluations (4 B_p x 4 n, IsoCompute),
               every response body counted once (HTML, styles, scripts, the first poll's JSON); gzip of the same
               bodies beside it (the dashboard itself sends them uncompressed), and what each part weighs
  latency:     seconds from a record's commit (a second writer adds one evaluation to a run) to the page drawing
               it (the chart's point count moving), over --repeats records; the page polls once a second
  alternatives: the same chart as matplotlib SVG (bytes, seconds to draw), and the sizes of the chart libraries
               considered (uPlot as vendored here; Plotly's bundle is recorded in docs/dashboard.md, not fetched)

The dashboard and headless Chromium (playwright, /usr/bin/chromium) run in this process's machine; a screenshot of
a 4-run study's page goes to bench/results/dashboard.png (the README's).
Usage: nice .venv/bin/python bench/dashboard.py [--repeats 20]
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
import time
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


def seed_study(store, tmp: Path, name: str, prompts: list[int], rollouts: list[int], rng) -> None:
    """An IsoCompute study whose runs are synthetic ScaleRL curves (binomial noise), EVALUATIONS each, with a sweep's
    statuses: most done, one stopped by the rule, two in flight on 2 GPUs, one queued."""
    spec = {
        "name": name,
        "description": "synthetic curves: the dashboard's benchmark",
        "method": "isocompute",
        "compute": {"unit": "gpu_hours", "budget": 0.05, "scope": "per_run", "profile": "tiny-cpu"},
        "early_terminate": {"type": "asymptote", "min_fraction": 0.25},
        "recipe": RECIPE,
        "parameters": {"prompts_per_batch": {"values": prompts}, "rollouts": {"values": rollouts}},
    }
    (tmp / f"{name}.yaml").write_text(yaml.safe_dump(spec))
    study = load_study(tmp / f"{name}.yaml")
    store.upsert_study(name, study.to_spec())
    from rlscale.planner.planning import planned_runs

    points = planned_runs(study)
    for i, point in enumerate(points):
        run_id = store.ensure_run(name, point.name, point.recipe.to_json(), point.seed)
        n = point.recipe.rollouts
        asymptote = 0.55 + 0.05 * np.log2(n) - 0.01 * np.log2(point.recipe.prompts_per_batch)
        hours = np.linspace(0.0, 0.05, EVALUATIONS + 1)[1:]
        reward = rng.binomial(1536, sigmoid(hours, asymptote, 1.6, 0.004 * n**0.5, 0.12)) / 1536
        store.add_records(
            run_id,
            [
                {"step": 10 * (k + 1), "gpu_hours": float(h), "val_reward": float(r)}
                for k, (h, r) in enumerate(zip(hours, reward))
            ],
        )
        status, note = "done", None
        if i == 1:
            status, note = "stopped", "asymptote at most 0.581 < best run's lower bound 0.712"
        elif i in (len(points) - 3, len(points) - 2):
            status, note = "running", "on 2 GPU"
        elif i == len(points) - 1:
            status = "pending"
        store.set_run_status(run_id, status, error=note)


def page_weight(page, url: str) -> dict:
    """Load `url` fresh, wait for the charts; bytes of every response body by kind, plain and gzipped."""
    bodies = []
    page.on("response", lambda response: bodies.append(response))
    page.goto(url)
    page.locator("#chart-curves canvas").wait_for(timeout=120_000)
    page.locator("#live-status", has_text="live: last change").wait_for(timeout=30_000)  # the first poll
    parts = {}
    for response in bodies:
        body = response.body()
        name = response.url.rsplit("/", 1)[-1].split("?")[0] or "index"
        kind = "json" if "/api/" in response.url else name
        entry = parts.setdefault(kind, {"bytes": 0, "gzip": 0})
        entry["bytes"] += len(body)
        entry["gzip"] += len(gzip.compress(body, 6))
    return {
        "total_bytes": sum(p["bytes"] for p in parts.values()),
        "total_gzip": sum(p["gzip"] for p in parts.values()),
        "parts": parts,
    }


def latency(page, url: str, store, study: str, repeats: int) -> list[float]:
    """Seconds from a record's commit to the page drawing it, `repeats` times (one record each)."""
    run_id = int(store.runs_frame(study)["run_id"].iloc[-2])  # a run in flight
    last = store.records_frame(study)
    step, hours = int(last["step"].max()), float(last["gpu_hours"].max())
    out = []
    for k in range(repeats):
        shown = int(page.get_attribute("#chart-curves", "data-points"))
        time.sleep(0.3 + 0.7 * (k % 4) / 4)  # records land at every phase of the page's one-second poll
        step, hours = step + 10, hours * 1.01
        store.add_records(run_id, [{"step": step, "gpu_hours": hours, "val_reward": 0.6}])
        stored = time.perf_counter()
        page.locator(f'#chart-curves[data-points="{shown + 1}"]').wait_for(timeout=30_000)
        out.append(time.perf_counter() - stored)
    return out


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
    plot_study(
        records.assign(run=records["run"]),
        curves[pd.notna(curves["A"])],
        path,
        compute_col="gpu_hours",
        reward_col="val_reward",
    )
    return {
        "bytes": path.stat().st_size,
        "seconds_to_draw": round(time.perf_counter() - fitted, 2),
        "seconds_to_fit": round(fitted - started, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    from rlscale.dashboard.app import create_app
    from rlscale.dashboard.server import Background
    from rlscale.views.page import asset

    tmp = Path(tempfile.mkdtemp(prefix="dashbench"))
    url = f"sqlite:///{tmp / 'store.db'}"
    rng = np.random.default_rng(0)
    with Store(url) as store:
        seed_study(store, tmp, "sixteen", [8, 16, 32, 64], [2, 4, 8, 16], rng)
        seed_study(store, tmp, "quickstart", [16], [2, 4, 8, 16], rng)
    browser_path = shutil.which("chromium") or "/usr/bin/chromium"
    with Background(create_app(url)) as server, sync_playwright() as playwright, Store(url) as writer:
        browser = playwright.chromium.launch(executable_path=browser_path, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1250, "height": 1000})
        weight = page_weight(page, server.url + "study/sixteen")
        delays = latency(page, server.url + "study/sixteen", writer, "sixteen", args.repeats)
        shot = browser.new_page(viewport={"width": 1250, "height": 900})
        shot.goto(server.url + "study/quickstart")
        shot.locator("#decision .headline.decided").wait_for(timeout=300_000)  # the decision's thread
        shot.locator("#chart-frontier canvas").wait_for(timeout=30_000)
        shot.screenshot(path=str(RESULTS / "dashboard.png"), full_page=True)
        browser.close()
        svg = matplotlib_svg(writer, "sixteen")
    ordered = sorted(delays)
    result = {
        "command": "nice .venv/bin/python bench/dashboard.py"
        + (f" --repeats {args.repeats}" if args.repeats != 20 else ""),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "host": f"{platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
        "study": "16 runs x 100 evaluations (IsoCompute, 4 B_p x 4 n)",
        "page": weight,
        "latency_s": {
            "median": round(statistics.median(delays), 3),
            "p90": round(ordered[int(0.9 * len(ordered)) - 1], 3),
            "max": round(ordered[-1], 3),
            "min": round(ordered[0], 3),
            "repeats": len(delays),
            "poll_s": 1.0,
        },
        "alternatives": {
            "uplot_js_bytes": len(asset("uPlot.iife.min.js")),
            "uplot_js_gzip": len(gzip.compress(asset("uPlot.iife.min.js"), 6)),
            "matplotlib_svg": svg,
        },
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "dashboard.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
