"""Benchmark: decisions backtested on real studies and on synthetic studies whose curves cross (issues 33 and 41).

Real: the runs in bench/data are grouped into the studies they come from (runs on one task a user would have chosen
between): the CS336 learning-rate sweep and each ablation table, Deep-GRPO's runs, the Qwen3 sizes, the quickstart
study per seed, and our five tiny-policy variations. Each study's intervals are calibrated on the other sources only
(the held-out calibrations bench/backtest.py writes to bench/results/backtest.json). The five `make demo` sweeps are
copies of one seed-0 training per point (bench/data/README.md): they are one study, its figures the mean over the
copies.
Crossing: synthetic ScaleRL-like studies in which the early leader is not the final best (ScaleRL: larger batches
start slower and reach a higher asymptote): 2-4 runs, each next one's C_mid 1.5-2.5 times and A 0.02-0.06 above the
one before, pass rates over 2,500 answers every 100 of 16,000 GPU-hours; kept when the leader at 25% of compute
(noise-free curves) ends more than 0.02 below the best. Their intervals use the calibration the package ships.
For each study, every run is cut at 25% and at 50% of its compute and a run is picked (fitting.backtest.cut_pick,
as `rlscale backtest` and the report pick) by the prediction with its interval (the leader among the runs no other
run surely beats), the point prediction alone, the current leader, and the fitted asymptote A alone; regret = the
actual best end reward minus the picked run's end reward (ends: mean over each run's last 10% of compute).
Goals (issue 41): on crossing studies the interval rule's regret <= 0.02 in more studies than the leader's at 25%;
on the real studies it stays at least as good as the leader at 25% and 50%.
Writes bench/results/decisions.json. Run: `.venv/bin/python bench/decisions.py` (after bench/backtest.py).
"""

import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlscale.db.importer import read_run_log  # noqa: E402
from rlscale.fitting.backtest import PICK_METHODS, backtest_runs, cut_pick  # noqa: E402
from rlscale.fitting.laws.predict import Calibration  # noqa: E402
from rlscale.fitting.sigmoid import sigmoid  # noqa: E402

from rlscale.base.numbers import NOISE_BAND  # noqa: E402

DATA = ROOT / "bench" / "data"
RESULT = ROOT / "bench" / "results" / "decisions.json"
BACKTEST = ROOT / "bench" / "results" / "backtest.json"
FRACTIONS = (0.25, 0.5)


def runs_of(records: pd.DataFrame, names) -> dict:
    """{run: (compute, reward)} for the named runs of `records`."""
    return {
        name: (g["compute"].to_numpy(float), g["reward"].to_numpy(float))
        for name, g in records.groupby("run", sort=False)
        if name in set(names)
    }


def studies() -> dict[str, list[dict]]:
    """{study: [copies]}, each copy {run: (compute, reward)}; a study has several copies only where the same
    trainings were recorded several times (the demo sweeps)."""
    out = {}
    cs336 = read_run_log(DATA / "public" / "cs336_grpo_math_eval_points.csv")
    tables = pd.read_csv(DATA / "public" / "cs336_grpo_math_sources.csv")
    # the off-policy table holds two sweeps of different lengths: the broad one (40 steps) and the focused one
    tables["study"] = tables["name_in_table"].str.split(".").str[0]
    broad = tables["name_in_table"].str.startswith("offpolicy.broad")
    tables.loc[broad, "study"] = "offpolicy_broad"
    tables.loc[(tables["study"] == "offpolicy") & ~broad, "study"] = "offpolicy_focused"
    for study, rows in tables.groupby("study", sort=False):
        members = list(dict.fromkeys(rows["kept_as"]))
        if len(members) >= 2:
            out[f"cs336.{study}"] = [runs_of(cs336, members)]
    deep = read_run_log(DATA / "public" / "deep_grpo_qwen2.5_0.5b_gsm8k.csv")
    out["deep_grpo.gsm8k"] = [runs_of(deep, deep["run"].unique())]
    qwen = read_run_log(DATA / "public" / "verl_qwen3_grpo_gsm8k.csv")
    out["qwen3.sizes"] = [runs_of(qwen, qwen["run"].unique())]
    quick = read_run_log(DATA / "quickstart" / "quickstart_runs.csv")  # written by bench/backtest.py
    names = pd.Series(quick["run"].unique())
    sweeps = sorted({n.split(".")[0] for n in names if n.startswith("sweep")})
    out["quickstart.seed0"] = [runs_of(quick, [n for n in names if n.startswith(s + ".")]) for s in sweeps]
    for seed in sorted({n.rsplit("_", 1)[1] for n in names if n.startswith("seeds.")}):
        mine = [n for n in names if n.startswith("seeds.") and n.endswith("_" + seed)]
        out[f"quickstart.seed{seed[1:]}"] = [runs_of(quick, mine)]
    tiny = read_run_log(DATA / "tiny" / "tiny_runs.csv")  # written by bench/backtest.py
    out["tiny.variations"] = [runs_of(tiny, tiny["run"].unique())]
    return out


# The source (bench/backtest.py's data set) each real study's runs come from, by the study's name prefix
STUDY_SOURCE = {
    "cs336": "cs336_grpo_qwen2.5_math_1.5b",
    "deep_grpo": "deep_grpo_qwen2.5_0.5b_gsm8k",
    "qwen3": "verl_qwen3_grpo_gsm8k",
    "quickstart": "tiny_policy_quickstart_sweeps",
    "tiny": "tiny_policy_cpu",
}
CROSSING_STUDIES = 60
FULL_GPU_HOURS, EVAL_EVERY, ANSWERS = 16_000.0, 100.0, 2_500  # as bench/fit_accuracy.py's binomial curves


def held_out_calibrations() -> dict[str, Calibration]:
    """{source: the interval's calibration fitted on the other sources} (bench/results/backtest.json)."""
    per_source = json.loads(BACKTEST.read_text())["predictions"]["per_source"]
    return {src: Calibration.from_dict(v["calibration_from_other_sources"]) for src, v in per_source.items()}


def end_mean(compute: np.ndarray, reward: np.ndarray, upto: float) -> float:
    """Mean of `reward` over the last 10% of compute up to `upto` (as the backtest reads an end or a cut)."""
    window = (compute <= upto) & (compute >= 0.9 * upto)
    return float(np.mean(reward[window]))


def crossing_studies(n: int, seed: int = 0) -> dict[str, list[dict]]:
    """`n` synthetic ScaleRL-like studies with a known crossing (see the module's docstring), as studies() gives
    them: {name: [{run: (compute, reward)}]}."""
    rng = np.random.default_rng(seed)
    compute = np.arange(EVAL_EVERY, FULL_GPU_HOURS + 1, EVAL_EVERY)
    out = {}
    while len(out) < n:
        k = int(rng.integers(2, 5))
        r0, b = rng.uniform(0.1, 0.3), rng.uniform(1.0, 2.5)
        a, c_mid = rng.uniform(0.45, 0.7), FULL_GPU_HOURS / np.exp(rng.uniform(np.log(8.0), np.log(40.0)))
        curves = {}
        for i in range(k):
            curves[f"batch{i}"] = sigmoid(compute, min(a, 0.95), b * rng.uniform(0.85, 1.15), c_mid, r0)
            a, c_mid = a + rng.uniform(0.02, 0.06), c_mid * rng.uniform(1.5, 2.5)
        leader = max(curves, key=lambda r: end_mean(compute, curves[r], 0.25 * FULL_GPU_HOURS))
        best = max(curves, key=lambda r: end_mean(compute, curves[r], FULL_GPU_HOURS))
        gap = end_mean(compute, curves[best], FULL_GPU_HOURS) - end_mean(compute, curves[leader], FULL_GPU_HOURS)
        if gap <= NOISE_BAND:
            continue
        out[f"crossing{len(out):03d}"] = [
            {run: (compute, rng.binomial(ANSWERS, curve) / ANSWERS) for run, curve in curves.items()}
        ]
    return out


def decide_study(runs: dict, fraction: float, **kwargs):
    """The pick `rlscale backtest` makes from `runs` ({name: (compute, reward)}) cut at `fraction`."""
    records = pd.concat(
        [pd.DataFrame({"run": name, "compute": compute, "reward": reward}) for name, (compute, reward) in runs.items()]
    )
    return cut_pick(backtest_runs(records, fraction=fraction, **kwargs), fraction)


def decide(all_studies: dict, calibration_of, fit: dict) -> dict:
    """Per study: its runs, copies, and at each cut the mean regret, the share within the noise band per method,
    and the decisions; `calibration_of(study)` gives the interval's calibration for it."""
    per_study = {}
    for study, copies in all_studies.items():
        per_study[study] = {"runs": sorted(copies[0]), "copies": len(copies)}
        for f in FRACTIONS:
            decisions = [decide_study(runs, f, calibration=calibration_of(study), **fit) for runs in copies]
            per_study[study][f"at_{f:g}"] = {
                "regret": {m: float(np.mean([d.regret[m] for d in decisions])) for m in PICK_METHODS},
                "within_band": {
                    m: float(np.mean([d.regret[m] <= NOISE_BAND for d in decisions])) for m in PICK_METHODS
                },
                "decisions": [d.to_dict() for d in decisions],
            }
    return per_study


def summarize(per_study: dict) -> dict:
    """Per cut and method: the share of studies with regret <= NOISE_BAND, their count, and the mean regret; and
    how often the interval rule's pick differs from the leader's."""
    summary = {}
    for f in FRACTIONS:
        key = f"at_{f:g}"
        summary[key] = {
            m: {
                "share_regret_at_most_0.02": float(np.mean([s[key]["within_band"][m] for s in per_study.values()])),
                "studies_regret_at_most_0.02": float(np.sum([s[key]["within_band"][m] for s in per_study.values()])),
                "mean_regret": float(np.mean([s[key]["regret"][m] for s in per_study.values()])),
            }
            for m in PICK_METHODS
        }
        decisions = [d for s in per_study.values() for d in s[key]["decisions"]]
        summary[key]["prediction_differs_from_leader"] = {
            "decisions": len(decisions),
            "differ": sum(d["picks"]["prediction"] != d["picks"]["leader"] for d in decisions),
        }
    return summary


def show(label: str, per_study: dict, summary: dict) -> None:
    print(f"{label}: {len(per_study)} studies (regret <= {NOISE_BAND:g}: share of studies; mean regret)")
    for f in FRACTIONS:
        key = f"at_{f:g}"
        differ = summary[key]["prediction_differs_from_leader"]
        print(
            f"  cut at {f:.0%}: "
            + "; ".join(
                f"{m} {summary[key][m]['share_regret_at_most_0.02']:.0%}, {summary[key][m]['mean_regret']:.3f}"
                for m in PICK_METHODS
            )
            + f"; interval rule left the leader in {differ['differ']} of {differ['decisions']}"
        )


def at_least_as_good(summary: dict, key: str) -> bool:
    """The interval rule's share within the band and mean regret are at least as good as the leader's at `key`."""
    rule, leader = summary[key]["prediction"], summary[key]["leader"]
    return bool(
        rule["share_regret_at_most_0.02"] >= leader["share_regret_at_most_0.02"]
        and rule["mean_regret"] <= leader["mean_regret"] + 1e-12
    )


def main() -> None:
    started = time.perf_counter()
    fit = dict(bootstrap=200, noise="auto", seed=0)
    held_out = held_out_calibrations()
    real = decide(studies(), lambda study: held_out[STUDY_SOURCE[study.split(".")[0]]], fit)
    shipped = Calibration.load()
    crossing = decide(crossing_studies(CROSSING_STUDIES), lambda study: shipped, fit)
    real_summary, crossing_summary = summarize(real), summarize(crossing)
    seconds = time.perf_counter() - started
    show("real studies", real, real_summary)
    for study, s in real.items():
        print(
            f"  {study}: "
            + "  ".join(
                f"{k[3:]}: " + ", ".join(f"{m} {s[k]['regret'][m]:.3f}" for m in PICK_METHODS)
                for k in s
                if k.startswith("at_")
            )
        )
    show("crossing studies", crossing, crossing_summary)
    quarter = crossing_summary["at_0.25"]
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    result = {
        "protocol": " ".join(__doc__.split("\n\n")[1].split()),
        "settings": {
            **fit,
            "noise_band": NOISE_BAND,
            "crossing_studies": CROSSING_STUDIES,
            "real_calibration": "held out by source (bench/results/backtest.json)",
            "crossing_calibration": "fitting/laws/interval.json",
        },
        "goal": {
            "crossing_rule_within_band_in_more_studies_than_leader_at_quarter": bool(
                quarter["prediction"]["studies_regret_at_most_0.02"] > quarter["leader"]["studies_regret_at_most_0.02"]
            ),
            "real_rule_at_least_as_good_as_leader_at_quarter": at_least_as_good(real_summary, "at_0.25"),
            "real_rule_at_least_as_good_as_leader_at_half": at_least_as_good(real_summary, "at_0.5"),
        },
        "summary": real_summary,
        "crossing_summary": crossing_summary,
        "studies": real,
        "crossing_studies": crossing,
        "seconds": seconds,
        "commit": commit,
        "uncommitted_fitting_files": subprocess.run(
            ["git", "diff", "--name-only", "HEAD", "--", "fitting/", ":(exclude)fitting/laws/interval.json"],
            capture_output=True,
            text=True,
            cwd=ROOT,
        ).stdout.split(),
        "machine": {"platform": platform.platform()},
    }
    RESULT.write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")
    print(f"wrote {RESULT.relative_to(ROOT)} in {seconds:.0f} s")


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()  # --help, not a run
    main()
