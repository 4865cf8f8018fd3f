"""`rlscale sweep STUDY.yaml`: run every point of a study on Ray, resumable; then report and recommend."""

from pathlib import Path

import typer

from rlscale.cli.options import DbUrl


def register(app: typer.Typer) -> None:
    @app.command("sweep")
    def sweep(
        study_file: Path = typer.Argument(..., help="study YAML (see studies/)"),
        db: DbUrl = None,
        ray_address: str = typer.Option(None, "--ray-address", help="join an existing Ray cluster (default: start a local one)"),
        max_retries: int = typer.Option(2, "--max-retries", min=0, help="retries of a crashing job before it is marked failed"),
        out: Path = typer.Option(None, "--out", help="directory for the study's report (default: reports/STUDY)"),
        json_out: bool = typer.Option(False, "--json", help="print the summary as JSON"),
        shared_dir: Path = typer.Option(None, "--shared-dir", help=(
            "engine verl: a directory the driver and every Ray node see (data, checkpoints, file-logger logs); "
            "default RLSCALE_SHARED_DIR or ~/.cache/rlscale/verl")),
        dry_run: bool = typer.Option(False, "--dry-run", help=(
            "print what each planned run would run (verl: entrypoint, overrides, data paths; builtin: the recipe) "
            "and submit nothing")),
    ) -> None:
        """Run a study's planned runs as RL jobs on Ray, resumably; then its report and recommendation.

        Finished runs are skipped and interrupted ones resume. At the end: the study's report and, for a study
        over rollouts, the recommended allocation of the compute it spent."""
        from rlscale.db.store import Store
        from rlscale.planner.study import load_study
        from rlscale.cli.console import console, print_json, safe
        from rlscale.cli.views import SweepView
        from rlscale.runner.sweep.driver import SweepDriver

        study = load_study(study_file)
        if dry_run:
            _print_dry_run(study, ray_address, shared_dir, json_out)
            return
        store = Store(db)
        view = SweepView(study.name, enabled=not json_out)
        options = {"verl": {"shared_dir": shared_dir}} if shared_dir else None
        driver = SweepDriver(study, store, ray_address=ray_address, max_retries=max_retries, on_update=view.update,
                             engine_options=options)
        runs = driver.plan()
        with view:
            if study.method == "bayes":
                from rlscale.runner.sweep.bayes import run_bayes

                summary = run_bayes(driver)
            else:
                summary = driver.run()
        records = store.records_frame(study.name)
        report = _report(store, study.name, records, out or Path("reports") / study.name)
        spent = float(records.groupby("run_id")["gpu_hours"].max().sum()) if len(records) else 0.0  # as `status` reads it
        recommendation, refusal = _recommend(store, study, spent)
        payload = {
            "study": study.name, "db": store.url_for_display, "runs": len(driver.runs or runs),
            "done": summary.count("done"), "failed": summary.count("failed"), "stopped": summary.count("stopped"),
            "gpu_hours": spent,
            "planned_gpu_hours": sum(run.planned_gpu_hours for run in driver.runs),
            "wall_seconds": round(summary.wall_seconds, 2), "busy_seconds": round(summary.busy_seconds, 2),
            "timings": {k: round(v, 2) for k, v in summary.timings.items()},
            "report": report.to_dict() if report else None,
            "recommendation": recommendation.to_dict() if recommendation else None,
            "no_recommendation": refusal,
        }
        if json_out:
            print_json(payload)
        else:
            if report is not None:
                from rlscale.cli.commands.report import show

                show(report)
            if recommendation is not None:
                from rlscale.cli.commands.recommend import show as show_recommendation

                show_recommendation(recommendation, study.name)
            elif refusal:
                console.print(f"not yet: {safe(refusal)}", highlight=False, soft_wrap=True)
            planned = payload["planned_gpu_hours"]
            share = f" ({spent / planned:.0%})" if planned > 0 else ""
            console.print(
                f"{payload['done']} done, {payload['stopped']} stopped early, {payload['failed']} failed "
                f"of {payload['runs']} runs in {summary.wall_seconds:.0f} s; {spent:.4g} of {planned:.4g} planned "
                f"GPU-hours spent{share}; store: {safe(store.url_for_display)}",
                highlight=False, soft_wrap=True)
            for line in _closing_lines(study.name, f" --db {db}" if db else "", recommendation, refusal, spent):
                console.print(safe(line), highlight=False, soft_wrap=True)
        if payload["failed"]:
            raise typer.Exit(1)


def _closing_lines(study: str, db: str, recommendation, refusal, spent: float) -> list[str]:
    """What the sweep decided and what to run next (db: the --db flag to repeat, or "")."""
    if recommendation is not None:
        how = ("from the optimal-n law" if recommendation.law_identified
               else "from the best fitted runs (the optimal-n law is not identified; see the note above)")
        return [f"decided: B_p {recommendation.prompts_per_batch}, n {recommendation.rollouts}, M {recommendation.steps} "
                f"steps for {recommendation.budget:.4g} GPU-hours, {how}; predicted reward "
                f"{recommendation.predicted_reward:.3f} [{recommendation.predicted_interval[0]:.3f}, "
                f"{recommendation.predicted_interval[1]:.3f}]",
                f"next: rlscale export --format verl --study {study} --budget {spent:.4g}{db}   "
                f"(or: rlscale recommend --study {study} --budget B{db})"]
    if refusal:
        return ["decided: nothing yet (see 'not yet' above)",
                f"next: rlscale report {study}{db} for the fits; more compute per run, or more runs, then sweep again"]
    return [f"next: rlscale export --format verl --study {study}{db}   (the best run's recipe; the fits are above)"]


def _print_dry_run(study, ray_address: str | None, shared_dir: Path | None, json_out: bool) -> None:
    import shlex

    from rlscale.cli.console import console, print_json, safe
    from rlscale.runner.sweep.dry_run import RUN_KEY, dry_run

    points = dry_run(study, ray_address=ray_address, shared_dir=shared_dir)
    if json_out:
        print_json(points)
        return
    for point in points:
        console.print(f"[bold]{safe(point['run'])}[/bold] (seed {point['seed']}, engine {point['engine']})",
                      highlight=False, soft_wrap=True)
        if point["engine"] != "verl":
            for key, value in point["recipe"].items():
                console.print(f"  {key}: {safe(value)}", highlight=False, soft_wrap=True)
            continue
        lines = [f"job {point['submission_id']} at {point['ray_address']}, {point['gpus']} GPUs",
                 f"train data: {point['train_file']}", f"validation data: {point['val_file']}",
                 f"file logger: {point['log_file']}",
                 *[f"env {key}={value}" for key, value in point["env_vars"].items()],
                 f"entrypoint: {point['entrypoint']} with the overrides (shell-quoted, one a line):"]
        for line in lines:
            console.print(f"  {safe(line)}", highlight=False, soft_wrap=True)
        for override in point["overrides"]:
            console.print(f"    {safe(shlex.quote(override))}", highlight=False, soft_wrap=True)
    console.print(f"{len(points)} runs; nothing submitted. {RUN_KEY}: the run's key, given when the sweep first "
                  "stores the run.", highlight=False, soft_wrap=True)


def _report(store, study: str, records, out: Path):
    """The study's report (fits, plots, report.html) once any run has an evaluation in `records`; else None."""
    from rlscale.fitting.report import study_report

    if not records["val_reward"].notna().any():
        return None
    return study_report(store, study, out)


def _recommend(store, study, budget_gpu_hours: float):
    """(recommendation, None) for the compute this sweep spent, or (None, why not) for a study over rollouts."""
    if "rollouts" not in study.parameters or not budget_gpu_hours > 0:
        return None, None
    from rlscale.fitting.recommend import Refusal, recommend_study

    try:
        recommendation, _study = recommend_study(store, study.name, budget_gpu_hours)
    except Refusal as refusal:
        return None, str(refusal)
    return recommendation, None
