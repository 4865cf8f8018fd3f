"""The `rlscale` command. Each module in rlscale/commands/ registers its own command(s);
this file only wires them up and turns user errors into one line and exit code 2."""

import importlib
import pkgutil
import sys
import warnings

import typer

from rlscale.base.errors import UserError
from rlscale.cli import commands
from rlscale.cli.console import err_console, safe

app = typer.Typer(
    name="rlscale",
    help="Scaling-law experiment orchestrator and sweep planner for RL on LLMs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # help paragraphs are Markdown: a docstring's line breaks are joined, so help wraps to the terminal's width
    rich_markup_mode="markdown",
)


@app.callback()
def _root() -> None:
    """Plan IsoCompute sweeps, run them on Ray, fit scaling curves, recommend allocations."""


for _info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
    importlib.import_module(f"{commands.__name__}.{_info.name}").register(app)


def main() -> None:
    """Entry point: usage errors exit 2 (click); UserError prints one line and exits 2. Warnings are held until the
    command ends: shown after a result, dropped before a one-line error so it is the only thing on stderr."""
    held: list = []
    error = None
    try:
        with warnings.catch_warnings(record=True) as held:
            try:
                app()
            except UserError as err:
                error = err
    finally:
        if error is None:  # a result (or a crash): the warnings are part of the story
            for w in held:
                warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    if error is not None:
        err_console.print(f"[bold red]error:[/] {safe(error)}", highlight=False, soft_wrap=True)
        sys.exit(2)
