import typer

import rlscale


def register(app: typer.Typer) -> None:
    @app.command("version")
    def version() -> None:
        """Print rlscale's version."""
        typer.echo(rlscale.__version__)
