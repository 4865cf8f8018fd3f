"""`rlscale import FILE --study NAME`: load run logs into the store: CSV/JSONL tracker exports, a directory of
TensorBoard event files (one run per subdirectory) or verl's file-logger JSONL."""

from pathlib import Path

import typer

from rlscale.cli.options import DbUrl


def register(app: typer.Typer) -> None:
    @app.command("import")
    def import_(
        file: Path = typer.Argument(
            ...,
            help="run log: .csv or .jsonl with run, compute (or gpu_hours), reward[, step, rollouts, tokens]; "
            "a TensorBoard directory; or a verl file-logger .jsonl",
        ),
        study: str = typer.Option(..., "--study", help="study to add the runs to (created if new)"),
        db: DbUrl = None,
        json_out: bool = typer.Option(False, "--json", help="print the summary as JSON"),
        tag: str = typer.Option(
            None,
            "--tag",
            help="TensorBoard/verl logs: the reward scalar (default: verl's `val-core/<source>/reward/mean@k`)",
        ),
        compute_tag: str = typer.Option(
            None,
            "--compute-tag",
            help="TensorBoard/verl logs: a scalar of cumulative compute "
            "(default: GPU-hours from verl's perf/total_num_tokens / perf/throughput, else the step)",
        ),
    ) -> None:
        """Import run logs into a study; steps already stored are skipped, so importing twice adds nothing."""
        from dataclasses import asdict

        from rlscale.cli.console import print_json, say
        from rlscale.db.importer import import_run_log, read_run_log
        from rlscale.db.store import Store

        rows = read_run_log(
            file, tag=tag, compute_tag=compute_tag
        )  # the whole file is checked before the store is opened (or created)
        store = Store(db)
        summary = import_run_log(store, file, study, rows)
        if json_out:
            print_json({**asdict(summary), "db": store.url_for_display, "compute_unit": rows.attrs.get("compute_unit")})
            return
        say(
            f"{summary.file} -> study {summary.study} in {store.url_for_display}: {summary.runs} runs "
            f"({summary.runs_created} new), {summary.records_added} records added, {summary.records_skipped} "
            "already stored"
        )
        if rows.attrs.get("compute_unit"):
            from rlscale.db.logs import compute_note

            say(f"compute: {compute_note(rows.attrs['compute_unit'])}")
