"""Terminal output: one rich console for tables and progress, plain stdout for --json."""

import json
import sys
from typing import Any

from rich.console import Console

console = Console()
err_console = Console(stderr=True)


def print_json(payload: Any) -> None:
    """Write `payload` as JSON to stdout (no rich markup, so scripts can parse it)."""
    sys.stdout.write(json.dumps(payload, indent=2, default=_jsonable) + "\n")
    sys.stdout.flush()


def _jsonable(value: Any) -> Any:
    # numpy scalars and arrays, paths, datetimes
    if hasattr(value, "item") and getattr(value, "shape", None) == ():
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
