"""The `rlscale` command: each rlscale/cli/commands/ module registers its own; user errors print one line, exit 2."""

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
    """Entry point: usage errors and UserError exit 2; warnings show after a result, dropped on a UserError."""
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
