"""`rlscale dashboard`: a live web page over the store (read-only), beside a running sweep."""

import os
from urllib.parse import quote

import typer

from rlscale.cli.console import console, say
from rlscale.cli.options import DbUrl


def register(app: typer.Typer) -> None:
    @app.command("dashboard")
    def dashboard(
        db: DbUrl = None,
        port: int = typer.Option(8765, "--port", min=0, max=65535, help="port to listen on"),
        host: str = typer.Option("127.0.0.1", "--host", help="address to listen on (beyond loopback: --token)"),
        token: str = typer.Option(
            None,
            "--token",
            envvar="RLSCALE_DASHBOARD_TOKEN",
            help="required to open any page; needed to listen beyond 127.0.0.1",
        ),
    ) -> None:
        """Serve the store's studies as live web pages: runs in flight and queued, each run's curve with its fit
        and band as records arrive, the frontier and the optimal-n law, the decision, and the runs stopped early.

        The store is opened read-only (the database refuses writes), so it is safe beside a running sweep, from
        this machine or another. Ctrl-C stops it.
        """
        from rlscale.base import settings
        from rlscale.dashboard.app import create_app
        from rlscale.dashboard.server import check_exposure, listen, serve
        from rlscale.db.engine import display_url, parse_url

        check_exposure(host, token)
        url = parse_url(settings.db_url(db))  # a malformed URL fails here, in one line
        shown = display_url(url)
        _check_store(db, url)
        sock = listen(host, port)
        port = sock.getsockname()[1]
        bare = host.strip("[]")
        address = f"http://{'[' + bare + ']' if ':' in bare else bare}:{port}/"
        say(f"dashboard over {shown} (read-only); Ctrl-C stops it:")
        # the address whole on a line of its own, to click or copy
        console.print(
            f"  {address}{'?token=' + quote(token, safe='') if token else ''}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        serve(create_app(db, token=token, db=shown if db else None), sock)


def _check_store(db: str | None, url) -> None:
    """UserError when the store cannot be read (no such database kind, not a database, in memory); a SQLite file a
    sweep has yet to create is waited for."""
    from rlscale.base.errors import UserError
    from rlscale.db.store import Store

    try:
        Store(db, read_only=True).close()
    except UserError:
        waited = url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:")
        if not (waited and not os.path.exists(url.database)):
            raise
