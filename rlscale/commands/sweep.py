"""`rlscale sweep STUDY.yaml`: run every point of a study on Ray, resumable; then fit and summarise."""

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("sweep")
    def sweep(
        study_file: Path = typer.Argument(..., help="study YAML (see studies/)"),
        db: str = typer.Option(None, "--db", help="SQLAlchemy URL (default: RLSCALE_DB or sqlite:///rlscale.db)"),
        ray_address: str = typer.Option(None, "--ray-address", help="join an existing Ray cluster (default: start a local one)"),
        max_retries: int = typer.Option(2, "--max-retries", min=0, help="retries of a crashing job before it is marked failed"),
        out: Path = typer.Option(Path("reports"), "--out", help="directory for the study's plot"),
        json_out: bool = typer.Option(False, "--json", help="print the summary as JSON"),
    ) -> None:
        """Run a study's planned runs as RL jobs (finished runs are skipped; interrupted ones resume)."""
        from db.store import Store
        from planner.study import load_study
        from rlscale.console import console, print_json
        from rlscale.commands.fit import fits_json
        from rlscale.views import SweepView, fits_table

        study = load_study(study_file)
        store = Store(db)
        from runner.sweep import SweepDriver

        view = SweepView(study.name, enabled=not json_out)
        driver = SweepDriver(study, store, ray_address=ray_address, max_retries=max_retries, on_update=view.update)
        runs = driver.plan()
        if study.method == "bayes":
            from runner.bayes import run_bayes

            with view:
                summary = run_bayes(driver)
        else:
            with view:
                summary = driver.run()
        records, fits = _fits(store, study.name)
        plot = _plot(records, fits, study.name, out) if len(fits) else None
        payload = {
            "study": study.name,
            "db": store.url_for_display,
            "runs": len(runs),
            "done": summary.count("done"),
            "failed": summary.count("failed"),
            "stopped": summary.count("stopped"),
            "wall_seconds": round(summary.wall_seconds, 2),
            "plot": str(plot) if plot else None,
            "fits": fits_json(fits),
        }
        if json_out:
            print_json(payload)
        else:
            console.print(fits_table(fits, title=f"{study.name}: sigmoid fits"))
            console.print(
                f"{payload['done']} done, {payload['stopped']} stopped early, {payload['failed']} failed "
                f"of {payload['runs']} runs in {summary.wall_seconds:.0f} s; store: {store.url_for_display}"
            )
            if plot:
                console.print(f"plot: {plot}")
        if payload["failed"]:
            raise typer.Exit(1)


def _fits(store, study: str):
    """(records, fits) of the study's runs so far; empty frames when nothing was evaluated yet."""
    import pandas as pd

    from fitting.stored import fit_study

    if not store.records_frame(study)["val_reward"].notna().any():
        return pd.DataFrame(), pd.DataFrame()
    return fit_study(store, study)


def _plot(records, fits, study: str, out: Path) -> Path:
    from fitting.plots import plot_study

    out.mkdir(parents=True, exist_ok=True)
    return plot_study(records, fits, out / f"{study}.png", run_col="run", compute_col="compute",
                      reward_col="reward", title=f"{study}: validation reward vs device-hours")
