"""`rlscale sweep STUDY.yaml`: run every point of a study on Ray, resumable; then report and recommend."""

import shlex
from pathlib import Path

import typer

from rlscale.base.errors import Terminated, UserError
from rlscale.cli.console import err_console, print_json
from rlscale.cli.options import DbUrl, check_out_dir

MAX_EXTEND = 1000.0  # a factor past it is a typo, not a plan


def register(app: typer.Typer) -> None:
    @app.command("sweep")
    def sweep(
        study_file: Path = typer.Argument(..., help="study YAML (see studies/)"),
        db: DbUrl = None,
        ray_address: str = typer.Option(
            None, "--ray-address", help=("join an existing Ray cluster (default: start a local one)")
        ),
        max_retries: int = typer.Option(
            2, "--max-retries", min=0, help=("retries of a crashing job before it is marked failed")
        ),
        out: Path = typer.Option(None, "--out", help="directory for the study's report (default: reports/STUDY)"),
        json_out: bool = typer.Option(False, "--json", help="print the summary as JSON"),
        shared_dir: Path = typer.Option(
            None,
            "--shared-dir",
            help=(
                "engines verl, trl: a directory the driver and every Ray node see (data, checkpoints, logs); "
                "default RLSCALE_SHARED_DIR or ~/.cache/rlscale/ENGINE"
            ),
        ),
        dry_run: bool = typer.Option(
            False,
            "--dry-run",
            help=(
                "print what each planned run would run (verl: entrypoint, overrides, data paths; builtin: the recipe) "
                "and submit nothing"
            ),
        ),
        max_concurrent: int = typer.Option(
            None,
            "--max-concurrent",
            min=1,
            help=(
                "runs in flight at once (default: the study's max_concurrent, else as many as the cluster's free "
                "devices admit, each job whole)"
            ),
        ),
        extend: float = typer.Option(
            None,
            "--extend",
            help=(
                "multiply each run's planned compute by this: finished runs resume from their last checkpoints to the "
                "larger compute, nothing is trained twice (the end of a sweep says when and by how much)"
            ),
        ),
    ) -> None:
        """Run a study's planned runs as RL jobs on Ray, resumably; then its report and recommendation.

        Finished runs are skipped and interrupted ones resume. At the end: the study's report and, for a study
        over rollouts, the recommended allocation of the compute it spent."""
        from rlscale.cli.commands.report import REPORT_FILES
        from rlscale.cli.views import SweepView
        from rlscale.db.store import Store, check_store
        from rlscale.planner.study_file import load_study
        from rlscale.runner.sweep.driver import SweepDriver
        from rlscale.runner.tracking import check_tracking
        from rlscale.views.wording import refusal_text

        if extend is not None and not 1.0 <= extend <= MAX_EXTEND:  # NaN too
            raise UserError(f"expected a factor from 1 to {MAX_EXTEND:g}, got {extend:g}", field="--extend")
        study = load_study(study_file)
        if extend is not None:
            study = study.model_copy(update={"extend": extend})
        # what the sweep will write to and run on, checked before anything runs (the dry-run too): exit 2
        out = out or Path("reports") / study.name
        check_out_dir(out, REPORT_FILES)
        if shared_dir is not None:
            check_out_dir(shared_dir, "the runs' data, checkpoints and logs", field="--shared-dir")
        check_store(db)
        # the tracker's library, and its server unless a dry-run (which may be prepared away from it)
        check_tracking(study.tracking, reach=not dry_run)
        if dry_run:  # the cluster is not asked: a dry-run may be prepared away from it
            from rlscale.cli.dry_run import print_dry_run

            print_dry_run(study, ray_address, shared_dir, json_out, max_concurrent)
            return
        from rlscale.runner.sweep.dry_run import check_cluster
        from rlscale.runner.sweep.dry_run import dry_run as check_jobs

        check_jobs(study, ray_address=ray_address, shared_dir=shared_dir)  # bad engine input: exit 2, nothing stored
        check_cluster(study, ray_address=ray_address)  # a named cluster that cannot be reached: the same
        store = Store(db)
        view = SweepView(study.name, enabled=not json_out)
        options = {"verl": {"shared_dir": shared_dir}, "trl": {"shared_dir": shared_dir}} if shared_dir else None
        driver = SweepDriver(
            study,
            store,
            ray_address=ray_address,
            max_retries=max_retries,
            on_update=lambda runs: view.update(runs, driver.cluster_status or driver.store_note),
            engine_options=options,
            max_concurrent=max_concurrent,
        )
        runs = driver.plan()
        try:
            with view:
                summary = driver.run()
        except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM (Terminated)
            how, code = ("terminated", 143) if isinstance(stop, Terminated) else ("interrupted", 130)
            err_console.print(
                f"{how}: runs are paused at their last checkpoint; run it again to resume",
                markup=False,
                highlight=False,
            )
            raise SystemExit(code) from None
        records = store.records_frame(study.name)
        report = _report(store, study, records, out, study_file, db)
        spent = float(records.groupby("run_id")["gpu_hours"].max().sum()) if len(records) else 0.0  # as `status` reads
        decision = report.decision if report is not None else None  # the report's decision: one decision, one text
        commands = report.commands if report is not None else {}
        recommendation = decision.recommendation if decision is not None else None
        refusal = refusal_text(decision.refusal) if decision is not None and decision.refusal else None
        allocation = decision.next_allocation if decision is not None else None
        payload = {
            "study": study.name,
            "db": store.url_for_display,
            "runs": len(driver.runs or runs),
            "done": summary.count("done"),
            "failed": summary.count("failed"),
            "stopped": summary.count("stopped"),
            "gpu_hours": spent,
            "budget": decision.budget if decision is not None else 0.0,
            "planned_gpu_hours": sum(run.planned_gpu_hours for run in driver.runs),
            "wall_seconds": round(summary.wall_seconds, 2),
            "busy_seconds": round(summary.busy_seconds, 2),
            "timings": {k: round(v, 2) for k, v in summary.timings.items()},
            "report": report.to_dict() if report else None,
            "recommendation": recommendation.to_dict() if recommendation else None,
            "no_recommendation": refusal,
            "next_allocation": {**allocation.to_dict(), "command": commands["extend"]} if allocation else None,
            "decision": {**decision.to_dict(), "commands": commands} if decision is not None else None,
        }
        if json_out:
            print_json(payload)
        else:
            from rlscale.cli.commands.report import show, show_decision

            if report is not None:
                show(report, db)
            # a command stays on one line, to copy; the rest wraps with a hanging indent
            show_decision(_closing_lines(study, db, payload, decision, commands))
        if payload["failed"]:
            raise typer.Exit(1)


def _closing_lines(study, db: str | None, payload: dict, decision, commands: dict) -> list[str]:
    """What the sweep spent, the evidence command, then the decision (once, last) and the one command to run next;
    plain text, each line wrapped to the terminal by the caller except commands (indented lines starting
    'rlscale')."""
    from rlscale.fitting.curves import unit_label
    from rlscale.views.wording import db_flag, decision_lines

    planned, spent = payload["planned_gpu_hours"], payload["gpu_hours"]
    share = f" ({spent / planned:.0%})" if planned > 0 else ""
    lines = [
        f"{payload['done']} done, {payload['stopped']} stopped early, {payload['failed']} failed of "
        f"{payload['runs']} runs in {payload['wall_seconds']:.0f} s",
        f"spent {spent:.4g} of {planned:.4g} planned {unit_label('gpu_hours')}{share}; store: {payload['db']}",
    ]
    if decision is None:
        return lines + ["not yet: no run has an evaluation"]
    if commands.get("evidence"):
        lines += ["the evidence (runs at n, frontier):", f"  {commands['evidence']}"]
    lines += decision_lines(decision, commands)
    if decision.refusal and decision.next_allocation is None:
        flag = db_flag(db)
        lines += ["next: more runs (the fits are in the report):", f"  rlscale report {shlex.quote(study.name)}{flag}"]
    return lines


def _report(store, study, records, out: Path, study_file: Path, db: str | None):
    """The study's report (the decision, fits, plots, report.html) once any run has an evaluation in `records`; else
    None."""
    from rlscale.views.report import study_report

    if study.metric not in records.columns or not records[study.metric].notna().any():
        return None
    return study_report(store, study.name, out, study_file=study_file, db=db, extend=study.extend)
