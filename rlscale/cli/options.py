"""Options several commands share, each defined once (typer's Annotated form: `db: DbUrl = None`)."""

from typing import Annotated

import typer

DbUrl = Annotated[str | None, typer.Option(
    "--db", help="SQLAlchemy URL of the store (default: RLSCALE_DB or sqlite:///rlscale.db)")]
