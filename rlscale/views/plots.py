"""A study's PNGs: rewards with the fitted sigmoids, the linearised curves, and the frontier with the optimal-n law."""

import textwrap
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from rlscale.base.errors import UserError, made_dir
from rlscale.fitting.curves import unit_label
from rlscale.fitting.sigmoid.curve import sigmoid
from rlscale.fitting.sigmoid.points import BIN_WIDTH, record_breaking_points
from rlscale.views.wording import reason_text


def plot_study(
    records: pd.DataFrame,
    fits: pd.DataFrame,
    path,
    *,
    run_col="run",
    compute_col="compute",
    reward_col="reward",
    title=None,
    extrapolate_to=None,
    record_breaking=False,
    bin_width=BIN_WIDTH,
) -> Path:
    """The PNG's path: each run's points, sigmoid (dashed to `extrapolate_to`, default 2x data) and 95% band on A."""
    plt = _pyplot()
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
        best = record_breaking_points(compute[shown], reward[shown], bin_width) if record_breaking else slice(None)
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
    ax.set_xlabel(unit_label(compute_col))
    ax.set_ylabel(reward_col.replace("_", " "))
    set_title(ax, title or "Reward vs compute: fitted sigmoids (dashed: extrapolation, band: 95% interval on A)")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="upper left")  # sigmoids leave the top-left corner empty
    return save_figure(fig, path)


def _pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no display), imported on first use: it is slow to load."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def set_title(ax, text: str, *, fontsize: float = 10, max_lines: int = 3) -> None:
    """Title `ax` with `text` wrapped to the figure's width (at most `max_lines` lines, the rest cut with "...")."""
    # DejaVu Sans runs about 0.6 em per character of prose; a margin keeps the longest line inside the figure
    per_line = max(20, int(0.9 * ax.figure.get_figwidth() * 72 / (fontsize * 0.6)))
    lines = textwrap.wrap(text, per_line, break_long_words=True)
    if len(lines) > max_lines:
        lines = lines[:max_lines]
        lines[-1] = lines[-1][: per_line - 3].rstrip() + "..."
    ax.set_title("\n".join(lines), fontsize=fontsize)


def plot_text(name, limit: int = 48) -> str:
    """`name` as a legend label: `$` escaped (mathtext), a leading `_` spaced (legends drop it), cut past `limit`."""
    text = str(name) if len(str(name)) <= limit else str(name)[: limit - 3] + "..."
    text = text.replace("$", r"\$")
    return " " + text if text.startswith("_") else text


def save_figure(fig, path) -> Path:
    """Lay out `fig`, write it as PNG to `path` (parents created), close it; returns the path."""
    import matplotlib.pyplot as plt

    path = made_dir(Path(path).parent) / Path(path).name
    with warnings.catch_warnings():
        # a glyph the font lacks (CJK in DejaVu Sans) draws as a box; a warning per glyph would bury the result
        warnings.filterwarnings("ignore", message="Glyph .* missing from", category=UserWarning)
        fig.tight_layout()
        try:
            fig.savefig(path)
        except OSError as err:
            raise UserError(f"cannot write {path}: {err.strerror or err}") from None
        finally:
            plt.close(fig)
    return path


def linearised(reward, A: float, R0: float) -> np.ndarray:
    """ScaleRL's F(R) = (A - R) / (R - R0), (C_mid / C)^B on the sigmoid; NaN unless R is strictly between R0 and A."""
    reward = np.asarray(reward, dtype=float)
    lo, hi = min(A, R0), max(A, R0)
    with np.errstate(divide="ignore", invalid="ignore"):
        value = (A - reward) / (reward - R0)
    return np.where((reward > lo) & (reward < hi) & (value > 0), value, np.nan)


# a dozen decades about F = 1 hold any evaluation's F; past them a near-step fit's line only overflows the log axis
_LINE_RANGE = (1e-12, 1e12)


def plot_linearised(
    records: pd.DataFrame, curves: pd.DataFrame, path, *, compute_col: str, reward_col: str, title: str | None = None
) -> Path:
    """The PNG's path: per run, F(R) against compute on log-log axes, points and the fitted line (C_mid / C)^B."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 5), dpi=120)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    drawn, shown, spans = 0, [], []
    for i, row in enumerate(curves.to_dict("records")):
        if not np.isfinite(row["A"]):
            continue
        color = colors[i % len(colors)]
        mine = records[records["run"] == row["run"]]
        compute = mine[compute_col].to_numpy(float)
        value = linearised(mine[reward_col].to_numpy(float), row["A"], row["R0"])
        ok = np.isfinite(value) & (compute > 0)
        ax.scatter(compute[ok], value[ok], s=12, color=color, alpha=0.6)
        shown.append(value[ok])
        positive = compute[np.isfinite(compute) & (compute > 0)]
        spans.append(positive)
        if positive.size:
            grid = np.geomspace(positive.min(), positive.max() * 2, 50)
            with np.errstate(over="ignore", under="ignore"):
                line = (row["C_mid"] / grid) ** row["B"]
            on_axes = (line > _LINE_RANGE[0]) & (line < _LINE_RANGE[1])  # NaN, 0 and overflow are off any axes
            if on_axes.any():
                ax.plot(
                    grid[on_axes],
                    line[on_axes],
                    color=color,
                    lw=1.6,
                    label=f"{plot_text(row['run'])}  B={row['B']:.2f}"
                    + ("" if row["identified"] else " (not identified)"),
                )
                drawn += 1
    points = np.concatenate(shown) if shown else np.array([])
    ax.set_xscale("log")
    ax.set_yscale("log")
    if points.size:
        ax.set_ylim(points.min() / 3, points.max() * 3)
    else:
        ax.set_ylim(0.1, 10.0)
        if not drawn:  # nothing on the axes: a log axis without data has no limits to tick
            reached = np.concatenate(spans) if spans else np.array([])
            ax.set_xlim(*((reached.min() / 2, reached.max() * 2) if reached.size else (1e-3, 1.0)))
        ax.text(
            0.5,
            0.5,
            "no evaluation strictly between R0 and A to linearise",
            transform=ax.transAxes,
            ha="center",
            va="center",
            fontsize=9,
            alpha=0.7,
        )
    ax.set_xlabel(unit_label(compute_col))
    ax.set_ylabel("F(R) = (A - R) / (R - R0)")
    set_title(ax, title or "Linearised curves: slope -B, F = 1 at C_mid")
    ax.grid(True, which="both", alpha=0.25)
    if drawn:  # outside the axes: with many runs an inside legend hides the points
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return save_figure(fig, path)


def plot_frontier(law, path, *, compute_col: str, standing=None, extrapolate_to: float | None = None) -> Path:
    """The PNG's path: n*(C) and the optimal-n law (dashed past the data); the frontier past `standing` faint."""
    plt = _pyplot()
    front = law.frontier
    c_lo, c_hi = law.compute_range
    fig, ax = plt.subplots(figsize=(8, 4), dpi=120)
    reach = standing.compute if standing is not None else np.inf
    inside = front[front["compute"] <= reach * (1 + 1e-9)]
    ax.step(inside["compute"], inside["rollouts"], where="post", color="tab:gray", label="frontier n* (fitted rewards)")
    if len(inside) < len(front):
        past = front[front["compute"] >= (inside["compute"].iloc[-1] if len(inside) else 0.0)]
        ax.step(
            past["compute"],
            past["rollouts"],
            where="post",
            color="tab:gray",
            alpha=0.35,
            ls=":",
            label="past the compute every run reached (fewer runs)",
        )
    grid = np.geomspace(c_lo, c_hi, 200)
    beyond = np.geomspace(c_hi, extrapolate_to or 4 * c_hi, 100)
    ax.plot(
        grid,
        law.predict(grid),
        color="tab:blue",
        lw=2,
        label="law " + ("(identified)" if law.identified else "(not identified)"),
    )
    ax.plot(beyond, law.predict(beyond), color="tab:blue", lw=2, ls="--")
    if standing is not None:
        ax.axvline(standing.compute, color="tab:red", lw=1, alpha=0.6)
        best = f"best at {standing.compute:.3g}: n = {standing.best_rollouts} ({standing.best['run']})"
        ax.plot(
            [standing.compute],
            [standing.best_rollouts],
            marker="o",
            color="tab:red",
            ls="none",
            label=plot_text(best, limit=80),
        )
    ax.set_xscale("log")
    ax.set_yscale("log", base=2)
    ax.set_xlabel(unit_label(compute_col))
    ax.set_ylabel("rollouts per prompt n*")
    set_title(
        ax,
        "Optimal n: frontier and law" + ("" if law.identified else f" (not identified: {reason_text(law.verdict)})"),
        fontsize=9,
    )
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8)
    return save_figure(fig, path)
