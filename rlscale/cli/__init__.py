"""The `rlscale` command. Each module in rlscale/commands/ registers its own command(s);
this file only wires them up and turns user errors into one line and exit code 2."""

import importlib
import pkgutil
import sys

import typer
from rich.markup import escape

from rlscale.cli import commands
from rlscale.cli.console import err_console
from rlscale.base.errors import UserError

app = typer.Typer(
    name="rlscale",
    help="Scaling-law experiment orchestrator and sweep planner for RL on LLMs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Plan IsoCompute sweeps, run them on Ray, fit scaling curves, recommend allocations."""


for _info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
    importlib.import_module(f"{commands.__name__}.{_info.name}").register(app)


def main() -> None:
    """Entry point. Usage errors exit 2 (click); UserError prints one line and exits 2."""
    try:
        app()
    except UserError as err:
        err_console.print(f"[bold red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
        sys.exit(2)
