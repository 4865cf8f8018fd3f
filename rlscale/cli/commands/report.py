"""`rlscale report STUDY`: per-run fits, the leave-one-out table (method loo), plots, report.md and report.html."""

import math
import shlex
from pathlib import Path

import typer

from rlscale.base.errors import UserError
from rlscale.base.names import child_path
from rlscale.base.numbers import NOISE_BAND
from rlscale.cli.console import bullet, console, print_json, safe, say, table, visible, wrapped
from rlscale.cli.options import MAX_BOOTSTRAP, DbUrl, check_out_dir

REPORT_FILES = "report.md, report.html and the PNGs"


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report(
        study: str = typer.Argument(..., help="study name in the store"),
        db: DbUrl = None,
        out: Path = typer.Option(
            None, "--out", help=("directory for report.md, report.html and the PNGs (default: reports/STUDY)")
        ),
        bootstrap: int = typer.Option(
            200,
            "--bootstrap",
            min=0,
            max=MAX_BOOTSTRAP,
            help="bootstrap draws of the backtest and the leave-one-out table (the fits and the decision are the "
            "study's fit of record)",
        ),
        target: float = typer.Option(
            None,
            "--target",
            help=(
                "the reward whose compute each run is asked for (default: the best run's fitted reward at the compute "
                "every finished run reached)"
            ),
        ),
        json_out: bool = typer.Option(False, "--json", help="print the report's tables as JSON"),
    ) -> None:
        """Fit every run of STUDY, decide, and write the report (markdown + PNGs, and one self-contained HTML page),
        the decision first."""
        from rlscale.db.store import Store
        from rlscale.views.report import study_report

        # the study name becomes a directory: it must stay inside reports/
        out = out or child_path("reports", study, field="study")
        check_out_dir(out, REPORT_FILES)
        if target is not None and not math.isfinite(target):
            raise UserError(f"expected a finite reward, got {target:g}", field="--target")
        store = Store(db, create=False)
        result = study_report(store, study, out, bootstrap=bootstrap, target=target, db=db)
        if json_out:
            print_json(result.to_dict())
            return
        show(result, db)
        show_decision(result.decision_lines)


def show_decision(lines: list[str]) -> None:
    """The decision's lines (rlscale.views.wording.decision_lines), last: sentences and bullets wrapped to the terminal,
    commands whole on their line, to copy."""
    for line in lines:
        console.print(
            visible(line) if line.startswith("  rlscale ") else wrapped(line, rest="  "),
            markup=False,
            highlight=False,
            soft_wrap=True,
        )


def show(result, db: str | None) -> None:
    """The evidence: rich tables of the report (80 columns hold them; report.md has every column), notes as bullets,
    then where the files are. The decision is printed after it (show_decision). `db`: the store its commands name."""
    from rlscale.cli.views import print_fits
    from rlscale.views.report_text import loo_cells

    if result.loo is not None:
        # numbers stay whole; names fold
        loo = table(
            f"{safe(result.study)}: leave-one-out",
            ("variant", "A [95%]", "dA", "B", "verdict"),
            caption=f"dA: the variant's A minus the full recipe's; better/worse: |dA| beyond the "
            f"{NOISE_BAND:g} noise band (C_mid, dB and verdicts in words: report.md)",
            right=("dA", "B"),
            wrap=("variant",),
            fold=True,
        )
        for row in result.loo:
            variant, interval, B, _, dA, *_ = loo_cells(row)
            loo.add_row(
                safe(variant), interval, dA, B, _loo_verdict(row), style="bold red" if row["beyond_noise"] else None
            )
        console.print(loo)
    fits = [{**row, "reason": row["status"].removeprefix("not identified: ")} for row in result.fits]
    print_fits(fits, title=f"{result.study}: sigmoid fits ({result.method}, on {result.fitted_on})")
    if result.backtest is not None:
        # the summary only: the per-run table is in report.md/html and `rlscale backtest --study`
        from rlscale.fitting.backtest import BacktestSummary
        from rlscale.views.tables import backtest_summary_lines
        from rlscale.views.wording import db_flag

        command = f"rlscale backtest --study {shlex.quote(result.study)}{db_flag(db)}"
        say("backtest: each run fitted on its first half, extrapolated; its table per run:")
        show_decision([f"  {command}"])
        for line in backtest_summary_lines(BacktestSummary(**result.backtest["summary"])):
            bullet(line)
    if result.comparison is not None:
        from rlscale.views.tables import compare_cells
        from rlscale.views.wording import comparison_lines as compare_lines

        at = f"{result.comparison['compute']:.4g}"
        numbers = ("seeds", "ident.", "A mean +- sd", "fitted R +- sd", "vs best")
        comparison = table(
            f"{safe(result.study)}: variants across seeds",
            ("variant", *numbers),
            (map(safe, compare_cells(row)[:6]) for row in result.comparison["rows"]),
            caption=f"ident.: seeds whose A is identified; fitted R: fitted reward at {at} (the compute "
            "every finished run reached, unidentified runs that ended earlier aside), the verdict's measure; "
            "vs best: minus the best variant's; "
            "observed end reward: report.md",
            right=numbers,
            wrap=("variant",),
            fold=True,
        )
        console.print(comparison)
        first, *rest = compare_lines(result.comparison)
        say(first)
        for line in rest:
            bullet(line)
    for note in result.notes:
        bullet(note)
    say(f"report: {result.files['html']}")
    say(f"markdown: {result.files['markdown']}")


def _loo_verdict(row) -> str:
    """A leave-one-out row's verdict in a word (report.md has the sentence)."""
    return {
        "full_recipe": "full recipe",
        "no_fit": "no fit",
        "unidentified": "not identified",
        "within_noise": "noise",
    }.get(row["verdict_code"], row["verdict_code"])
