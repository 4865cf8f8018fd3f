"""`rlscale studies`: what the store holds, one line per study."""

import typer

from rlscale.cli.console import console, print_json, safe, table
from rlscale.cli.options import DbUrl


def register(app: typer.Typer) -> None:
    @app.command("studies")
    def studies(
        db: DbUrl = None,
        json_out: bool = typer.Option(False, "--json", help="print the list as JSON"),
    ) -> None:
        """List the studies in the store with their runs (by status), records and fits."""
        from rlscale.db.models import RUN_STATUSES
        from rlscale.db.store import Store

        store = Store(db, create=False)
        rows = store.study_counts()
        if json_out:
            print_json(rows)
            return
        listing = table(
            f"studies in {safe(store.url_for_display)}",
            ("study", "runs", "by status", "records", "fits"),
            right=("runs", "records", "fits"),
            fold=True,
        )
        for row in rows:
            # the statuses a study's runs are in, in lifecycle order, instead of a column each (80 columns)
            statuses = ", ".join(f"{row[status]} {status}" for status in RUN_STATUSES if row[status]) or "-"
            listing.add_row(safe(row["study"]), str(row["runs"]), statuses, str(row["records"]), str(row["fits"]))
        console.print(listing if rows else f"no studies in {safe(store.url_for_display)}")
