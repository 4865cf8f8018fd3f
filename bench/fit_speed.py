"""Speed of the default sigmoid fit (noise="auto", 200 bootstrap resamples, the hull interval on A), beside an
older copy of fitting/sigmoid/fit.py when one is given, both timed in one process and interleaved (curve by curve,
then in blocks of runs, the order alternating) so that a shared machine's load falls on both alike.

  per call:    median ms of one default fit_sigmoid call on 60 synthetic 30-point curves (bench/fit_accuracy.py's
               binomial curves observed to 3,000 GPU-hours, every 100), over --repeats passes; issue 33: <= 4 ms
  1,000 x 200: seconds for the default fits of bench/fit_accuracy.py's 1,000 binomial curves (80 points each);
               issue 33: <= 15 s
  prediction:  median ms of one `predict_at` call (what `fit --at` adds to each fit) on the 60 curves' default fits,
               predicting the mean over the last 10% of twice their compute, beside fitting/laws/predict.py as of
               bench/prediction_intervals.py's BASELINE_COMMIT (today's method), interleaved; issue 41: the
               calibrated interval keeps a `fit --at` call within today's time
Wall and CPU time (this process's own) are both recorded: the machine is shared. With --old, every fit of both
measures is also compared with the old copy's, field by field (the result object's fields and the bootstrap draws).

Usage: nice .venv/bin/python bench/fit_speed.py [--old /tmp/sigmoid_old.py --old-label TEXT] [--repeats 5] [--runs 1000]
Prints the numbers and writes bench/results/fit_speed.json.
"""

import argparse
import datetime
import importlib.util
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from fit_accuracy import simulate  # noqa: E402
from rlscale.fitting import sigmoid as current  # noqa: E402

CALL_CURVES, CALL_OBSERVED = 60, 3_000.0
BLOCK = 25  # runs per block in the 1,000 x 200 measure, old and new alternating
TARGETS = {"median_ms_per_call": "<= 4", "seconds_for_runs": "<= 15 (1,000 runs x 200 resamples)"}
NUMBERS = ("A", "B", "C_mid", "R0", "rss", "r2", "A_lo", "A_hi", "A_upper", "rho")


def load_old(path: str):
    """The module at `path` (a copy of fitting/sigmoid/fit.py), imported under its own name."""
    spec = importlib.util.spec_from_file_location("sigmoid_old", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def timed(fit, compute, reward, **options):
    """(fit, wall seconds, CPU seconds) of one call."""
    start, cpu = time.perf_counter(), time.process_time()
    result = fit(compute, reward, **options)
    return result, time.perf_counter() - start, time.process_time() - cpu


class Differences:
    """The largest relative difference per result field between two implementations' fits, and how many differ."""

    def __init__(self):
        self.fits = self.differing = 0
        self.largest = {}

    def add(self, a, b) -> None:
        self.fits += 1
        worst = {}
        for name in NUMBERS:
            x, y = getattr(a, name), getattr(b, name)
            if not (x == y or (np.isnan(x) and np.isnan(y))):
                worst[name] = abs(x - y) / max(abs(x), abs(y), 1e-300)
        if (a.samples is None) != (b.samples is None) or (
            a.samples is not None and not np.array_equal(a.samples, b.samples, equal_nan=True)
        ):
            same_shape = a.samples is not None and b.samples is not None and a.samples.shape == b.samples.shape
            worst["samples"] = (
                float(np.nanmax(np.abs(a.samples - b.samples) / np.maximum(np.abs(a.samples), 1e-300)))
                if same_shape
                else float("inf")
            )
        for name in ("identified", "reason", "noise", "n_points"):
            if getattr(a, name) != getattr(b, name):
                worst[name] = float("inf")
        self.differing += bool(worst)
        for name, value in worst.items():
            self.largest[name] = max(self.largest.get(name, 0.0), value)

    def summary(self) -> dict:
        return {"fits": self.fits, "fits_differing": self.differing, "largest_relative_difference": self.largest}


def per_call(implementations, repeats: int, differences) -> dict:
    """Median wall and CPU ms per default call on the 30-point curves, the implementations interleaved per curve."""
    curves = [(compute, reward) for _, compute, reward in simulate(CALL_CURVES, 0, "binomial", CALL_OBSERVED)]
    for module in implementations.values():
        module.fit_sigmoid(*curves[0])  # warm-up: imports, caches
    wall = {name: [] for name in implementations}
    cpu = {name: [] for name in implementations}
    order = list(implementations)
    for repeat in range(repeats):
        for i, (compute, reward) in enumerate(curves):
            fits = {}
            for name in order if (repeat + i) % 2 == 0 else order[::-1]:
                fits[name], seconds, cpu_seconds = timed(implementations[name].fit_sigmoid, compute, reward)
                wall[name].append(seconds)
                cpu[name].append(cpu_seconds)
            if differences is not None and repeat == 0:
                differences.add(fits["old"], fits["new"])
    return {
        name: {
            "median_ms_per_call": 1e3 * float(np.median(wall[name])),
            "median_cpu_ms_per_call": 1e3 * float(np.median(cpu[name])),
            "calls": len(wall[name]),
        }
        for name in implementations
    }


def runs_with_bootstrap(implementations, n_runs: int, resamples: int, differences) -> dict:
    """Total wall and CPU seconds of fit_accuracy's default fits (seed 0, binomial), blocks of runs interleaved."""
    runs = list(simulate(n_runs, 0, "binomial"))
    wall = dict.fromkeys(implementations, 0.0)
    cpu = dict.fromkeys(implementations, 0.0)
    order = list(implementations)
    for block, first in enumerate(range(0, n_runs, BLOCK)):
        fits = {}
        for name in order if block % 2 == 0 else order[::-1]:
            fit = implementations[name].fit_sigmoid
            start, cpu_start = time.perf_counter(), time.process_time()
            fits[name] = [
                fit(compute, reward, bootstrap=resamples, seed=first + i)
                for i, (_, compute, reward) in enumerate(runs[first : first + BLOCK])
            ]
            wall[name] += time.perf_counter() - start
            cpu[name] += time.process_time() - cpu_start
        if differences is not None:
            for a, b in zip(fits["old"], fits["new"]):
                differences.add(a, b)
    return {name: {"seconds_for_runs": wall[name], "cpu_seconds_for_runs": cpu[name]} for name in implementations}


def per_prediction(repeats: int) -> dict:
    """Median wall and CPU ms of one predict_at call, today's (BASELINE_COMMIT) and the current, on the default fits of
    the 30-point curves, interleaved per curve; and the default fit call's median on the same curves."""
    from prediction_intervals import BASELINE_COMMIT, load_baseline
    from rlscale.fitting import predict

    baseline = load_baseline()
    implementations = {"old": baseline, "new": predict}
    # today's drift constant (it shipped in a file beside that module), the current calibration as shipped
    options = {"old": {"drift": baseline.Drift(0.085, {})}, "new": {}}
    curves = [(compute, reward) for _, compute, reward in simulate(CALL_CURVES, 0, "binomial", CALL_OBSERVED)]
    fits, fit_cpu = [], []
    for compute, reward in curves:
        fit, _, cpu_seconds = timed(current.fit_sigmoid, compute, reward)
        fits.append(fit)
        fit_cpu.append(cpu_seconds)
    for module in implementations.values():  # warm-up: the calibration file, caches
        module.predict_at(fits[0], *curves[0], 2 * CALL_OBSERVED, **options["old" if module is baseline else "new"])
    wall = {name: [] for name in implementations}
    cpu = {name: [] for name in implementations}
    for repeat in range(repeats):
        for i, ((compute, reward), fit) in enumerate(zip(curves, fits)):
            for name in ["old", "new"] if (repeat + i) % 2 == 0 else ["new", "old"]:
                _, seconds, cpu_seconds = timed(
                    lambda x, y, f=fit, n=name: implementations[n].predict_at(f, x, y, 2 * CALL_OBSERVED, **options[n]),
                    compute,
                    reward,
                )
                wall[name].append(seconds)
                cpu[name].append(cpu_seconds)
    return {
        "old_is": f"fitting/laws/predict.py at {BASELINE_COMMIT}",
        "fit_median_cpu_ms_per_call": 1e3 * float(np.median(fit_cpu)),
        **{
            name: {
                "median_ms_per_call": 1e3 * float(np.median(wall[name])),
                "median_cpu_ms_per_call": 1e3 * float(np.median(cpu[name])),
                "calls": len(wall[name]),
            }
            for name in implementations
        },
    }


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", help="a copy of an earlier fitting/sigmoid/fit.py to time beside the current one")
    parser.add_argument("--old-label", default="", help="what the old copy is (e.g. the commit it was taken at)")
    parser.add_argument("--repeats", type=int, default=5, help="passes over the 60 curves for the per-call median")
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--resamples", type=int, default=200)
    args = parser.parse_args()
    implementations = {"new": current}
    if args.old:
        implementations = {"old": load_old(args.old), "new": current}
    call_diff = Differences() if args.old else None
    runs_diff = Differences() if args.old else None
    print(f"-- per call: {CALL_CURVES} curves of 30 points, {args.repeats} passes")
    calls = per_call(implementations, args.repeats, call_diff)
    for name, row in calls.items():
        print(f"   {name:4s} median {row['median_ms_per_call']:.2f} ms (CPU {row['median_cpu_ms_per_call']:.2f} ms)")
    print(f"-- {args.runs} runs x {args.resamples} resamples (80 points)")
    runs = runs_with_bootstrap(implementations, args.runs, args.resamples, runs_diff)
    for name, row in runs.items():
        print(f"   {name:4s} {row['seconds_for_runs']:.1f} s (CPU {row['cpu_seconds_for_runs']:.1f} s)")
    print("-- prediction (predict_at after a default fit): today's (old) and the current (new)")
    prediction = per_prediction(args.repeats)
    for name in ("old", "new"):
        row = prediction[name]
        print(
            f"   {name:4s} median {row['median_ms_per_call']:.2f} ms (CPU {row['median_cpu_ms_per_call']:.2f} ms); "
            f"the fit before it: CPU {prediction['fit_median_cpu_ms_per_call']:.2f} ms"
        )
    results = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "host_cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "fit": "fit_sigmoid defaults (noise='auto', bootstrap=200, hull interval on A)",
        "per_call": {"curves": CALL_CURVES, "points": int(CALL_OBSERVED // 100), "repeats": args.repeats, **calls},
        "runs_with_bootstrap": {"runs": args.runs, "resamples": args.resamples, "points": 80, **runs},
        "prediction": {"curves": CALL_CURVES, "repeats": args.repeats, "at": 2 * CALL_OBSERVED, **prediction},
        "targets": TARGETS,
        "load_average_1min_at_end": os.getloadavg()[0],
        "note": "shared machine: wall-clock times are upper bounds; cpu_* are this process's own CPU time",
    }
    if args.old:
        results["old"] = f"{args.old_label} ({args.old})" if args.old_label else args.old
        results["results_compared"] = {"per_call": call_diff.summary(), "runs_with_bootstrap": runs_diff.summary()}
        for label, diff in results["results_compared"].items():
            print(
                f"   {label}: {diff['fits_differing']} of {diff['fits']} fits differ from the old copy's"
                + (
                    f" (largest relative differences {diff['largest_relative_difference']})"
                    if diff["fits_differing"]
                    else ""
                )
            )
    out = Path(__file__).resolve().parent / "results" / "fit_speed.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
