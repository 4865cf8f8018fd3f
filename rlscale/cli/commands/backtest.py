"""`rlscale backtest`: ScaleRL's check of the fit on real runs: fit each run on its first part, extrapolate to its
end."""

from pathlib import Path

import typer

from rlscale.base.errors import UserError
from rlscale.base.numbers import format_number as _f
from rlscale.cli.console import bullet, console, print_json, safe, say, table
from rlscale.cli.options import MAX_BOOTSTRAP, ComputeTag, DbUrl, RewardTag, check_fit_source


def register(app: typer.Typer) -> None:
    @app.command("backtest")
    def backtest(
        file: Path = typer.Argument(
            None, help="run log: .csv/.jsonl, a TensorBoard directory or a verl file-logger .jsonl"
        ),
        study: str = typer.Option(None, "--study", help="backtest the stored records of this study instead of a file"),
        db: DbUrl = None,
        fraction: float = typer.Option(
            0.5, "--fraction", help="fit on the points at compute <= this share of each run's last compute"
        ),
        level: float = typer.Option(0.9, "--level", help="the level of the end reward's prediction interval"),
        r0: float = typer.Option(None, "--r0", help="reward before RL, held fixed (default: fitted)"),
        min_compute: float = typer.Option(
            0.0, "--min-compute", min=0.0, metavar="<float>", help="drop points below this compute"
        ),
        bootstrap: int = typer.Option(200, "--bootstrap", min=2, help="bootstrap resamples for the intervals"),
        noise: str = typer.Option(
            "auto",
            "--noise",
            help="reward noise around the curve, as for `rlscale fit`: auto, binomial, constant, multiplicative",
        ),
        unbounded: bool = typer.Option(False, "--unbounded", help="the metric is not a pass rate in [0, 1]"),
        tag: RewardTag = None,
        compute_tag: ComputeTag = None,
        json_out: bool = typer.Option(
            False, "--json", help="print {source, fraction, runs: [...], summary: {...}, decision: {...}} as JSON"
        ),
    ) -> None:
        """Fit each run on its first part of compute, extrapolate to its end, and compare (ScaleRL's check).

        Per run: the part-fit's predicted reward at the run's end with its prediction interval (--level), the
        observed reward there (mean over the last 10% of compute), the error, a carry-forward baseline, and whether
        the full-run A is inside the part-fit's interval; then a summary: the interval's coverage and width, and
        which run the cut would have picked among them and its regret. Exits 2 when no run can be fitted."""
        from rlscale.fitting.backtest import backtest_runs, cut_pick, summarize

        check_fit_source(
            file, study, db, command="backtest", noise=noise, unbounded=unbounded, r0=r0, tags=(tag, compute_tag)
        )
        if not 0.0 < fraction < 1.0:
            raise UserError(f"expected a share of compute in (0, 1), got {fraction:g}", field="--fraction")
        if not 0.0 < level < 1.0:
            raise UserError(f"expected a level in (0, 1), got {level:g}", field="--level")
        if bootstrap > MAX_BOOTSTRAP:  # checked here: a range in the option would crowd its help's columns
            raise UserError(f"expected at most {MAX_BOOTSTRAP:,} resamples, got {bootstrap:,}", field="--bootstrap")
        if file is not None:
            from rlscale.db.importer import read_run_log

            records, source = read_run_log(file, tag=tag, compute_tag=compute_tag), str(file)
        else:
            from rlscale.db.store import Store
            from rlscale.fitting.stored import study_records

            records, source = study_records(Store(db, create=False), study), study
        results = backtest_runs(
            records,
            fraction=fraction,
            run_col="run",
            compute_col="compute",
            reward_col="reward",
            level=level,
            r0=r0,
            min_compute=min_compute,
            bootstrap=bootstrap,
            noise=noise,
            bounded=not unbounded,
        )
        if not any(r.fitted for r in results):
            from rlscale.cli.views import cli_reason

            reasons = "; ".join(f"{r.run}: {cli_reason(r.reason)}" for r in results[:5])
            reasons += "; ..." if len(results) > 5 else ""
            raise UserError(f"no run could be fitted on its first {fraction:.0%} of compute ({reasons})", file=source)
        summary = summarize(results, fraction)
        # the runs of one file or study are those a user chooses between: what the cut would have picked
        decision = cut_pick(results, fraction)
        if json_out:
            print_json(
                {
                    "source": source,
                    "fraction": fraction,
                    "compute_unit": records.attrs.get("compute_unit"),
                    "runs": [r.to_dict() for r in results],
                    "summary": summary.to_dict(),
                    "decision": None if decision is None else decision.to_dict(),
                }
            )
            return
        show(results, summary, title=f"{source}: fit on the first {fraction:.0%} of compute, extrapolated to the end")
        if decision is not None:
            from rlscale.views.tables import cut_pick_lines

            for line in cut_pick_lines(decision):
                bullet(line)


def show(results, summary, *, title: str) -> None:
    """The backtest table (80 columns hold it; --json has every column), the reasons for runs not fitted under it,
    then the summary as bullets."""
    from rlscale.views.tables import backtest_summary_lines

    backtest_table = table(
        safe(title),
        ("run", "pred. [PI]", "obs.", "err", "carry", "A in", "fit"),
        caption=f"pred. [PI]: the part-fit's reward at the run's end, {summary.level:.0%} prediction "
        "interval; obs.: mean over the last 10% of compute; err: pred. - obs.; carry: the error of "
        "carrying the part's last reward forward; A in: the full run's A inside the part-fit's 95% "
        "interval; fit: the part-fit's A identified (every column: --json)",
        right=("pred. [PI]", "obs.", "err", "carry"),
        wrap=("run",),
        fold=True,
    )
    notes = []
    yes_no = {True: "yes", False: "no", None: "-"}
    for r in results:
        if r.fitted:
            fit = "yes" if r.identified else "no"
        else:
            notes.append(f"({len(notes) + 1}) {r.run}: not fitted: {r.reason}")
            fit = f"none ({len(notes)})"
        backtest_table.add_row(
            safe(r.run),
            f"{_f(r.predicted)} [{_f(r.pi_lo)}, {_f(r.pi_hi)}]",
            _f(r.observed),
            _f(r.error, "{:+.3f}"),
            _f(r.carry_forward_error, "{:+.3f}"),
            yes_no[r.A_inside],
            fit,
            style=None if r.fitted else "dim",
        )
    console.print(backtest_table)
    for note in notes:
        say(note, rest="    ")
    for line in backtest_summary_lines(summary):
        bullet(line)
