"""`rlscale report STUDY`: per-run fits, the leave-one-out table (method loo), plots, report.md and report.html."""

from pathlib import Path

import typer

from rlscale.cli.options import DbUrl


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report(
        study: str = typer.Argument(..., help="study name in the store"),
        db: DbUrl = None,
        out: Path = typer.Option(None, "--out", help="directory for report.md, report.html and the PNGs (default: reports/STUDY)"),
        bootstrap: int = typer.Option(200, "--bootstrap", min=0, help="bootstrap draws for the intervals"),
        json_out: bool = typer.Option(False, "--json", help="print the report's tables as JSON"),
    ) -> None:
        """Fit every run of STUDY and write the report (markdown + PNGs, and one self-contained HTML page)."""
        from rlscale.db.store import Store
        from rlscale.fitting.report import study_report
        from rlscale.base.errors import UserError
        from rlscale.base.names import child_path
        from rlscale.cli.console import print_json

        # the study name becomes a directory: it must stay inside reports/
        out = out or child_path("reports", study, field="study")
        if out.exists() and not out.is_dir():
            raise UserError(f"{out} is a file: expected a directory for report.md, report.html and the PNGs", field="--out")
        store = Store(db, create=False)
        result = study_report(store, study, out, bootstrap=bootstrap)
        if json_out:
            print_json(result.to_dict())
            return
        show(result)


def show(result) -> None:
    """Rich tables of the report, then where the files are."""
    from rich.table import Table

    from rlscale.base.numbers import NOISE_BAND
    from rlscale.fitting.report import FIT_HEADER, LOO_HEADER, fit_cells, loo_cells
    from rlscale.cli.console import console, safe

    if result.loo is not None:
        table = Table(title=f"{safe(result.study)}: leave-one-out (|dA| < {NOISE_BAND:g} is noise)")
        width = min(28, max(len(str(row["variant"])) for row in result.loo))
        for col in LOO_HEADER:
            # names stay whole; on a narrow terminal the other cells wrap
            table.add_column(col, min_width=width if col == "variant" else None)
        for row in result.loo:
            table.add_row(*map(safe, loo_cells(row)), style="bold red" if row["beyond_noise"] else None)
        console.print(table)
    # 100 columns with run names of 20 characters, 80 with the quickstart's (no outer padding, "pts")
    table = Table(title=f"{safe(result.study)}: sigmoid fits ({result.method}, on {result.fitted_on})",
                  caption_justify="left", pad_edge=False)
    width = min(20, max((len(str(row["run"])) for row in result.fits), default=3))
    for col in FIT_HEADER:
        # the interval on A stays on one line; on a narrow terminal the other cells wrap
        table.add_column("pts" if col == "points" else col, min_width=width if col == "run" else None,
                         no_wrap=col == "A [95%]")
    reasons = []  # printed under the table, so a long reason does not squeeze the numbers
    for row in result.fits:
        cells = [safe(cell) for cell in fit_cells(row)]
        cells[-1] = "yes"
        if not row["identified"]:
            reasons.append(f"({len(reasons) + 1}) {safe(row['run'])}: {safe(row['status'])}")
            cells[-1] = f"no ({len(reasons)})"
        table.add_row(*cells, style=None if row["identified"] else "dim")
    table.caption = "\n".join(reasons) or None
    console.print(table)
    if result.backtest is not None:
        # the summary only: the per-run table has 11 columns and is unreadable under ~160 (report.md/html and
        # `rlscale backtest --study` have it)
        from rlscale.fitting.backtest import BacktestSummary, summary_lines

        console.print(f"backtest (each run fitted on its first half, extrapolated; table: rlscale backtest --study "
                      f"{safe(result.study)}):", highlight=False, soft_wrap=True)
        for line in summary_lines(BacktestSummary(**result.backtest["summary"])):
            console.print(f"  {line}", highlight=False, soft_wrap=True)
    if result.comparison is not None:
        from rlscale.fitting.compare import COMPARE_HEADER, compare_cells

        table = Table(title=f"{safe(result.study)}: variants across seeds (end: mean over the last 10% of compute)")
        for col in COMPARE_HEADER:
            table.add_column(col)
        for row in result.comparison["rows"]:
            table.add_row(*map(safe, compare_cells(row)))
        console.print(table)
        console.print(safe(result.comparison["summary"]), highlight=False, soft_wrap=True)
    for note in result.notes:
        console.print(f"note: {safe(note)}", highlight=False, soft_wrap=True)
    console.print(f"report: {safe(result.files['html'])}  (markdown: {safe(result.files['markdown'])})", highlight=False, soft_wrap=True)
