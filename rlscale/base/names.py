"""User-given names and expansion limits; NAME_RULE names may become paths, RUN_NAME_RULE ones are text, never paths."""

import math
import re
import sys
import unicodedata
from pathlib import Path

from rlscale.base.errors import UserError

MAX_NAME_LENGTH = 100
NAME_RULE = f"letters, digits, '.', '_' or '-', not starting with '.', at most {MAX_NAME_LENGTH} characters"
NAME_PATTERN = rf"^[A-Za-z0-9_-][A-Za-z0-9._-]{{0,{MAX_NAME_LENGTH - 1}}}$"
_NAME = re.compile(NAME_PATTERN)

# What one study or plan may expand to; above these the work (and memory) is refused before it starts.
MAX_SEEDS = 1_000
MAX_RUNS = 10_000  # a study's points x seeds (or bayes trials x seeds)
MAX_GRID_POINTS = 10_000  # `rlscale plan`: B_p values x n values
MAX_STEPS = 10**9  # steps of one run
MAX_INT64 = 2**63 - 1  # the store's integer columns are 64-bit
MAX_BUDGET = 1e15  # a compute budget in any unit (GPU-hours, rollouts, tokens)


MAX_RUN_NAME_LENGTH = 200  # the store's run name column
RUN_NAME_RULE = f"printable text (no control characters), not blank, at most {MAX_RUN_NAME_LENGTH} characters"
# control, format (bidi overrides, zero-width), surrogate, private-use, unassigned, line and paragraph separators
_UNPRINTABLE = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}


def run_name_problem(value: object) -> str | None:
    """Why `value` cannot be an imported run's name (RUN_NAME_RULE), in words; None if it can."""
    if not isinstance(value, str) or not value.strip():
        return f"expected a run name of {RUN_NAME_RULE}, got {value!r}"
    if len(value) > MAX_RUN_NAME_LENGTH:
        return f"expected a run name of at most {MAX_RUN_NAME_LENGTH} characters, got {len(value)}: {value[:40]!r}..."
    for i, char in enumerate(value):
        if unicodedata.category(char) in _UNPRINTABLE:
            return (
                f"expected a run name of printable text, got {_cut(value)} "
                f"(character {i + 1}, U+{ord(char):04X}, is not printable)"
            )
    return None


def _cut(text: str) -> str:
    return repr(text) if len(text) <= 60 else f"{text[:60]!r}..."


def check_budget(value: float, *, field: str = "--budget") -> float:
    """`value` if it is a finite compute budget in (0, MAX_BUDGET]; else a UserError naming `field`."""
    if not (math.isfinite(value) and 0 < value <= MAX_BUDGET):
        raise UserError(f"expected a positive finite budget of at most {MAX_BUDGET:g}, got {value:g}", field=field)
    return value


def check_steps(steps: int, *, field: str = "--budget") -> int:
    """`steps` if a run can be given that many (at most MAX_STEPS); else a UserError naming `field`."""
    if steps > MAX_STEPS:
        raise UserError(
            f"the budget gives a run {steps:.3g} steps; expected at most {MAX_STEPS:,} (is the unit right?)",
            field=field,
        )
    return steps


def check_name(value: object, *, field: str, file: str | None = None, what: str = "name") -> str:
    """`value` if it follows NAME_RULE; else a UserError naming the file and field."""
    if not isinstance(value, str) or not _NAME.match(value):
        shown = (
            repr(value)
            if not isinstance(value, str) or len(value) <= 40
            else f"{value[:40]!r}... ({len(value)} characters)"
        )
        raise UserError(f"expected a {what} of {NAME_RULE}, got {shown}", file=file, field=field)
    return value


def is_name(value: object) -> bool:
    return isinstance(value, str) and bool(_NAME.match(value))


def child_path(directory: str | Path, name: str, *, field: str) -> Path:
    """`directory / name`, refused unless `name` follows NAME_RULE and the result stays inside `directory`."""
    check_name(name, field=field)
    base = Path(directory).resolve()
    path = (base / name).resolve()
    if path.parent != base:
        raise UserError(f"{name!r} would leave {directory}", field=field)
    return Path(directory) / name


# A custom verifier is named, never evaluated: a dotted module path, a colon, a function name.
VERIFIER_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
VERIFIER_RULE = (
    "'package.module:function' from the project's tasks (rlscale.runner.rl.tasks) or your own package, "
    "not the standard library or builtins"
)
_PROJECT_TASKS = "rlscale.runner.rl.tasks"


def verifier_problem(spec: object) -> str | None:
    """Why `spec` cannot be a verifier, or None: it runs on every rollout (stdlib, builtins and rlscale are refused)."""
    if not isinstance(spec, str) or not re.match(VERIFIER_PATTERN, spec):
        return f"expected {VERIFIER_RULE}, got {spec!r}"
    module = spec.split(":")[0]
    top = module.split(".")[0]
    if top in sys.stdlib_module_names or top in sys.builtin_module_names or top == "builtins":
        return f"{module!r} is part of Python's standard library; expected {VERIFIER_RULE}"
    if top == "rlscale" and module != _PROJECT_TASKS:
        return f"{module!r} is not a task module; expected {VERIFIER_RULE}"
    return None
