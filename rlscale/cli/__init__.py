"""The `rlscale` command: each rlscale/cli/commands/ module registers its own; user errors print one line, exit 2."""

import errno
import importlib
import pkgutil
import signal
import sys
import threading
import warnings

import typer

from rlscale.base.errors import Terminated, UserError
from rlscale.cli import commands
from rlscale.cli.console import JSON_WRITTEN, err_console, print_json, safe

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


# a path given that the system refuses (name too long, a directory where a file goes, no permission, disk full)
PATH_ERRORS = {errno.ENAMETOOLONG, errno.EISDIR, errno.ENOTDIR, errno.ELOOP, errno.EACCES, errno.EROFS, errno.ENOSPC}


def main() -> None:
    """Entry point: usage errors and UserError print one line and exit 2; warnings show after a result, dropped on a
    UserError."""
    held: list = []
    error, code = None, 0
    JSON_WRITTEN[0] = False
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if main_thread else None
    try:
        with warnings.catch_warnings(record=True) as held:
            try:
                code = app(
                    prog_name="rlscale", standalone_mode=False
                )  # click's usage errors come here, to be said in one line
            except UserError as err:
                error = err
            except typer.Abort as abort:  # Ctrl-C (click's Abort), or SIGTERM
                code = 143 if isinstance(abort.__cause__ or abort.__context__, Terminated) else 130
            except OSError as err:
                if err.errno not in PATH_ERRORS:  # a path the user gave that the system refuses: said in one line
                    raise
                shown = None if err.filename is None else str(err.filename)[-120:]  # its end names the part refused
                error = UserError(err.strerror or str(err), file=shown)
            except Exception as err:
                if not (hasattr(err, "format_message") and hasattr(err, "exit_code")):  # not click's
                    raise
                ctx, message, code = getattr(err, "ctx", None), err.format_message().strip(), err.exit_code
                if message:  # none: the help was shown (a command with no arguments)
                    where = f" (see {ctx.command_path} --help)" if ctx is not None else ""
                    error = UserError(f"{message}{where}")
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
        if error is None:  # a result (or a crash): the warnings are part of the story
            for w in held:
                warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    if error is not None:
        err_console.print(f"[bold red]error:[/] {safe(error)}", highlight=False, soft_wrap=True)
        options = sys.argv[1 : sys.argv.index("--")] if "--" in sys.argv else sys.argv[1:]
        if (code or 2) == 2 and "--json" in options and not JSON_WRITTEN[0]:  # a script reads why on stdout too
            print_json({"error": str(error), "file": error.file, "field": error.field, "exit_code": code or 2})
        sys.exit(code or 2)
    if isinstance(code, int) and code:
        sys.exit(code)


def _terminate(signum, frame) -> None:
    """SIGTERM: end as Ctrl-C does (a sweep pauses its runs at their checkpoints); a second one is not heard."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated
