"""A study's report (report.md, PNGs, report.html): the decision the sweep prints first, then the evidence."""

import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from rlscale.base.errors import UserError, made_dir
from rlscale.base.numbers import NOISE_BAND
from rlscale.fitting.backtest import backtest_table
from rlscale.fitting.curves import run_curves, study_unit
from rlscale.fitting.laws.optimal_n import frontier_segments
from rlscale.fitting.laws.target import DEFAULT_LEVEL, curve_targets
from rlscale.fitting.rules.compare import compare_variants
from rlscale.fitting.rules.decision import decide
from rlscale.fitting.rules.reasons import Refusal
from rlscale.fitting.rules.standing import beyond_noise
from rlscale.fitting.sigmoid.points import fitted_points_label
from rlscale.fitting.sigmoid.runs import run_labels, variant_names
from rlscale.fitting.stored import size_law_of, study_fits
from rlscale.planner.study_file import stored_study
from rlscale.views.plots import linearised, plot_frontier, plot_linearised, plot_study
from rlscale.views.report_text import fit_cells, loo_cells, render_html, render_markdown
from rlscale.views.wording import decision_commands, decision_lines, reason_text

# Also imported from here: the plots and table cells the report is made of.
__all__ = [
    "Report",
    "build_report",
    "fit_cells",
    "fit_rows",
    "linearised",
    "loo_cells",
    "loo_table",
    "plot_linearised",
    "render_html",
    "render_markdown",
    "study_report",
]


def identified_in_words(row) -> str:
    """'identified', or 'not identified: <reason>' (the fit's own words)."""
    if bool(row["identified"]):
        return "identified"
    return f"not identified: {row['reason']}" if row.get("reason") else "not identified"


def fit_rows(curves: pd.DataFrame) -> list[dict]:
    """One plain dict per run: run, A, A_lo, A_hi, B, C_mid, R0, r2, n_points, identified (bool), status (words)."""
    return [
        {k: row.get(k) for k in ("run", "A", "A_lo", "A_hi", "B", "C_mid", "R0", "r2", "n_points")}
        | {"identified": bool(row["identified"]), "status": identified_in_words(row)}
        for row in curves.to_dict("records")
    ]


LOO_VERDICTS = {
    "full_recipe": "full recipe",
    "no_fit": "no fit",
    "unidentified": "unidentified fit: dA not meaningful",
    "better": "beyond noise: better asymptote without this component",
    "worse": "beyond noise: worse asymptote without this component",
    "within_noise": "within noise (|dA| < {band:g})",
}


def loo_table(curves: pd.DataFrame, baseline: str = "baseline", noise_band: float = NOISE_BAND) -> list[dict]:
    """ScaleRL's leave-one-out rows: per variant dA, dB vs `baseline` and a verdict; ValueError without a `baseline`."""
    by_name = {row["run"]: row for row in curves.to_dict("records")}
    if baseline not in by_name:
        raise ValueError(f"no {baseline!r} run to compare against (runs: {', '.join(map(str, by_name))})")
    base = by_name[baseline]
    rows = []
    for name, row in by_name.items():
        dA = row["A"] - base["A"] if np.isfinite(row["A"]) and np.isfinite(base["A"]) else float("nan")
        dB = row["B"] - base["B"] if np.isfinite(row["B"]) and np.isfinite(base["B"]) else float("nan")
        trusted = bool(row["identified"]) and bool(base["identified"])
        beyond = name != baseline and trusted and beyond_noise(dA, noise_band=noise_band)
        code = (
            "full_recipe"
            if name == baseline
            else "no_fit"
            if not np.isfinite(dA)
            else "unidentified"
            if not trusted
            else ("better" if dA > 0 else "worse")
            if beyond
            else "within_noise"
        )
        rows.append(
            {"variant": name}
            | {key: row[key] for key in ("A", "A_lo", "A_hi", "B", "C_mid")}
            | {
                "dA": 0.0 if name == baseline else dA,
                "dB": 0.0 if name == baseline else dB,
                "beyond_noise": bool(beyond),
                "identified": bool(row["identified"]),
                "verdict_code": code,
                "verdict": LOO_VERDICTS[code].format(band=noise_band),
            }
        )
    return rows


@dataclass
class Report:
    """Everything the report shows, as plain data; `files` are the written paths, `decision` the Decision or None."""

    study: str
    method: str
    description: str
    unit: str
    fits: list[dict]
    fitted_on: str = "every evaluation"  # or "record-breaking points" (the study's fit.points)
    noise_band: float = NOISE_BAND  # the study's, in its reward's units (fitting.curves.RewardScale)
    loo: list[dict] | None = None
    law: dict | None = None
    backtest: dict | None = None  # fitting.backtest.backtest_table: each run's first half vs its end
    comparison: dict | None = None  # fitting.rules.compare.compare_variants: variants across their seeds
    sizes: dict | None = None  # fitting.laws.model_size.SizeLaw.to_dict: the power law across a `model` axis
    notes: list[str] = field(default_factory=list)
    plots: dict[str, Path] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)
    decision: object = None
    decision_lines: list[str] = field(default_factory=list)
    targets: dict | None = None  # {target, level, note, runs: fitting.laws.target.curve_targets}
    commands: dict = field(default_factory=dict)  # the decision's command lines (Decision.commands)

    def to_dict(self) -> dict:
        """JSON-ready; `decision` is the structured Decision (codes and numbers), its words in `decision_lines`."""
        decision = None if self.decision is None else {**self.decision.to_dict(), "commands": self.commands}
        return {
            "study": self.study,
            "method": self.method,
            "unit": self.unit,
            "decision": decision,
            "decision_lines": self.decision_lines,
            "targets": self.targets,
            "fits": self.fits,
            "fitted_on": self.fitted_on,
            "loo": self.loo,
            "law": self.law,
            "sizes": self.sizes,
            "backtest": self.backtest,
            "comparison": self.comparison,
            "notes": self.notes,
            "files": {k: str(v) for k, v in {**self.plots, **self.files}.items()},
        }


def build_report(
    fits,
    decision,
    out_dir,
    *,
    bootstrap: int = 200,
    seed: int = 0,
    target: float | None = None,
    study_file=None,
    db: str | None = None,
) -> Report:
    """Write report.md, *.png and report.html into out_dir from a study's fit of record and Decision; returns the
    Report. bootstrap, seed: backtest, leave-one-out and size law only; target: default the best run's fitted reward."""
    out = made_dir(out_dir, field="--out")
    with staged(out) as stage:
        return _build(fits, decision, out_dir, stage, out, bootstrap, seed, target, study_file, db)


def _build(fits, decision, out_dir, stage: Path, out: Path, bootstrap, seed, target, study_file, db) -> Report:
    stored, study, runs, records, curves = fits.spec, fits.study, fits.runs.copy(), fits.records, fits.curves
    compute_col, metric = fits.compute_col, fits.metric
    runs["label"] = run_labels(runs)
    runs["variant"] = variant_names(runs)
    report = _new_report(study, stored, unit=fits.unit)  # an imported study's: what its logs counted
    method = report.method
    report.fits = fit_rows(curves)
    report.noise_band = fits.noise_band
    report.fitted_on = fitted_points_label(fits.record_breaking, fits.bin_width) + (
        "" if fits.bounded else "; A and R0 unbounded: the rewards leave [0, 1]"
    )
    law = decision.law
    if law is not None:
        report.law = {**law.to_dict(), "frontier": frontier_segments(law.frontier)}
    _decide(report, decision, study_file, db, out_dir)
    _targets(report, curves, fits.draws, target)
    if method != "loo":  # the leave-one-out table pools each variant's seeds itself
        report.comparison = compare_variants(
            curves,
            records,
            variant_of=dict(zip(runs["label"], runs["variant"])),
            compute_col=compute_col,
            reward_col=metric,
            compute=decision.standing.compute if decision.standing is not None else None,
            noise_band=fits.noise_band,
        )
    # ScaleRL's check of the fits: each run's first half predicts its end (every evaluation, whatever the method)
    report.backtest = backtest_table(
        records, run_col="run", compute_col=compute_col, reward_col=metric, bootstrap=bootstrap, seed=seed
    )
    report.plots["curves"] = plot_study(
        records,
        curves,
        stage / "curves.png",
        run_col="run",
        compute_col=compute_col,
        reward_col=metric,
        record_breaking=fits.record_breaking,
        bin_width=fits.bin_width,
        title=f"{study}: reward vs compute, fitted sigmoids (dashed: extrapolation, band: 95% interval on A)",
    )
    linear_from = (records, curves)
    if method == "loo":
        linear_from = _loo(report, fits, runs, bootstrap, seed, stage)
    report.plots["linearised"] = plot_linearised(
        *linear_from, stage / "linearised.png", compute_col=compute_col, reward_col=metric
    )
    if law is not None:
        standing = decision.standing
        report.plots["optimal_n"] = plot_frontier(
            law,
            stage / "optimal_n.png",
            compute_col=compute_col,
            standing=standing if standing and standing.best_rollouts else None,
        )
    elif decision.refusal and decision.refusal[0].code == "no_frontier":
        report.notes.append(f"no optimal-n law: {decision.refusal[0]['error']}")
    if stored is not None and stored.models:
        _add_size_law(report, fits, bootstrap, seed)
    report.notes += failure_notes(runs)
    unidentified = [row["run"] for row in report.fits if not row["identified"]]
    if unidentified:
        report.notes.append(
            f"{len(unidentified)} of {len(report.fits)} fits are not identified: their A is not "
            "a measurement (see the reason in each row)"
        )
    return write_report(report, stage, out)


def _decide(report: Report, decision, study_file, db, out) -> None:
    report.decision = decision
    report.commands = decision_commands(decision, study_file=study_file, db=db, out=out)
    report.decision_lines = decision_lines(decision, report.commands)
    if report.law is not None and decision.standing is not None:
        report.law["at_compute"] = {
            "compute": decision.standing.compute,
            "rollouts": decision.standing.best_rollouts,
            "run": decision.standing.best["run"],
            "within_band": decision.standing.within_band,
        }


def _targets(report: Report, curves, draws, target: float | None) -> None:
    standing = report.decision.standing if report.decision is not None else None
    if target is None and standing is None:
        return
    why = (
        "the target asked for"
        if target is not None
        else (f"the best run's fitted reward at {standing.compute:.4g}, {standing.best['run']}'s")
    )
    target = float(target if target is not None else standing.best["reward"])
    report.targets = {
        "target": target,
        "level": DEFAULT_LEVEL,
        "runs": curve_targets(curves, draws, target),
        "note": (
            f"The compute at which each run's fitted curve reaches {target:.3f} ({why}), with a "
            f"{DEFAULT_LEVEL:.0%} interval from its bootstrap draws; a run whose asymptote is "
            "below it does not reach it (if that asymptote is identified)."
        ),
    }


def _loo(report: Report, fits, runs, bootstrap, seed, out) -> tuple:
    # one curve per variant: its seeds pooled (ScaleRL's noise band is the seed-to-seed spread)
    records, compute_col, metric = fits.records, fits.compute_col, fits.metric
    names = dict(zip(runs["run_id"], runs["variant"]))
    pooled = records.assign(run=records["run_id"].map(names)).drop(columns=["run_id"])
    variants = (
        runs.assign(run=runs["variant"])
        .drop_duplicates("run")
        .drop(columns=["run_id", "seed", "label", "variant"], errors="ignore")
    )
    loo_curves, _ = run_curves(
        pooled,
        variants,
        compute_col=compute_col,
        reward_col=metric,
        record_breaking=False,
        scale=fits.scale,
        bootstrap=bootstrap,
        seed=seed,
    )
    try:
        report.loo = loo_table(loo_curves, noise_band=fits.noise_band)
    except ValueError as err:
        report.notes.append(f"no leave-one-out table: {err}")
    if runs["variant"].duplicated().any():
        report.notes.append("leave-one-out rows pool each variant's seeds into one fit")
    report.plots["loo_curves"] = plot_study(
        pooled,
        loo_curves,
        out / "loo_curves.png",
        run_col="run",
        compute_col=compute_col,
        reward_col=metric,
        title=f"{report.study}: leave-one-out variants (seeds pooled)",
    )
    return pooled, loo_curves


def _add_size_law(report: Report, fits, bootstrap, seed) -> None:
    try:  # the law `rlscale recommend` reads, on the same runs
        report.sizes = size_law_of(fits, bootstrap=min(bootstrap, 100), seed=seed).to_dict()
    except Refusal as refusal:
        report.notes.append("; ".join(reason_text(reason) for reason in refusal.reasons))


def _new_report(study: str, spec, *, unit: str | None = None) -> Report:
    return Report(
        study=study,
        method=spec.method if spec is not None else "imported",  # as the dashboard names it
        description=spec.description if spec is not None else "",
        unit=unit or study_unit(spec),
        fits=[],
    )


def failure_notes(runs: pd.DataFrame) -> list[str]:
    """'RUN failed: <why>' for each failed run of the store's runs frame: the first line of its stored error."""
    failed = runs[runs["status"] == "failed"]
    labels = run_labels(runs)
    return [
        f"{labels[index]} failed: {str(row.error).strip().splitlines()[0]}"
        for index, row in zip(failed.index, failed.itertuples())
        if isinstance(row.error, str) and row.error.strip()
    ]


@contextmanager
def staged(out: Path):
    """A hidden folder in `out` that a report is written into and then moved from, removed at the end, so a report
    that fails part-way leaves nothing behind."""
    stage = Path(tempfile.mkdtemp(prefix=".report-", dir=out))
    try:
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def write_report(report: Report, stage: Path, out: Path) -> Report:
    """Write report.md and report.html into `stage` beside its plots, then move every file into `out` together,
    once each has somewhere to land; the report's paths then name them there."""
    (stage / "report.md").write_text(render_markdown(report))
    (stage / "report.html").write_text(render_html(report))
    files = sorted(stage.iterdir())
    for path in files:
        if (out / path.name).is_dir():
            raise UserError(f"--out: cannot write {out / path.name}: a directory is in its place")
    for path in files:
        os.replace(path, out / path.name)
    report.plots = {key: out / Path(path).name for key, path in report.plots.items()}
    report.files = {"markdown": out / "report.md", "html": out / "report.html"}
    return report


def study_report(
    store,
    study: str,
    out_dir,
    *,
    bootstrap: int = 200,
    seed: int = 0,
    target: float | None = None,
    study_file=None,
    db: str | None = None,
    extend: float | None = None,
) -> Report:
    """build_report for a stored study; one with no evaluated record yet gets a report that says so."""
    try:
        fits = study_fits(store, study)
    except Refusal:
        report = _new_report(study, stored_study(store, study))
        report.notes += ["no evaluated records yet: nothing to fit", *failure_notes(store.runs_frame(study))]
        out = made_dir(out_dir, field="--out")
        with staged(out) as stage:
            return write_report(report, stage, out)
    if extend is None:
        extend = getattr(fits.spec, "extend", None) or 1.0
    decision = decide(fits, extend=extend)
    return build_report(
        fits, decision, out_dir, bootstrap=bootstrap, seed=seed, target=target, study_file=study_file, db=db
    )
