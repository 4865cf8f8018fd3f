"""A study's report: per-run fits in words, ScaleRL's leave-one-out table, curves and the linearised F(R) plot.

Writes report.md with PNGs beside it and one self-contained report.html (PNGs inlined as base64) that a
person opens in a browser. The tables are built once (pure functions of the fits) and rendered three ways:
markdown, HTML, and rich in the terminal (the command).
"""

import base64
import html
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from rlscale.fitting.backtest import BACKTEST_HEADER, BACKTEST_NOTE, backtest_table, table_lines, table_rows
from rlscale.fitting.compare import COMPARE_HEADER, compare_cells, compare_variants
from rlscale.fitting.curves import UNIT_LABELS, compute_column, run_curves, study_unit
from rlscale.fitting.frame import run_labels, variant_names
from rlscale.fitting.model_size import SIZE_HEADER, SIZE_NOTE, size_rows, size_summary
from rlscale.fitting.plots import plot_text, save_figure, set_title
from rlscale.fitting.records import fits_record_breaking, fitted_points_label

from rlscale.base.numbers import NOISE_BAND
from rlscale.base.numbers import format_number as _f

COMPUTE_LABELS = UNIT_LABELS


def identified_in_words(row) -> str:
    """'identified', or 'not identified: <reason>' (the fit's own words)."""
    if bool(row["identified"]):
        return "identified"
    return f"not identified: {row['reason']}" if row.get("reason") else "not identified"


def fit_rows(curves: pd.DataFrame) -> list[dict]:
    """One plain dict per run: run, A, A_lo, A_hi, B, C_mid, R0, r2, n_points, identified (bool), status (words)."""
    rows = []
    for row in curves.to_dict("records"):
        rows.append({k: row.get(k) for k in ("run", "A", "A_lo", "A_hi", "B", "C_mid", "R0", "r2", "n_points")}
                    | {"identified": bool(row["identified"]), "status": identified_in_words(row)})
    return rows


def loo_table(curves: pd.DataFrame, baseline: str = "baseline", noise_band: float = NOISE_BAND) -> list[dict]:
    """ScaleRL's leave-one-out table: each variant's A [lo, hi], B, C_mid, dA vs the full recipe and whether |dA| is beyond noise."""
    by_name = {row["run"]: row for row in curves.to_dict("records")}
    if baseline not in by_name:
        raise ValueError(f"no {baseline!r} run to compare against (runs: {', '.join(map(str, by_name))})")
    base = by_name[baseline]
    rows = []
    for name, row in by_name.items():
        dA = row["A"] - base["A"] if np.isfinite(row["A"]) and np.isfinite(base["A"]) else float("nan")
        dB = row["B"] - base["B"] if np.isfinite(row["B"]) and np.isfinite(base["B"]) else float("nan")
        trusted = bool(row["identified"]) and bool(base["identified"])
        if name == baseline:
            verdict = "full recipe"
        elif not np.isfinite(dA):
            verdict = "no fit"
        elif not trusted:
            verdict = "unidentified fit: dA not meaningful"
        elif abs(dA) >= noise_band:
            verdict = "beyond noise: " + ("better" if dA > 0 else "worse") + " asymptote without this component"
        else:
            verdict = f"within noise (|dA| < {noise_band:g})"
        rows.append({"variant": name, "A": row["A"], "A_lo": row["A_lo"], "A_hi": row["A_hi"], "B": row["B"],
                     "C_mid": row["C_mid"], "dA": 0.0 if name == baseline else dA, "dB": 0.0 if name == baseline else dB,
                     "beyond_noise": bool(name != baseline and trusted and np.isfinite(dA) and abs(dA) >= noise_band),
                     "identified": bool(row["identified"]), "verdict": verdict})
    return rows


def linearised(reward, A: float, R0: float) -> np.ndarray:
    """ScaleRL's F(R) = (A - R) / (R - R0); NaN where R is not strictly between R0 and A.

    For the sigmoid, F = (C_mid / C)^B: a straight line of slope -B against C on log-log axes.
    """
    reward = np.asarray(reward, dtype=float)
    lo, hi = min(A, R0), max(A, R0)
    with np.errstate(divide="ignore", invalid="ignore"):
        value = (A - reward) / (reward - R0)
    return np.where((reward > lo) & (reward < hi) & (value > 0), value, np.nan)


# F values the linearised plot draws a fitted line within: a dozen decades about F = 1 hold any evaluation's F
# (pass rates in float64); beyond them a near-step fit's line only overflows the log transform.
_LINE_RANGE = (1e-12, 1e12)


def plot_linearised(records: pd.DataFrame, curves: pd.DataFrame, path, *, compute_col: str, reward_col: str,
                    title: str | None = None) -> Path:
    """PNG of F(R) against compute on log-log axes per run: points and the fitted line (C_mid / C)^B.

    The axes span the points: a near-step fit's line (large B) runs to 0 and to overflow within the data, and is drawn
    where it is within a dozen decades of F = 1. Without a point strictly between R0 and A anywhere, the axes show a
    decade either side of F = 1 (C_mid), and say so.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5), dpi=120)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    drawn, shown = 0, []
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
        if positive.size:
            grid = np.geomspace(positive.min(), positive.max() * 2, 50)
            with np.errstate(over="ignore", under="ignore"):
                line = (row["C_mid"] / grid) ** row["B"]
            on_axes = (line > _LINE_RANGE[0]) & (line < _LINE_RANGE[1])  # NaN, 0 and overflow are off any axes
            if on_axes.any():
                ax.plot(grid[on_axes], line[on_axes], color=color, lw=1.6,
                        label=f"{plot_text(row['run'])}  B={row['B']:.2f}" + ("" if row["identified"] else " (not identified)"))
                drawn += 1
    points = np.concatenate(shown) if shown else np.array([])
    ax.set_xscale("log")
    ax.set_yscale("log")
    if points.size:
        ax.set_ylim(points.min() / 3, points.max() * 3)
    else:
        ax.set_ylim(0.1, 10.0)
        ax.text(0.5, 0.5, "no evaluation strictly between R0 and A to linearise", transform=ax.transAxes,
                ha="center", va="center", fontsize=9, alpha=0.7)
    ax.set_xlabel(COMPUTE_LABELS.get(compute_col, compute_col))
    ax.set_ylabel("F(R) = (A - R) / (R - R0)")
    set_title(ax, title or "Linearised curves: slope -B, F = 1 at C_mid")
    ax.grid(True, which="both", alpha=0.25)
    if drawn:  # outside the axes: with many runs an inside legend hides the points
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return save_figure(fig, path)


def plot_frontier(law, path, *, compute_col: str, extrapolate_to: float | None = None) -> Path:
    """PNG of the frontier's n*(C) (steps) and the fitted optimal-n law (dashed beyond the data)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    front = law.frontier
    c_lo, c_hi = law.compute_range
    fig, ax = plt.subplots(figsize=(8, 4), dpi=120)
    ax.step(front["compute"], front["rollouts"], where="post", color="tab:gray", label="frontier n*")
    inside = np.geomspace(c_lo, c_hi, 200)
    beyond = np.geomspace(c_hi, extrapolate_to or 4 * c_hi, 100)
    ax.plot(inside, law.predict(inside), color="tab:blue", lw=2, label="law " + ("(identified)" if law.identified else "(not identified)"))
    ax.plot(beyond, law.predict(beyond), color="tab:blue", lw=2, ls="--")
    ax.set_xscale("log")
    ax.set_yscale("log", base=2)
    ax.set_xlabel(COMPUTE_LABELS.get(compute_col, compute_col))
    ax.set_ylabel("rollouts per prompt n*")
    set_title(ax, "Optimal n: frontier and law" + ("" if law.identified else f" (not identified: {law.reason})"),
              fontsize=9)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


@dataclass
class Report:
    """Everything the report shows, as plain data; `files` are the written paths."""

    study: str
    method: str
    description: str
    unit: str
    fits: list[dict]
    fitted_on: str = "every evaluation"  # or "record-breaking points" (the study's fit.points)
    loo: list[dict] | None = None
    law: dict | None = None
    backtest: dict | None = None  # fitting.backtest.backtest_table: each run's first half vs its end
    comparison: dict | None = None  # fitting.compare.compare_variants: variants across their seeds
    sizes: dict | None = None  # fitting.model_size.SizeLaw.to_dict: the power law across a `model` axis
    notes: list[str] = field(default_factory=list)
    plots: dict[str, Path] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """JSON-ready."""
        return {"study": self.study, "method": self.method, "unit": self.unit, "fits": self.fits,
                "fitted_on": self.fitted_on, "loo": self.loo,
                "law": self.law, "sizes": self.sizes, "backtest": self.backtest, "comparison": self.comparison, "notes": self.notes, "files": {k: str(v) for k, v in {**self.plots, **self.files}.items()}}


def build_report(stored, runs: pd.DataFrame, records: pd.DataFrame, out_dir, *, study: str,
                 bootstrap: int = 200, seed: int = 0) -> Report:
    """Fit, plot and write report.md, *.png and report.html into out_dir; returns the Report. `stored`: the study
    (rlscale.planner.study.Study), or None for one imported without a spec (a grid of runs, on val_reward)."""
    from rlscale.fitting.plots import plot_study

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    method = stored.method if stored is not None else "grid"
    unit = study_unit(stored)
    compute_col = compute_column(stored)
    metric = stored.metric if stored is not None else "val_reward"
    records = records[pd.to_numeric(records[metric], errors="coerce").notna()].copy()
    runs = runs.copy()
    runs["label"] = run_labels(runs)
    runs["variant"] = variant_names(runs)
    records["run"] = records["run_id"].map(dict(zip(runs["run_id"], runs["label"])))
    report = Report(study=study, method=method, description=stored.description if stored is not None else "", unit=unit, fits=[])
    if records.empty:
        report.notes.append("no evaluated records yet: nothing to fit")
        return write_report(report, out)

    # the study's fit.points: IsoCompute fits the running frontier (record-breaking points), ScaleRL every evaluation
    record_breaking = fits_record_breaking(stored)
    report.fitted_on = fitted_points_label(record_breaking)
    per_run = runs.assign(run=runs["label"]).drop(columns=["run_id", "seed"], errors="ignore")
    curves, draws = run_curves(records.drop(columns=["run_id"]), per_run, compute_col=compute_col, reward_col=metric,
                               record_breaking=record_breaking, bootstrap=bootstrap, seed=seed)
    report.fits = fit_rows(curves)
    if method != "loo":  # the leave-one-out table pools each variant's seeds itself
        report.comparison = compare_variants(curves, records, variant_of=dict(zip(runs["label"], runs["variant"])),
                                             compute_col=compute_col, reward_col=metric)
    # ScaleRL's check of the fits: each run's first half predicts its end (every evaluation, whatever the method)
    report.backtest = backtest_table(records, run_col="run", compute_col=compute_col, reward_col=metric,
                                     bootstrap=bootstrap, seed=seed)
    report.plots["curves"] = plot_study(records, curves, out / "curves.png", run_col="run", compute_col=compute_col,
                                        reward_col=metric, record_breaking=record_breaking,
                                        title=f"{study}: reward vs compute, fitted sigmoids "
                                        "(dashed: extrapolation, band: 95% interval on A)")
    linear_from = (records, curves)
    if method == "loo":
        # one curve per variant: its seeds pooled (ScaleRL's noise band is the seed-to-seed spread)
        names = dict(zip(runs["run_id"], runs["variant"]))
        pooled = records.assign(run=records["run_id"].map(names)).drop(columns=["run_id"])
        variants = (runs.assign(run=runs["variant"]).drop_duplicates("run")
                    .drop(columns=["run_id", "seed", "label", "variant"], errors="ignore"))
        loo_curves, _ = run_curves(pooled, variants, compute_col=compute_col,
                                   reward_col=metric, record_breaking=False, bootstrap=bootstrap, seed=seed)
        try:
            report.loo = loo_table(loo_curves)
        except ValueError as err:
            report.notes.append(f"no leave-one-out table: {err}")
        if runs["variant"].duplicated().any():
            report.notes.append("leave-one-out rows pool each variant's seeds into one fit")
        report.plots["loo_curves"] = plot_study(pooled, loo_curves, out / "loo_curves.png", run_col="run",
                                                compute_col=compute_col, reward_col=metric,
                                                title=f"{study}: leave-one-out variants (seeds pooled)")
        linear_from = (pooled, loo_curves)
    report.plots["linearised"] = plot_linearised(*linear_from, out / "linearised.png", compute_col=compute_col,
                                                 reward_col=metric)
    geometry = curves[["prompts_per_batch", "rollouts"]].dropna()
    if geometry["rollouts"].nunique() >= 2:
        from rlscale.fitting.optimal_n import fit_optimal_rollouts

        usable = curves[curves[["A", "B", "C_mid", "R0"]].notna().all(axis=1)]
        if usable["rollouts"].nunique() >= 2:
            try:
                law = fit_optimal_rollouts(usable, draws=draws, bootstrap=min(bootstrap, 50), seed=seed)
            except ValueError as err:  # e.g. every run stopped before its inflection
                report.notes.append(f"no optimal-n law: {err}")
            else:
                report.law = law.to_dict()
                report.plots["optimal_n"] = plot_frontier(law, out / "optimal_n.png", compute_col=compute_col)
    if stored is not None and stored.models:
        _add_size_law(report, stored, runs, records, compute_col, metric, bootstrap, seed)
    unidentified = [row["run"] for row in report.fits if not row["identified"]]
    if unidentified:
        report.notes.append(f"{len(unidentified)} of {len(report.fits)} fits are not identified: their A is not "
                            "a measurement (see the reason in each row)")
    return write_report(report, out)


def _add_size_law(report: Report, stored, runs, records, compute_col, metric, bootstrap, seed) -> None:
    """The power law across the study's model sizes into report.sizes, or a note saying why it cannot be fitted."""
    from rlscale.fitting.model_size import fit_size_law, size_frame
    from rlscale.fitting.sigmoid import FitError

    frame = size_frame(records, runs, {name: size.parameters for name, size in stored.models.items()},
                       compute_col=compute_col, reward_col=metric)
    try:
        report.sizes = fit_size_law(frame, bootstrap=min(bootstrap, 100), seed=seed).to_dict()
    except FitError as err:
        report.notes.append(f"no power law across model sizes: {err}")


def write_report(report: Report, out: Path) -> Report:
    """Write report.md and report.html for `report` into `out`."""
    report.files["markdown"] = out / "report.md"
    report.files["markdown"].write_text(render_markdown(report))
    report.files["html"] = out / "report.html"
    report.files["html"].write_text(render_html(report))
    return report


def _interval(row) -> str:
    return f"{_f(row['A'])} [{_f(row['A_lo'])}, {_f(row['A_hi'])}]"


FIT_HEADER = ["run", "A [95%]", "B", "C_mid", "R0", "r2", "points", "fit"]
COMPARE_NOTE = (f"Each variant over its seeds: A from identified fits only, and the reward at the end (each run's mean "
                f"over its last 10% of compute). Separated: a gap of at least {NOISE_BAND:g} and at least twice the "
                "seeds' pooled sd; A compared only where every seed's fit is identified.")
LOO_HEADER = ["variant", "A [95%]", "B", "C_mid", "dA", "dB", f"beyond {NOISE_BAND:g} noise", "verdict"]


def fit_cells(row) -> list[str]:
    """Table cells of one per-run fit."""
    return [str(row["run"]), _interval(row), _f(row["B"], "{:.2f}"), _f(row["C_mid"], "{:.3g}"), _f(row["R0"]),
            _f(row["r2"]), str(row["n_points"]), row["status"]]


def loo_cells(row) -> list[str]:
    """Table cells of one leave-one-out row."""
    return [row["variant"], _interval(row), _f(row["B"], "{:.2f}"), _f(row["C_mid"], "{:.4g}"), _f(row["dA"], "{:+.3f}"),
            _f(row["dB"], "{:+.2f}"), "yes" if row["beyond_noise"] else "no", row["verdict"]]


def _md_table(header, rows) -> str:
    """A markdown table; the first column (run or variant names) is escaped so that it shows as typed."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join([_md_text(row[0]), *(cell.replace("|", "\\|") for cell in row[1:])]) + " |"
              for row in rows]
    return "\n".join(lines)


_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]<>#|!~$])")


def _md_text(text) -> str:
    """`text` (a run name, or prose quoting one) with markdown's punctuation escaped, so it renders as typed."""
    return _MD_SPECIAL.sub(r"\\\1", str(text))


def render_markdown(report: Report) -> str:
    """report.md: tables and PNG links (relative, beside the file)."""
    parts = [f"# {report.study}: scaling report", "",
             f"Method: {report.method}. Compute: {COMPUTE_LABELS.get(report.unit, report.unit)}. {report.description}".strip(), ""]
    if report.loo is not None:
        parts += ["## Leave-one-out (ScaleRL)", "",
                  f"dA is each variant's asymptote minus the full recipe's; |dA| < {NOISE_BAND} is seed noise.", "",
                  _md_table(LOO_HEADER, [loo_cells(r) for r in report.loo]), ""]
    if report.comparison is not None:
        parts += ["## Variants across seeds", "", COMPARE_NOTE, "",
                  _md_table(COMPARE_HEADER, [compare_cells(r) for r in report.comparison["rows"]]), "",
                  f"- {_md_text(report.comparison['summary'])}", ""]
    parts += ["## Per-run sigmoid fits", "", f"R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B), fitted on {report.fitted_on}",
              "",
              _md_table(FIT_HEADER, [fit_cells(r) for r in report.fits]), ""]
    if report.backtest is not None:
        parts += ["## Backtest (ScaleRL: fit on the first half, extrapolate)", "", BACKTEST_NOTE, "",
                  _md_table(BACKTEST_HEADER, table_rows(report.backtest)), "",
                  *(f"- {line}" for line in table_lines(report.backtest)), ""]
    if report.law is not None:
        law = report.law
        parts += ["## Optimal rollouts per prompt", "",
                  f"log2 n*(C) = {law['lo']:.2f} + ({law['hi']:.2f} - {law['lo']:.2f}) / (1 + exp(-{law['k']:.2f} (ln C - {law['c0']:.2f}))); "
                  f"{'identified' if law['identified'] else 'not identified'}: {law['reason']}", ""]
    if report.sizes is not None:
        parts += ["## Across model sizes (Tan et al.)", "", SIZE_NOTE, "",
                  _md_table(SIZE_HEADER, size_rows(report.sizes)), "", f"- {_md_text(size_summary(report.sizes))}", ""]
    for note in report.notes:
        parts.append(f"- {_md_text(note)}")
    if report.notes:
        parts.append("")
    for name, path in report.plots.items():
        parts += [f"## {name.replace('_', ' ')}", "", f"![{name}]({Path(path).name})", ""]
    return "\n".join(parts)


_CSS = """body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1100px;color:#222;background:#fff}
h1{font-size:1.6em;border-bottom:2px solid #3b6ea5;padding-bottom:.2em}h2{font-size:1.2em;margin-top:1.6em;color:#3b6ea5}
table{border-collapse:collapse;font-size:.9em;margin:.5em 0}th,td{border:1px solid #ccc;padding:.3em .6em;text-align:left}
th{background:#e8eef6}tr.beyond td{background:#fde8e8}tr.unidentified td{color:#888}img{max-width:100%;border:1px solid #ddd}
.note{background:#fff8e0;border-left:4px solid #e0b000;padding:.4em .8em;margin:.4em 0}"""


def _html_table(header, rows, classes=None) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def render_html(report: Report) -> str:
    """report.html: one self-contained page (CSS inline, PNGs as base64 data URIs)."""
    parts = [f"<h1>{html.escape(report.study)}: scaling report</h1>",
             f"<p>Method: <b>{html.escape(report.method)}</b>. Compute: {html.escape(COMPUTE_LABELS.get(report.unit, report.unit))}. "
             f"{html.escape(report.description)}</p>"]
    if report.loo is not None:
        parts += ["<h2>Leave-one-out (ScaleRL)</h2>",
                  f"<p>dA is each variant's asymptote minus the full recipe's; |dA| &lt; {NOISE_BAND} is seed noise.</p>",
                  _html_table(LOO_HEADER, [loo_cells(r) for r in report.loo],
                              ["beyond" if r["beyond_noise"] else ("" if r["identified"] else "unidentified") for r in report.loo])]
    if report.comparison is not None:
        parts += ["<h2>Variants across seeds</h2>", f"<p>{html.escape(COMPARE_NOTE)}</p>",
                  _html_table(COMPARE_HEADER, [compare_cells(r) for r in report.comparison["rows"]]),
                  f"<p>{html.escape(report.comparison['summary'])}</p>"]
    parts += ["<h2>Per-run sigmoid fits</h2>",
              f"<p>R(C) = R0 + (A - R0) / (1 + (C_mid / C)<sup>B</sup>), fitted on {html.escape(report.fitted_on)}</p>",
              _html_table(FIT_HEADER, [fit_cells(r) for r in report.fits],
                          ["" if r["identified"] else "unidentified" for r in report.fits])]
    if report.backtest is not None:
        parts += ["<h2>Backtest (ScaleRL: fit on the first half, extrapolate)</h2>", f"<p>{html.escape(BACKTEST_NOTE)}</p>",
                  _html_table(BACKTEST_HEADER, table_rows(report.backtest),
                              ["" if r["fitted"] else "unidentified" for r in report.backtest["runs"]]),
                  *(f"<p>{html.escape(line)}</p>" for line in table_lines(report.backtest))]
    if report.law is not None:
        law = report.law
        parts.append(f"<h2>Optimal rollouts per prompt</h2><p>log2 n*(C) = {law['lo']:.2f} + ({law['hi']:.2f} - {law['lo']:.2f}) / "
                     f"(1 + exp(-{law['k']:.2f} (ln C - {law['c0']:.2f}))); {'identified' if law['identified'] else 'not identified'}: "
                     f"{html.escape(law['reason'])}</p>")
    if report.sizes is not None:
        parts += ["<h2>Across model sizes (Tan et al.)</h2>", f"<p>{html.escape(SIZE_NOTE)}</p>",
                  _html_table(SIZE_HEADER, size_rows(report.sizes)), f"<p>{html.escape(size_summary(report.sizes))}</p>"]
    parts += [f'<p class="note">{html.escape(note)}</p>' for note in report.notes]
    for name, path in report.plots.items():
        data = base64.b64encode(Path(path).read_bytes()).decode()
        parts.append(f"<h2>{html.escape(name.replace('_', ' '))}</h2><img alt=\"{html.escape(name)}\" src=\"data:image/png;base64,{data}\">")
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(report.study)} report</title>"
            f"<style>{_CSS}</style></head><body>{''.join(parts)}</body></html>\n")


def study_report(store, study: str, out_dir, *, bootstrap: int = 200, seed: int = 0) -> Report:
    """The report of a stored study, written into out_dir."""
    from rlscale.planner.study import stored_study

    return build_report(stored_study(store, study), store.runs_frame(study), store.records_frame(study), out_dir,
                        study=study, bootstrap=bootstrap, seed=seed)
