"""Variants (run names, across their seeds) judged as every view judges runs: fitted reward at the compute every
finished run reached, separated when the seed-mean gap reaches the noise band and twice the pooled sd."""

import math

import numpy as np
import pandas as pd
from rlscale.fitting.backtest import in_end_window
from rlscale.fitting.curves import reach_of_finished
from rlscale.fitting.rules.reasons import Reason
from rlscale.fitting.rules.standing import beyond_noise, fitted_rewards, pooled_sd, read_runs

from rlscale.base.numbers import NOISE_BAND


def end_reward(compute, reward) -> float:
    """Mean reward over the last END_WINDOW of a run's compute (NaN without points)."""
    x = np.asarray(compute, dtype=float)
    y = np.asarray(reward, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    if not ok.any():
        return float("nan")
    x, y = x[ok], y[ok]
    return float(np.mean(y[in_end_window(x, x.max())]))


def _mean_sd(values: list[float]) -> tuple[float, float]:
    values = [v for v in values if math.isfinite(v)]
    if not values:
        return float("nan"), float("nan")
    return float(np.mean(values)), (float(np.std(values, ddof=1)) if len(values) >= 2 else float("nan"))


def _gap(a: dict, b: dict, key: str, noise_band: float) -> tuple[float, bool]:
    gap = a[f"{key}_mean"] - b[f"{key}_mean"]
    return gap, beyond_noise(gap, pooled_sd([a[f"{key}_sd"], b[f"{key}_sd"]]), noise_band)


def compare_variants(
    curves: pd.DataFrame,
    records: pd.DataFrame,
    *,
    variant_of: dict,
    compute_col: str,
    reward_col: str,
    compute: float | None = None,
    noise_band: float = NOISE_BAND,
) -> dict | None:
    """{"compute", "noise_band", "rows" (per variant, best first), "pairs", "verdict" {code, values}}; None with fewer
    than two variants. compute: where runs are read (default reach_of_finished); variant_of: run label -> variant."""
    compute = reach_of_finished(curves) if compute is None else float(compute)
    readable = read_runs(curves)
    if "c_max" in readable:  # a curve is read only inside its own data
        readable = readable[readable["c_max"].astype(float) >= compute * (1 - 1e-9)]
    read = dict(zip(readable["run"], fitted_rewards(readable, compute))) if compute > 0 and len(readable) else {}
    fits = {row["run"]: row for row in curves.to_dict("records")}
    by_variant: dict[str, dict] = {}
    for label, group in records.groupby("run", sort=False):
        name = variant_of.get(label)
        if name is None:
            continue
        entry = by_variant.setdefault(name, {"A": [], "end": [], "reward": [], "seeds": 0, "identified": 0})
        entry["seeds"] += 1
        entry["end"].append(end_reward(group[compute_col], group[reward_col]))
        entry["reward"].append(float(read.get(label, float("nan"))))
        fit = fits.get(label)
        if fit is not None and bool(fit["identified"]):
            entry["identified"] += 1
            entry["A"].append(float(fit["A"]))
    if len(by_variant) < 2:
        return None
    rows = []
    for name, entry in by_variant.items():
        row = {"variant": name, "seeds": entry["seeds"], "identified": entry["identified"]}
        for key in ("reward", "A", "end"):
            row[f"{key}_mean"], row[f"{key}_sd"] = _mean_sd(entry[key])
        rows.append(row)
    rows.sort(key=lambda r: -r["reward_mean"] if math.isfinite(r["reward_mean"]) else math.inf)
    best = rows[0]
    for row in rows:
        row["reward_vs_best"] = row["reward_mean"] - best["reward_mean"]
        row["within_band"] = row is best or (
            math.isfinite(row["reward_vs_best"]) and not _gap(best, row, "reward", noise_band)[1]
        )
    pairs = []
    for i, a in enumerate(rows):
        for b in rows[i + 1 :]:
            gap, separated = _gap(a, b, "reward", noise_band)
            all_identified = a["identified"] == a["seeds"] and b["identified"] == b["seeds"]
            A_gap, A_beyond = _gap(a, b, "A", noise_band) if all_identified else (float("nan"), False)
            pairs.append(
                {
                    "better": a["variant"],
                    "worse": b["variant"],
                    "gap": gap,
                    "separated": separated,
                    "end_gap": a["end_mean"] - b["end_mean"],
                    "A_gap": A_gap,
                    "A_separated": A_beyond,
                    "A_compared": all_identified,
                }
            )
    verdict = _verdict(rows, pairs, compute, noise_band)
    return {
        "compute": compute,
        "noise_band": noise_band,
        "rows": rows,
        "pairs": pairs,
        "verdict": verdict.to_dict(),
    }


def _verdict(rows: list[dict], pairs: list[dict], compute: float, noise_band: float) -> Reason:
    one_seed = not any(r["seeds"] >= 2 for r in rows)
    common = {
        "compute": compute,
        "noise_band": noise_band,
        "one_seed": one_seed,
        "best": rows[0]["variant"],
        "within_band": [r["variant"] for r in rows if r["within_band"]],
    }
    separated = sorted((p for p in pairs if p["separated"]), key=lambda p: -abs(p["gap"]))
    if separated:
        return Reason(
            "variants_separated",
            {**common, "pairs": [{"better": p["better"], "worse": p["worse"], "gap": p["gap"]} for p in separated]},
        )
    finite = [p for p in pairs if math.isfinite(p["gap"])]
    widest = max(finite, key=lambda p: abs(p["gap"])) if finite else pairs[0]
    sds = [r["reward_sd"] for r in rows if math.isfinite(r["reward_sd"])]
    compared = any(p["A_compared"] for p in pairs)
    return Reason(
        "variants_within_band",
        {
            **common,
            "widest": {"better": widest["better"], "worse": widest["worse"], "gap": abs(widest["gap"])},
            "sd_lo": min(sds) if sds else None,
            "sd_hi": max(sds) if sds else None,
            "identified": None
            if compared
            else [{"variant": r["variant"], "identified": r["identified"], "seeds": r["seeds"]} for r in rows],
        },
    )
