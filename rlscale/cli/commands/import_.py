"""`rlscale import FILE --study NAME`: load CSV/JSONL run logs (tracker exports) into the store."""

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("import")
    def import_(
        file: Path = typer.Argument(..., help="run log: .csv or .jsonl with run, compute (or gpu_hours), reward[, step, rollouts, tokens]"),
        study: str = typer.Option(..., "--study", help="study to add the runs to (created if new)"),
        db: str = typer.Option(None, "--db", help="SQLAlchemy URL (default: RLSCALE_DB or sqlite:///rlscale.db)"),
        json_out: bool = typer.Option(False, "--json", help="print the summary as JSON"),
    ) -> None:
        """Import run logs into a study; steps already stored are skipped, so importing twice adds nothing."""
        from dataclasses import asdict

        from rlscale.db.importer import import_run_log, read_run_log
        from rlscale.db.store import Store
        from rlscale.cli.console import console, print_json

        rows = read_run_log(file)  # the whole file is checked before the store is opened (or created)
        store = Store(db)
        summary = import_run_log(store, file, study, rows)
        if json_out:
            print_json({**asdict(summary), "db": store.url_for_display})
            return
        console.print(
            f"{summary.file} -> study [bold]{summary.study}[/] in {store.url_for_display}: "
            f"{summary.runs} runs ({summary.runs_created} new), "
            f"{summary.records_added} records added, {summary.records_skipped} already stored",
            highlight=False,
            soft_wrap=True,
        )
