"""Errors a user can cause. The CLI prints them as one line and exits 2."""


class UserError(Exception):
    """Bad input; `str(err)` is the CLI's line, e.g. `studies/x.yaml: recipe.loss: expected one of ..., got 'ppo'`."""

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None):
        self.file = file
        self.field = field
        self.detail = message
        where = ": ".join(part for part in (file, field) if part)
        super().__init__(f"{where}: {message}" if where else message)


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's preemption, `kill`, `docker stop`): the CLI ends as Ctrl-C ends it, exit 143."""


def first_line(err: BaseException | str) -> str:
    """The first non-blank line of an error's message (or of a text); for a blank one, the error's type name (or "")."""
    text = str(err).strip()
    if text:
        return text.splitlines()[0]
    return "" if isinstance(err, str) else type(err).__name__


def made_dir(directory, *, field: str | None = None):
    """`directory` as a Path, made with its parents; UserError (exit 2) where it cannot be: a file in the way, no
    permission, a read-only or full disk."""
    from pathlib import Path

    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"cannot write into {directory}: {err.strerror or err}", field=field) from None
    return directory
