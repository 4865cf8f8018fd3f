"""Terminal output (rich; stdout for --json); text from data goes through `safe`: markup, control characters escaped."""

import json
import re
import sys
from collections.abc import Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape

from rlscale.base.numbers import json_safe

if TYPE_CHECKING:
    from rich.table import Table

console = Console()
err_console = Console(stderr=True)

# C0 controls except tab and newline, DEL, C1 controls, and the Unicode line/paragraph/bidi controls
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def visible(value: Any) -> str:
    """`str(value)` with control characters written as escapes (\\x1b, \\u202e); markup untouched."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(value))


def safe(value: Any) -> str:
    """`str(value)` ready to print with Rich: control characters made visible, markup escaped."""
    return escape(visible(value))


def wrapped(value: Any, *, first: str = "", rest: str | None = None, width: int | None = None) -> str:
    """`value` visible, wrapped to the console width in cells (CJK: two); `first` starts line 1, `rest` the others."""
    rest = " " * len(first) if rest is None else rest
    width = width or console.width
    lines, line, empty = [], first, True
    for word in visible(value).split():
        if empty:
            line, empty = line + word, False
        elif cell_len(line) + 1 + cell_len(word) > width:
            lines.append(line)
            line = rest + word
        else:
            line += " " + word
    return "\n".join([*lines, line.rstrip()])


def say(value: Any, *, first: str = "", rest: str | None = None) -> None:
    """Print `value` as plain text (markup inert) wrapped to the terminal, continuation lines indented."""
    console.print(wrapped(value, first=first, rest=rest), markup=False, highlight=False, soft_wrap=True)


def bullet(value: Any) -> None:
    """Print a note as a short bullet line: "- text", wrapped with a hanging indent."""
    say(value, first="- ")


def table(
    title: str,
    columns: Sequence[str],
    rows: Iterable[Iterable[str]] = (),
    *,
    caption: str | None = None,
    right: Collection[str] | bool = (),
    wrap: Collection[str] | bool = True,
    fold: Collection[str] | bool = (),
    **options: Any,
) -> "Table":
    """A left-titled Table; `right`, `wrap` (else whole), `fold` (else cut with "…"): column names, or True: all."""
    from rich.table import Table

    def has(names: Collection[str] | bool, column: str) -> bool:
        return names if isinstance(names, bool) else column in names

    options = {"title_justify": "left", "caption_justify": "left", "caption_style": "dim", **options}
    result = Table(title=title, caption=caption, **options)
    for column in columns:
        result.add_column(
            column,
            justify="right" if has(right, column) else "left",
            no_wrap=not has(wrap, column),
            overflow="fold" if has(fold, column) else "ellipsis",
        )
    for row in rows:
        result.add_row(*row)
    return result


JSON_WRITTEN = [False]  # whether this command printed JSON: its error then adds none (rlscale.cli.main)


def print_json(payload: Any) -> None:
    """`payload` as JSON on stdout (no markup, for scripts), NaN and inf as null, with views.wording's words."""
    from rlscale.views.wording import with_words

    JSON_WRITTEN[0] = True
    sys.stdout.write(json.dumps(with_words(json_safe(payload)), indent=2, default=_jsonable, allow_nan=False) + "\n")
    sys.stdout.flush()


def _jsonable(value: Any) -> Any:
    return str(value)
