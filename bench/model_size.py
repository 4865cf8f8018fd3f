"""Benchmark: Tan et al.'s power law across model sizes, backtested on the public Qwen3 runs (issue 33, item 5).

The runs: verl GRPO on GSM8K of Qwen3-0.6B/1.7B/4B/8B/14B-Base (bench/data/README.md), one run per size, the same
batch every step. Compute C = step x N (billions of parameter-steps): a step's FLOPs are ~6 N T with T the same
batch's tokens, taken as equal across sizes (the export has no token counts). L = 1 - GSM8K mean@1; step 0 left out.
1. Inter-model: fit the lines ln L = -k ln C + E on 0.6B-4B, K_max and N0 across them and E(N) on a line in ln N, and
   predict the 8B and 14B curves; error in reward against carrying the 4B line over, and the 90% interval's coverage
   (bootstrap over each size's evaluations).
2. The size for the budget: at budgets C, fit every size's line on its evaluations up to C / 2 (and C / 4: pilots)
   and pick the size predicted best at C (fitting.laws.model_size.choose_size); regret = the best reward measured at C
   minus the picked size's, among the sizes whose run reached C. Baseline: the leader at the pilot's end.
3. The crossovers the law puts between the sizes, fitted on every evaluation.
Writes bench/results/model_size.json. Run: `.venv/bin/python bench/model_size.py`.
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
from rlscale.fitting.laws.model_size import choose_size, fit_size_law  # noqa: E402
from rlscale.fitting.laws.powerlaw import fit_across_sizes  # noqa: E402
from rlscale.fitting.rules.recommend import Refusal  # noqa: E402
from rlscale.fitting.sigmoid import FitError  # noqa: E402

DATA = ROOT / "bench" / "data" / "public" / "verl_qwen3_grpo_gsm8k.csv"
RESULT = ROOT / "bench" / "results" / "model_size.json"
PARAMETERS = {"0.6b": 0.6e9, "1.7b": 1.7e9, "4b": 4e9, "8b": 8e9, "14b": 14e9}  # the models' nominal sizes
FITTED = ("0.6b", "1.7b", "4b")
BOOTSTRAP, LEVEL = 200, 0.9


def qwen_frame() -> pd.DataFrame:
    """model_size.size_frame's columns for the Qwen3 runs: C = step x N / 1e9, L = 1 - reward, step 0 dropped."""
    runs = read_run_log(DATA)
    size = runs["run"].str.extract(r"qwen3-([0-9.]+b)-base")[0]
    frame = pd.DataFrame(
        {
            "model": size,
            "parameters": size.map(PARAMETERS),
            "run": runs["run"],
            "compute": runs["compute"].astype(float) * size.map(PARAMETERS) / 1e9,
            "loss": 1.0 - runs["reward"].astype(float),
        }
    )
    return frame[frame["compute"] > 0].reset_index(drop=True)


def inter_model(frame: pd.DataFrame) -> dict:
    """Fit on FITTED, predict the larger sizes' every evaluation; errors, coverage and the law's identification."""
    law = fit_size_law(frame[frame["model"].isin(FITTED)], bootstrap=BOOTSTRAP, level=LEVEL)
    point = fit_across_sizes(law.parameters, law.k, law.E)
    draws = []
    for k, E in zip(law.k_draws, law.E_draws):
        try:
            draws.append(fit_across_sizes(law.parameters, k, E))
        except FitError:  # a draw where a size's loss does not fall: no law
            continue
    out = {
        "fitted_on": list(FITTED),
        "K_max": point.K_max,
        "N0": point.N0,
        "E_line": {"intercept": point.E_intercept, "slope_per_ln_N": point.E_slope},
        "law_identified": law.across_identified,
        "law_reason": law.across_reason,
        "held_out": {},
    }
    last = len(FITTED) - 1
    for model in [m for m in PARAMETERS if m not in FITTED]:
        mine = frame[frame["model"] == model]
        c, reward = mine["compute"].to_numpy(), 1.0 - mine["loss"].to_numpy()
        n = PARAMETERS[model]
        predicted = 1.0 - point.extrapolated_loss(n, c)
        band = 1.0 - np.array([d.extrapolated_loss(n, c) for d in draws])
        lo, hi = np.nanpercentile(band, [(1 - LEVEL) / 2 * 100, (1 + LEVEL) / 2 * 100], axis=0)
        carried = 1.0 - np.exp(-law.k[last] * np.log(c) + law.E[last])  # the largest fitted size's line
        out["held_out"][model] = {
            "evaluations": int(c.size),
            "compute_range": [float(c.min()), float(c.max())],
            "law_median_abs_error": float(np.median(np.abs(predicted - reward))),
            "law_error_at_last": float(predicted[-1] - reward[-1]),
            "carry_4b_median_abs_error": float(np.median(np.abs(carried - reward))),
            "coverage": float(np.mean((reward >= lo) & (reward <= hi))),
            "median_width": float(np.median(hi - lo)),
        }
    return out


def measured_reward(frame: pd.DataFrame, model: str, budget: float) -> float | None:
    """The size's reward at compute `budget`, linear in ln C between its evaluations; None if it never got there."""
    mine = frame[frame["model"] == model].sort_values("compute")
    if mine["compute"].max() < budget:
        return None
    return float(np.interp(np.log(budget), np.log(mine["compute"]), 1.0 - mine["loss"]))


def size_decisions(frame: pd.DataFrame, fraction: float) -> dict:
    """At budgets across the range, pick the size from pilots at `fraction` of the budget; regret vs the leader.
    The candidates at a budget are the sizes whose run reached it with 3 or more evaluations in the pilot."""
    rows = []
    for budget in np.geomspace(30.0, 700.0, 9):
        pilot = frame[frame["compute"] <= fraction * budget]
        counts = pilot.groupby("model").size()
        candidates = [m for m in PARAMETERS if measured_reward(frame, m, budget) is not None and counts.get(m, 0) >= 3]
        if len(candidates) < 2:
            continue
        pilot = pilot[pilot["model"].isin(candidates)]
        actual = {m: measured_reward(frame, m, budget) for m in candidates}
        best = max(actual.values())
        leader = pilot.sort_values("compute").groupby("model").tail(1).set_index("model")["loss"].idxmin()
        row = {
            "budget": float(budget),
            "sizes": candidates,
            "actual_best": max(actual, key=actual.get),
            "actual": actual,
            "leader": leader,
            "leader_regret": best - actual[leader],
        }
        try:
            choice = choose_size(fit_size_law(pilot, bootstrap=BOOTSTRAP, level=LEVEL), float(budget))
        except (FitError, Refusal) as why:
            row.update(picked=None, refused=str(why))
        else:
            row.update(picked=choice.model, pick_share=choice.pick_share, regret=best - actual[choice.model])
        rows.append(row)
    decided = [r for r in rows if r["picked"] is not None]

    def share(key):
        return float(np.mean([r[key] <= 0.02 for r in decided])) if decided else None

    def mean(key):
        return float(np.mean([r[key] for r in decided])) if decided else None

    return {
        "pilot_fraction": fraction,
        "rows": rows,
        "decided": len(decided),
        "refused": len(rows) - len(decided),
        "share_regret_le_0.02": share("regret"),
        "mean_regret": mean("regret"),
        "leader_share_regret_le_0.02": share("leader_regret"),
        "leader_mean_regret": mean("leader_regret"),
    }


def crossovers(frame: pd.DataFrame) -> dict:
    """The winner changes the law puts between the sizes, fitted on every evaluation, with their intervals."""
    law = fit_size_law(frame, bootstrap=BOOTSTRAP, level=LEVEL)
    budget = float(law.compute_max.min())  # a budget every size's run reached
    choice = choose_size(law, budget)
    return {
        "law": law.to_dict(),
        "crossovers": choice.crossovers,
        "budget": budget,
        "pick": choice.model,
        "measured_best": max(PARAMETERS, key=lambda m: measured_reward(frame, m, budget)),
    }


def main() -> None:
    start = time.perf_counter()
    frame = qwen_frame()
    result = {
        "data": str(DATA.relative_to(ROOT)),
        "compute": "step x N / 1e9 (billions of parameter-steps)",
        "inter_model": inter_model(frame),
        "size_for_budget": [size_decisions(frame, f) for f in (0.5, 0.25)],
        "across_all_sizes": crossovers(frame),
        "seconds": time.perf_counter() - start,
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip(),
        "machine": {"platform": platform.platform()},
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    inter = result["inter_model"]
    print(
        f"fit on {', '.join(FITTED)}: K_max {inter['K_max']:.3g}, N0 {inter['N0']:.3g}; "
        f"{'identified' if inter['law_identified'] else 'not identified'}: {inter['law_reason']}"
    )
    for model, r in inter["held_out"].items():
        print(
            f"  {model}: median |error| law {r['law_median_abs_error']:.3f} vs 4B line "
            f"{r['carry_4b_median_abs_error']:.3f}; {LEVEL:.0%} coverage {r['coverage']:.0%}, "
            f"width {r['median_width']:.3f}"
        )
    for sizes in result["size_for_budget"]:
        print(f"pilots at {sizes['pilot_fraction']:.0%} of the budget:")
        if not sizes["rows"]:
            print("  no budget that 2 sizes reached with 3 evaluations each in the pilot")
        for r in sizes["rows"]:
            picked = r["picked"] or "refused: " + r["refused"][21:60]
            print(f"  C {r['budget']:6.1f}: best {r['actual_best']:>4}, picked {picked}, leader {r['leader']}")
        if sizes["decided"]:
            print(
                f"  regret <= 0.02 in {sizes['share_regret_le_0.02']:.0%} of {sizes['decided']}, mean "
                f"{sizes['mean_regret']:.3f}; leader {sizes['leader_share_regret_le_0.02']:.0%}, mean "
                f"{sizes['leader_mean_regret']:.3f}; refused {sizes['refused']}"
            )
    for c in result["across_all_sizes"]["crossovers"]:
        print(
            f"  crossover: {c['above']} beats {c['below']} above C {c['budget']:.3g} "
            f"[{c['budget_lo']:.3g}, {c['budget_hi']:.3g}]{'' if c['identified'] else ', not identified'}"
            f"{'' if c['measured'] else ', past the data'}"
        )
    across = result["across_all_sizes"]
    print(f"all sizes at C {across['budget']:.3g}: law picks {across['pick']}, measured best {across['measured_best']}")
    RESULT.write_text(json.dumps(result, indent=2, default=float) + "\n")
    print(f"wrote {RESULT.relative_to(ROOT)} ({result['seconds']:.1f} s)")


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()  # --help, not a run
    main()
