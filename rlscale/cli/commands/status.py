"""`rlscale status STUDY`: a study's runs and their progress, read from the store (safe while a sweep writes)."""

import typer

from rlscale.cli.console import console, print_json
from rlscale.cli.options import DbUrl


def register(app: typer.Typer) -> None:
    @app.command("status")
    def status(
        study: str = typer.Argument(..., help="study name"),
        db: DbUrl = None,
        json_out: bool = typer.Option(False, "--json", help="print the runs as JSON"),
    ) -> None:
        """Show each run's status, step, last validation reward and compute spent."""
        from rlscale.cli.views import sweep_view
        from rlscale.db.importer import logged_unit
        from rlscale.db.store import Store
        from rlscale.planner.study_file import stored_study
        from rlscale.runner.sweep.state import planned_gpu_hours, run_states

        store = Store(db, create=False)
        spec = stored_study(store, study)
        runs = store.runs_frame(study)
        states = run_states(
            runs,
            store.records_frame(study),
            planned_gpu_hours(spec),
            extend=1.0 if spec is None else spec.extend,
        )
        unit = (logged_unit(runs["config"]) if spec is None else None) or "gpu_hours"  # an imported log's own axis
        swept = store.study_is_swept(study)  # False: runs marked running were left by a driver that ended
        if json_out:
            print_json([{**state.to_dict(), "compute_unit": unit, "sweep_running": swept} for state in states])
            return
        console.print(sweep_view(study, states, cluster_line(states, swept), unit=unit))


def cluster_line(states, swept: bool | None = None) -> str:
    """Runs in flight (with what they hold) and runs queued, as the store has them; with `swept` False, what the
    runs marked running are: left by a sweep that ended (kill -9, a lost node), resumed by the next."""
    running = [state for state in states if state.status == "running"]
    held = [state.note[3:] for state in running if state.note.startswith("on ")]
    queued = sum(state.status in ("pending", "paused") for state in states)
    if swept is False and running:
        from rlscale.views.wording import orphaned_runs

        return f"{orphaned_runs(len(running))}. {queued} queued"
    holding = f" (holding {', '.join(held)})" if held else ""
    return f"{len(running)} in flight{holding}, {queued} queued"
