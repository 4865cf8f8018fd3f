"""Benchmark: decisions backtested on real studies (issue 33, item 3).

The real runs in bench/data are grouped into the studies they come from (runs on one task a user would have chosen
between): the CS336 learning-rate sweep and each ablation table, Deep-GRPO's runs, the Qwen3 sizes, the quickstart
study per seed, and our five tiny-policy variations. For each study, every run is cut at 25% and at 50% of its compute,
and the run predicted best at its full compute is picked (fitting.backtest.decide_study); regret = the actual best end
reward minus the picked run's end reward (ends: mean over each run's last 10% of compute). Baselines: the current
leader at the cut, and the fitted asymptote A alone. The five `make demo` sweeps are copies of one seed-0 training per
point (bench/data/README.md): they are one study, its figures the mean over the copies.
Goal: regret <= 0.02 in >= 90% of studies at 50%, and no worse than the current leader at 25%.
Writes bench/results/decisions.json. Run: `.venv/bin/python bench/decisions.py`.
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

from rlscale.base.numbers import NOISE_BAND  # noqa: E402
from rlscale.db.importer import read_run_log  # noqa: E402
from rlscale.fitting.backtest import PICK_METHODS, decide_study  # noqa: E402
from rlscale.fitting.predict import Drift  # noqa: E402

DATA = ROOT / "bench" / "data"
RESULT = ROOT / "bench" / "results" / "decisions.json"
FRACTIONS = (0.25, 0.5)


def runs_of(records: pd.DataFrame, names) -> dict:
    """{run: (compute, reward)} for the named runs of `records`."""
    return {name: (g["compute"].to_numpy(float), g["reward"].to_numpy(float))
            for name, g in records.groupby("run", sort=False) if name in set(names)}


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
        out[f"quickstart.seed{seed[1:]}"] = [runs_of(quick, [n for n in names if n.startswith("seeds.") and n.endswith("_" + seed)])]
    tiny = read_run_log(DATA / "tiny" / "tiny_runs.csv")  # written by bench/backtest.py
    out["tiny.variations"] = [runs_of(tiny, tiny["run"].unique())]
    return out


def main() -> None:
    started = time.perf_counter()
    drift = Drift.load()
    fit = dict(bootstrap=200, noise="auto", seed=0)
    per_study, summary = {}, {}
    for study, copies in studies().items():
        per_study[study] = {"runs": sorted(copies[0]), "copies": len(copies)}
        for f in FRACTIONS:
            decisions = [decide_study(runs, f, drift=drift, **fit) for runs in copies]
            per_study[study][f"at_{f:g}"] = {
                "regret": {m: float(np.mean([d.regret[m] for d in decisions])) for m in PICK_METHODS},
                "within_band": {m: float(np.mean([d.regret[m] <= NOISE_BAND for d in decisions])) for m in PICK_METHODS},
                "decisions": [d.to_dict() for d in decisions]}
    for f in FRACTIONS:
        key = f"at_{f:g}"
        summary[key] = {m: {
            "share_regret_at_most_0.02": float(np.mean([s[key]["within_band"][m] for s in per_study.values()])),
            "mean_regret": float(np.mean([s[key]["regret"][m] for s in per_study.values()]))} for m in PICK_METHODS}
    seconds = time.perf_counter() - started
    print(f"{len(per_study)} studies (regret <= {NOISE_BAND:g}: share of studies; mean regret)")
    for f in FRACTIONS:
        key = f"at_{f:g}"
        print(f"  cut at {f:.0%}: " + "; ".join(
            f"{m} {summary[key][m]['share_regret_at_most_0.02']:.0%}, {summary[key][m]['mean_regret']:.3f}"
            for m in PICK_METHODS))
    for study, s in per_study.items():
        print(f"  {study}: " + "  ".join(f"{k[3:]}: " + ", ".join(f"{m} {s[k]['regret'][m]:.3f}" for m in PICK_METHODS)
                                         for k in s if k.startswith("at_")))
    half, quarter = summary["at_0.5"], summary["at_0.25"]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    result = {
        "protocol": __doc__.split("\n\n")[1].replace("\n", " ").strip(),
        "settings": {**fit, "drift_per_gain": drift.per_gain, "noise_band": NOISE_BAND},
        "goal": {
            "regret_at_most_0.02_in_90pct_of_studies_at_half": bool(half["prediction"]["share_regret_at_most_0.02"] >= 0.9),
            "no_worse_than_leader_at_quarter": bool(
                quarter["prediction"]["share_regret_at_most_0.02"] >= quarter["leader"]["share_regret_at_most_0.02"]
                and quarter["prediction"]["mean_regret"] <= quarter["leader"]["mean_regret"]),
        },
        # how often the interval let a prediction overturn the current leader
        "prediction_differs_from_leader": {
            "decisions": sum(len(s[f"at_{f:g}"]["decisions"]) for s in per_study.values() for f in FRACTIONS),
            "differ": sum(d["picks"]["prediction"] != d["picks"]["leader"]
                          for s in per_study.values() for f in FRACTIONS for d in s[f"at_{f:g}"]["decisions"])},
        "summary": summary, "studies": per_study, "seconds": seconds, "commit": commit,
        "uncommitted_fitting_files": subprocess.run(["git", "diff", "--name-only", "HEAD", "--", "fitting/", ":(exclude)fitting/drift.json"],
                                                    capture_output=True, text=True, cwd=ROOT).stdout.split(),
        "machine": {"platform": platform.platform()},
    }
    RESULT.write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")
    print(f"wrote {RESULT.relative_to(ROOT)} in {seconds:.0f} s")


if __name__ == "__main__":
    main()
