"""One PNG per study: reward points (filled: those the fits used), fitted sigmoids and their extrapolation."""

from pathlib import Path

import numpy as np
import pandas as pd

from rlscale.fitting.records import record_breaking_points
from rlscale.fitting.sigmoid import sigmoid


def plot_study(records: pd.DataFrame, fits: pd.DataFrame, path, *, run_col="run", compute_col="compute",
               reward_col="reward", title=None, extrapolate_to=None, record_breaking=False) -> Path:
    """Path of the written PNG: per run, points (filled: those the fit used, the record breakers when
    `record_breaking`, else every one), the fitted curve (solid over the
    observed compute, dashed beyond it up to `extrapolate_to`, default 2x the largest observed compute)
    and a band from the 95% interval on A; log-x axis. Runs without a fit show points only.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if compute_col not in records.columns and compute_col == "compute" and "gpu_hours" in records.columns:
        compute_col = "gpu_hours"
    runs = records.groupby(run_col, sort=False) if run_col in records.columns else [("all", records)]
    fit_by_run = {row["run"]: row for _, row in fits.iterrows()} if "run" in fits.columns else {}
    positive = records[compute_col][records[compute_col] > 0]
    c_max = float(extrapolate_to or 2.0 * positive.max())
    c_min = float(positive.min())

    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (run, group) in enumerate(runs):
        color = colors[i % len(colors)]
        compute = group[compute_col].to_numpy(dtype=float)
        reward = group[reward_col].to_numpy(dtype=float)
        shown = compute > 0  # log axis
        if record_breaking:  # hollow: the points the fit left out
            ax.scatter(compute[shown], reward[shown], s=10, facecolors="none", edgecolors=color, alpha=0.5, lw=0.8)
        best = record_breaking_points(compute[shown], reward[shown]) if record_breaking else slice(None)
        ax.scatter(compute[shown][best], reward[shown][best], s=16, color=color)
        fit = fit_by_run.get(run)
        label = plot_text(run)
        if fit is not None and np.isfinite(fit["A"]):
            observed_max = float(np.nanmax(compute))
            params = (fit["A"], fit["B"], fit["C_mid"], fit["R0"])
            inside = np.geomspace(c_min, observed_max, 200)
            beyond = np.geomspace(observed_max, max(c_max, observed_max), 200)
            ax.plot(inside, sigmoid(inside, *params), color=color, lw=1.8)
            ax.plot(beyond, sigmoid(beyond, *params), color=color, lw=1.8, ls="--")
            if np.isfinite(fit["A_lo"]) and np.isfinite(fit["A_hi"]):
                both = np.concatenate([inside, beyond])
                lo = sigmoid(both, fit["A_lo"], *params[1:])
                hi = sigmoid(both, fit["A_hi"], *params[1:])
                ax.fill_between(both, lo, hi, color=color, alpha=0.15, lw=0)
                label += f"  A={fit['A']:.3f} [{fit['A_lo']:.3f}, {fit['A_hi']:.3f}]"
            else:
                label += f"  A={fit['A']:.3f}"
            if not bool(fit["identified"]):
                label += " (not identified)"
        ax.plot([], [], color=color, marker="o", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("GPU-hours" if compute_col == "gpu_hours" else compute_col.replace("_", " "))
    ax.set_ylabel(reward_col.replace("_", " "))
    set_title(ax, title or "Reward vs compute: fitted sigmoids (dashed: extrapolation, band: 95% interval on A)")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="upper left")  # sigmoids leave the top-left corner empty
    return save_figure(fig, path)


def set_title(ax, text: str, *, fontsize: float = 10, max_lines: int = 3) -> None:
    """Title `ax` with `text` wrapped to the figure's width (at most `max_lines` lines, the rest cut with "...")."""
    import textwrap

    # DejaVu Sans runs about 0.6 em per character of prose; a margin keeps the longest line inside the figure
    per_line = max(20, int(0.9 * ax.figure.get_figwidth() * 72 / (fontsize * 0.6)))
    lines = textwrap.wrap(text, per_line, break_long_words=True)
    if len(lines) > max_lines:
        lines = lines[:max_lines]
        lines[-1] = lines[-1][:per_line - 3].rstrip() + "..."
    ax.set_title("\n".join(lines), fontsize=fontsize)


def plot_text(name, limit: int = 48) -> str:
    """A run name as a legend shows it literally: `$` would start mathtext, a legend drops labels starting with
    `_`, and a name past `limit` characters is cut with "..." (a long label would squeeze the axes away)."""
    text = str(name) if len(str(name)) <= limit else str(name)[:limit - 3] + "..."
    text = text.replace("$", r"\$")
    return " " + text if text.startswith("_") else text


def save_figure(fig, path) -> Path:
    """Lay out `fig`, write it as PNG to `path` (parents created), close it; returns the path."""
    import warnings

    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        # a run name in a script the font lacks (CJK in DejaVu Sans) is drawn as boxes; a warning per glyph
        # would print above the command's result
        warnings.filterwarnings("ignore", message="Glyph .* missing from", category=UserWarning)
        fig.tight_layout()
        fig.savefig(path)
    plt.close(fig)
    return path
