"""Variants of a study compared across their seeds: is any one better than another beyond the noise band?

A variant is one point of the study's grid (a run name); its seeds are the runs that share the name. Two numbers
per variant, each as mean +- sd over seeds: the fitted asymptote A (from identified fits only) and the reward at
the end (each run's mean over its last 10% of compute, as the backtest observes it). Two variants are separated
on a number when its gap is at least ScaleRL's noise band (0.02) and at least twice the seeds' pooled sd; A is
compared only when every seed of both has an identified fit.
"""

import math

import numpy as np
import pandas as pd

from rlscale.base.numbers import NOISE_BAND
from rlscale.fitting.backtest import in_end_window

COMPARE_HEADER = ["variant", "seeds", "A identified", "A mean +- sd", "end reward mean +- sd", "end vs best"]


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


def _separated(a: dict, b: dict, key: str, noise_band: float) -> tuple[float, bool]:
    gap = a[f"{key}_mean"] - b[f"{key}_mean"]
    sds = [s for s in (a[f"{key}_sd"], b[f"{key}_sd"]) if math.isfinite(s)]
    pooled = math.sqrt(sum(s * s for s in sds) / len(sds)) if sds else 0.0
    return gap, bool(math.isfinite(gap) and abs(gap) >= max(noise_band, 2.0 * pooled))


def compare_variants(curves: pd.DataFrame, records: pd.DataFrame, *, variant_of: dict, compute_col: str,
                     reward_col: str, noise_band: float = NOISE_BAND) -> dict | None:
    """{"rows": one dict per variant (best end reward first), "pairs": every pair's gaps and verdicts, "summary": words}.

    curves: per-run fits (a `run` label column, A, identified); records: `run` label, compute and reward columns;
    variant_of: run label -> variant name. None when the study has fewer than two variants.
    """
    by_variant: dict[str, dict] = {}
    fits = {row["run"]: row for row in curves.to_dict("records")}
    for label, group in records.groupby("run", sort=False):
        name = variant_of.get(label)
        if name is None:
            continue
        entry = by_variant.setdefault(name, {"A": [], "end": [], "seeds": 0, "identified": 0})
        entry["seeds"] += 1
        entry["end"].append(end_reward(group[compute_col], group[reward_col]))
        fit = fits.get(label)
        if fit is not None and bool(fit["identified"]):
            entry["identified"] += 1
            entry["A"].append(float(fit["A"]))
    if len(by_variant) < 2:
        return None
    rows = []
    for name, entry in by_variant.items():
        A_mean, A_sd = _mean_sd(entry["A"])
        end_mean, end_sd = _mean_sd(entry["end"])
        rows.append({"variant": name, "seeds": entry["seeds"], "identified": entry["identified"], "A_mean": A_mean,
                     "A_sd": A_sd, "end_mean": end_mean, "end_sd": end_sd})
    rows.sort(key=lambda r: -r["end_mean"] if math.isfinite(r["end_mean"]) else math.inf)
    best = rows[0]
    for row in rows:
        row["end_vs_best"] = row["end_mean"] - best["end_mean"]
    pairs = []
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            end_gap, end_beyond = _separated(a, b, "end", noise_band)
            all_identified = a["identified"] == a["seeds"] and b["identified"] == b["seeds"]
            A_gap, A_beyond = _separated(a, b, "A", noise_band) if all_identified else (float("nan"), False)
            pairs.append({"better": a["variant"], "worse": b["variant"], "end_gap": end_gap, "end_separated": end_beyond,
                          "A_gap": A_gap, "A_separated": A_beyond, "A_compared": all_identified})
    return {"rows": rows, "pairs": pairs, "noise_band": noise_band, "summary": _summary(rows, pairs, noise_band)}


def _summary(rows: list[dict], pairs: list[dict], noise_band: float) -> str:
    separated = [p for p in pairs if p["end_separated"] or p["A_separated"]]
    if separated:
        parts = []
        for p in separated:
            what = [f"end reward +{p['end_gap']:.3f}"] if p["end_separated"] else []
            what += [f"A {p['A_gap']:+.3f}"] if p["A_separated"] else []
            parts.append(f"{p['better']} above {p['worse']} ({', '.join(what)})")
        seeds = "" if any(r["seeds"] >= 2 for r in rows) else " (one seed each: the band is ScaleRL's 3-seed spread)"
        return f"separated beyond the {noise_band:g} noise band{seeds}: " + "; ".join(parts)
    widest = max(pairs, key=lambda p: abs(p["end_gap"]) if math.isfinite(p["end_gap"]) else -1.0)
    sds = [r["end_sd"] for r in rows if math.isfinite(r["end_sd"])]
    spread = (f"; seed-to-seed sd of the end reward {min(sds):.3f}-{max(sds):.3f}" if sds
              else "; one seed each (the band is ScaleRL's 3-seed spread)")
    compared = sum(p["A_compared"] for p in pairs)
    counts = ", ".join(f"{r['variant']} {r['identified']} of {r['seeds']}" for r in rows)
    A_note = "" if compared else f"; A not compared: not every seed's fit is identified ({counts})"
    return (f"no two variants separated beyond the {noise_band:g} noise band: the widest end-reward gap is "
            f"{abs(widest['end_gap']):.3f} ({widest['better']} vs {widest['worse']}){spread}{A_note}")


def summary_lines(comparison: dict, *, limit: int = 3) -> list[str]:
    """The summary as short lines for a terminal: the verdict, then at most `limit` separated pairs (the widest
    end-reward gaps first) and how many more report.md lists."""
    pairs = comparison["pairs"]
    separated = [p for p in pairs if p["end_separated"] or p["A_separated"]]
    if not separated:
        return [comparison["summary"]]
    one_seed = all(r["seeds"] < 2 for r in comparison["rows"])
    lines = [f"{len(separated)} of {len(pairs)} pairs of variants separated beyond the {comparison['noise_band']:g} "
             "noise band" + (" (one seed each: the band is ScaleRL's 3-seed spread)" if one_seed else "") + ":"]
    widest = sorted(separated, key=lambda p: -abs(p["end_gap"]) if math.isfinite(p["end_gap"]) else 0.0)
    for p in widest[:limit]:
        what = [f"end reward +{p['end_gap']:.3f}"] if p["end_separated"] else []
        what += [f"A {p['A_gap']:+.3f}"] if p["A_separated"] else []
        lines.append(f"{p['better']} above {p['worse']} ({', '.join(what)})")
    if len(separated) > limit:
        lines.append(f"and {len(separated) - limit} more (report.md)")
    return lines


def compare_cells(row: dict) -> list[str]:
    """Table cells of one variant's row."""
    def pm(mean, sd):
        if not math.isfinite(mean):
            return "-"
        return f"{mean:.3f} +- {sd:.3f}" if math.isfinite(sd) else f"{mean:.3f}"

    return [str(row["variant"]), str(row["seeds"]), f"{row['identified']} of {row['seeds']}", pm(row["A_mean"], row["A_sd"]),
            pm(row["end_mean"], row["end_sd"]), f"{row['end_vs_best']:+.3f}" if math.isfinite(row["end_vs_best"]) else "-"]
