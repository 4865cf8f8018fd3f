"""Run logs (CSV, JSONL, tracker runs) -> validated rows -> the store.
`read_run_log` is the one parser `rlscale import` and `rlscale fit FILE.csv` share: a file that imports also fits."""

import csv
import io
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from rlscale.base.errors import UserError
from rlscale.base.names import MAX_INT64, run_name_problem
from rlscale.base.numbers import is_missing as _missing

if TYPE_CHECKING:
    from rlscale.db.store import Store

EXTENSIONS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
COMPUTE_COLUMNS = ("compute", "gpu_hours")  # either names the compute axis; gpu_hours is what sweeps record
HEALTH_METRICS = ("train_reward", "entropy", "kl", "grad_norm", "truncation_rate", "clip_fraction", "staleness")
WANDB_NAMES = {"name": "run", "_step": "step"}  # a W&B export's run and step columns, where the file has no own
EXPECTED = "columns run (optional), compute or gpu_hours, reward, and optional step, rollouts, tokens"


@dataclass(frozen=True)
class ImportSummary:
    """What `import_run_log` did: runs in the file, runs new to the study, records inserted and skipped."""

    file: str
    study: str
    runs: int
    runs_created: int
    records_added: int
    records_skipped: int


def read_run_log(
    path: str | Path, *, tag: str | None = None, compute_tag: str | None = None, gpus: float | None = None
) -> pd.DataFrame:
    """The run log at `path` as rows (run, step, compute, reward, rollouts, tokens, health metrics...), all checked
    first; `tag`/`compute_tag` name a training or W&B log's reward and cumulative compute, `gpus` a W&B run's GPUs."""
    from rlscale.db.logs import is_training_log, read_training_log
    from rlscale.db.trackers import is_wandb_log, read_wandb_log

    path = Path(path)
    if not path.exists():
        raise UserError("no such file", file=str(path))
    if is_wandb_log(path):
        return read_wandb_log(path, reward=tag, compute=compute_tag, gpus=gpus)
    if gpus is not None:
        raise UserError("--gpus applies to tracker runs (MLflow, trackio, W&B), not to this log", file=str(path))
    try:
        training_log = is_training_log(path)
    except (ValueError, RecursionError):  # a huge number or deep nesting on line 1: the JSONL reader says where
        training_log = False
    if training_log:
        return read_training_log(path, tag=tag, compute_tag=compute_tag)
    kind = EXTENSIONS.get(path.suffix.lower())
    if kind is None:
        raise UserError(f"unknown file type {path.suffix or '(none)'!r}: expected .csv or .jsonl", file=str(path))
    if not path.is_file():
        raise UserError("no such file", file=str(path))
    text = read_text(path)
    renames = {name.strip().lower(): to for name, to in ((tag, "reward"), (compute_tag, "compute")) if name}
    origins: dict[str, str] = {}  # a renamed column -> the file's own name for it, which errors name
    lines = (_csv_rows if kind == "csv" else _jsonl_rows)(path, text, renames, origins)
    rows = _validate(path, lines, origins)
    if compute_tag and compute_tag.strip().lower() not in COMPUTE_COLUMNS:  # a named column counts what it names
        rows.attrs["compute_unit"] = compute_tag.strip()
        rows.attrs["compute_note"] = f"the column {compute_tag.strip()!r} (--compute)"
    return rows


def _renamed(columns: list[str], renames: dict[str, str], where: str | None) -> list[str]:
    """`columns` with those --reward and --compute name given their canonical names (e.g. a W&B export's
    `train/reward` as reward); UserError at `where` (None: no check) naming the option whose column is missing."""
    for name, to in renames.items():
        if where is not None and name not in columns:
            option = "--reward" if to == "reward" else "--compute"
            raise UserError(f"no column {name!r}; the file has {', '.join(columns)}", file=where, field=option)
    replaced = set(renames.values()) | (set(COMPUTE_COLUMNS) if "compute" in renames.values() else set())
    named = [renames.get(c) or (f"unused {c}" if c in replaced else c) for c in columns]  # the named column wins
    return [WANDB_NAMES[c] if c in WANDB_NAMES and WANDB_NAMES[c] not in named else c for c in named]


def import_run_log(store: "Store", path: str | Path, study: str, rows: pd.DataFrame | None = None) -> ImportSummary:
    """Load the run log at `path` (or its read `rows`) into `study` in one transaction; stored steps are skipped."""
    rows = read_run_log(path) if rows is None else rows
    _check_same_unit(store, study, rows.attrs.get("compute_unit") or "gpu_hours", path)
    runs = []
    for name, group in rows.groupby("run", sort=False):
        # a run is identified by its name within the study, so re-importing (or a longer export) merges into it
        config = {"source": "import", "run": name}
        if rows.attrs.get("compute_unit"):  # training logs say what their compute axis counts
            config["compute_unit"] = rows.attrs["compute_unit"]
        geometry = rows.attrs.get("geometry", False)
        if geometry:  # a sweep's records: each run's B_p and n, as a study over rollouts is decided on
            config.update(
                {
                    key: _whole(group[key].dropna().iloc[0]) if group[key].notna().any() else None
                    for key in ("prompts_per_batch", "rollouts")
                }
            )
        runs.append((name, config, [_record(row, geometry) for row in group.to_dict("records")]))
    created, added, skipped = store.import_runs(study, runs)
    return ImportSummary(str(path), study, len(runs), created, added, skipped)


def logged_unit(configs) -> str | None:
    """The compute unit every run's config names (an imported log's tag, steps, gpu_hours); None if one names none
    (a sweep's runs: GPU-hours) or they differ."""
    units = {(config or {}).get("compute_unit") for config in configs}
    return units.pop() if len(units) == 1 and None not in units else None


def _check_same_unit(store: "Store", study: str, unit: str, path) -> None:
    """UserError if `study` holds runs whose compute counts another unit: one axis cannot mix them."""
    if study not in store.study_names():
        return
    held = {(config or {}).get("compute_unit") or "gpu_hours" for config in store.runs_frame(study)["config"]}
    held.discard(unit)
    if held:
        raise UserError(
            f"compute here is {unit}, study {study!r} counts {', '.join(sorted(held))}: import into another study, "
            "or name a matching --compute",
            file=str(path),
        )


def _whole(value) -> int | None:
    return None if _missing(value) else int(value)


def _record(row: dict, geometry: bool = False) -> dict:
    metrics = {k: row[k] for k in HEALTH_METRICS if k in row and not _missing(row[k])}
    return {
        "step": row["step"],
        "gpu_hours": row["compute"],
        "rollouts": None if geometry else _whole(row["rollouts"]),  # a count of rollouts so far, unless it is n
        "tokens": None if _missing(row["tokens"]) else int(row["tokens"]),
        "val_reward": row["reward"],
        "metrics": metrics,
    }


def _csv_rows(
    path: Path, text: str, renames: dict[str, str], origins: dict[str, str]
) -> tuple[list[str], list[tuple[int, dict[str, Any]]]]:
    reader = csv.reader(io.StringIO(text, newline=""))
    header: list[str] | None = None
    rows = []
    try:
        for cells in reader:
            if not any(cell.strip() for cell in cells) or cells[0].lstrip().startswith("#"):
                continue  # blank or comment line (e.g. a generator's note on top of the file)
            if header is None:
                header_line = reader.line_num
                raw = [cell.strip() for cell in cells]
                header = _renamed([cell.lower() for cell in raw], renames, f"{path}:{header_line}")
                origins.update(_origins(header, raw))
                _check_header(path, header_line, header)
                continue
            if len(cells) != len(header):
                raise UserError(
                    f"expected {len(header)} fields like the header, got {len(cells)}", file=f"{path}:{reader.line_num}"
                )
            rows.append((reader.line_num, dict(zip(header, cells))))
    except csv.Error as err:
        raise UserError(f"not valid CSV ({err})", file=f"{path}:{reader.line_num}") from None
    if header is None:
        raise UserError(f"empty file: expected a header line with {EXPECTED}", file=f"{path}:1")
    return header, rows


def _jsonl_rows(
    path: Path, text: str, renames: dict[str, str], origins: dict[str, str]
) -> tuple[list[str], list[tuple[int, dict[str, Any]]]]:
    rows = []
    columns: dict[str, None] = {}
    for number, obj in json_lines(path, text):
        if not isinstance(obj, dict):
            raise UserError(f"expected a JSON object per line, got {type(obj).__name__}", file=f"{path}:{number}")
        normalised = {str(k).strip().lower(): v for k, v in obj.items()}
        if len(normalised) != len(obj):  # e.g. "Reward" and "reward": one column twice
            seen = [str(k).strip().lower() for k in obj]
            twice = next(k for k in seen if seen.count(k) > 1)
            raise UserError("key appears twice in one object", file=f"{path}:{number}", field=f"column {twice!r}")
        where = None if rows else f"{path}:{number}"  # the first object is the header: later ones may omit keys
        named = _renamed(list(normalised), renames, where)
        origins.update(_origins(named, [str(k).strip() for k in obj]))
        obj = dict(zip(named, normalised.values()))
        if not rows:
            _check_header(path, number, list(obj))
        elif set(COMPUTE_COLUMNS) <= set(columns) | set(obj):  # a later line names the compute axis anew
            new = next(c for c in COMPUTE_COLUMNS if c in obj and c not in columns)
            old = next(c for c in COMPUTE_COLUMNS if c != new)
            raise UserError(
                f"earlier lines give '{old}': keep one compute column", file=f"{path}:{number}", field=f"column {new!r}"
            )
        columns.update(dict.fromkeys(obj))
        rows.append((number, obj))
    if not rows:
        raise UserError(f"empty file: expected one JSON object per line with {EXPECTED}", file=f"{path}:1")
    return list(columns), rows


def _origins(named: list[str], raw: list[str]) -> dict[str, str]:
    """{canonical name: the file's name} for each column given another name (`--reward train/reward` as reward)."""
    return {new: old for new, old in zip(named, raw) if new != old.lower() and not new.startswith("unused ")}


def read_text(path: Path) -> str:
    """The UTF-8 text of the file at `path`, a leading BOM dropped; UserError naming the first byte that is not."""
    try:
        return path.read_text(encoding="utf-8-sig")  # -sig: spreadsheet exports often start with a BOM
    except UnicodeDecodeError as err:
        raise UserError(
            f"expected UTF-8 text, found byte 0x{err.object[err.start]:02x} at offset {err.start}", file=str(path)
        ) from None


def json_lines(path: Path, text: str):
    """(line number, the value) of each JSON line of `text` (the file at `path`), blank and # lines skipped;
    UserError naming the line where one is not JSON or gives a key twice."""
    # split on newlines only: str.splitlines also breaks at U+2028, form feeds etc., which JSON strings may hold
    for number, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{path}:{number}"
        try:
            value = json.loads(line, object_pairs_hook=_unique_keys)
        except json.JSONDecodeError as err:
            raise UserError(f"column {err.colno}: not valid JSON ({err.msg})", file=where) from None
        except _DuplicateKey as err:
            raise UserError("key appears twice in one object", file=where, field=f"column {err.key!r}") from None
        except RecursionError:
            raise UserError("not valid JSON here (nested too deeply)", file=where) from None
        except ValueError:  # json.loads refuses integers of more than 4300 digits
            raise UserError(
                "expected numbers a store can hold, got an integer of more than 4300 digits", file=where
            ) from None
        yield number, value


class _DuplicateKey(ValueError):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    # a key given twice is ambiguous (json.loads would keep the last silently), as a repeated CSV header is
    obj = {}
    for key, value in pairs:
        if key in obj:
            raise _DuplicateKey(key)
        obj[key] = value
    return obj


def _check_header(path: Path, line: int, header: list[str]) -> None:
    where = f"{path}:{line}"
    seen = set()
    for name in header:
        if name in seen:
            raise UserError("column appears twice", file=where, field=f"column {name!r}")
        seen.add(name)
    if not seen & set(COMPUTE_COLUMNS):
        raise UserError(f"missing column 'compute' (or 'gpu_hours'); expected {EXPECTED}", file=where)
    if set(COMPUTE_COLUMNS) <= seen:
        raise UserError(
            "both 'compute' and 'gpu_hours' given: keep one, so the compute axis is unambiguous", file=where
        )
    if "reward" not in seen:
        raise UserError(f"missing column 'reward'; expected {EXPECTED}", file=where)


def _validate(
    path: Path, parsed: tuple[list[str], list[tuple[int, dict[str, Any]]]], origins: dict[str, str]
) -> pd.DataFrame:
    """The rows as a frame, checked; a row whose reward cell is empty (a tracker's export of a step that logged other
    metrics) is left out."""
    columns, rows = parsed
    if not rows:
        raise UserError("no data rows under the header", file=f"{path}:1")
    compute_col = "compute" if "compute" in columns else "gpu_hours"
    metrics = [m for m in HEALTH_METRICS if m in columns]
    geometry = "prompts_per_batch" in columns  # then `rollouts` is n per prompt, as a sweep's records give it
    out, lines = [], []  # the rows kept and their line numbers
    next_step: dict[str, int] = {}
    seen: dict[tuple[str, int], int] = {}
    for line, row in rows:
        cell = _Cells(path, line, row, origins)
        run = cell.name("run", default=path.stem)
        step = cell.whole("step", default=next_step.get(run, 0))
        next_step[run] = step + 1
        if (run, step) in seen:
            raise UserError(
                f"run {run!r} already has step {step} (line {seen[run, step]})",
                file=f"{path}:{line}",
                field=f"column {origins.get('step', 'step')!r}",
            )
        seen[run, step] = line
        if not cell.given("reward"):
            continue
        lines.append(line)
        out.append(
            {
                "run": run,
                "step": step,
                "compute": cell.number(compute_col, minimum=0.0),
                "reward": cell.number("reward"),
                "rollouts": cell.whole("rollouts", default=None),
                "tokens": cell.whole("tokens", default=None),
                **{m: cell.number(m, default=None) for m in metrics},
                **({"prompts_per_batch": cell.whole("prompts_per_batch", default=None)} if geometry else {}),
            }
        )
    if not out:
        raise UserError("no step with a reward", file=str(path), field=f"column {origins.get('reward', 'reward')!r}")
    frame = pd.DataFrame(out)
    frame.attrs["runs_left_out"] = [run for run in next_step if run not in set(frame["run"])]
    for column in ("rollouts", "tokens", *(("prompts_per_batch",) if geometry else ())):
        frame[column] = frame[column].astype("Int64")
    _check_cumulative(path, frame, lines, origins.get(compute_col, compute_col))
    if geometry:
        _check_geometry(path, frame, lines)
        frame.attrs["geometry"] = True
    return frame


def _check_geometry(path: Path, frame: pd.DataFrame, lines: list[int]) -> None:
    """UserError at the first row whose prompts_per_batch or rollouts (n) differs from its run's first row's."""
    for column in ("prompts_per_batch", "rollouts"):
        values = frame[column].astype("float")  # a blank cell is the run's value, as a JSONL log may leave it out
        first = values.groupby(frame["run"], sort=False).transform("first")
        differs = (values.notna() & (values != first)).to_numpy().nonzero()[0]
        if len(differs):
            at = int(differs[0])
            raise UserError(
                f"run {frame['run'].iloc[at]!r} has {column} {first.iloc[at]:g} and {values.iloc[at]:g}: beside "
                "prompts_per_batch, rollouts is n per prompt, one value per run",
                file=f"{path}:{lines[at]}",
                field=f"column {column!r}",
            )


def _check_cumulative(path: Path, frame: pd.DataFrame, lines: list[int], column: str) -> None:
    """UserError at the first row whose compute is below an earlier step's of its run: compute is cumulative."""
    order = frame.assign(line=lines).sort_values(["run", "step"], kind="stable")
    for run, steps in order.groupby("run", sort=False):
        before = steps["compute"].cummax().shift()
        falls = steps[steps["compute"] < before]
        if not falls.empty:
            row = falls.iloc[0]
            raise UserError(
                f"run {run!r}: {row['compute']:g} at step {row['step']} is below {before[row.name]:g} at an earlier "
                "step; compute is cumulative",
                file=f"{path}:{row['line']}",
                field=f"column {column!r}",
            )


_REQUIRED = object()  # default for cells that must hold a value
# a number as CSV/JSON writers spell it; inf and nan match so the finite check can name them
_DECIMAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|[+-]?(inf|infinity|nan)", re.IGNORECASE | re.ASCII)


class _Cells:
    def __init__(self, path: Path, line: int, row: dict[str, Any], origins: dict[str, str]):
        self.path, self.line, self.row, self.origins = path, line, row, origins

    def _fail(self, column: str, message: str) -> UserError:
        return UserError(message, file=f"{self.path}:{self.line}", field=f"column {self.origins.get(column, column)!r}")

    def given(self, column: str) -> bool:
        """Whether the row has a value in `column` (not absent, null or an empty cell)."""
        value = self.row.get(column)
        return not (value is None or (isinstance(value, str) and not value.strip()))

    def _present(self, column: str, default: Any) -> bool:
        empty = not self.given(column)
        if empty and default is _REQUIRED:
            raise self._fail(column, "missing" if column not in self.row else "expected a value, got an empty cell")
        return not empty

    def text(self, column: str, default: str) -> str:
        if column not in self.row:
            return default
        self._present(column, _REQUIRED)
        return str(self.row[column]).strip()

    def name(self, column: str, default: str) -> str:
        """A checked run name (printable text, as trackers write it), the default (the file's stem) included."""
        raw = self.row.get(column)
        if column in self.row and (isinstance(raw, bool) or not isinstance(raw, (str, int, float))):
            raise self._fail(column, f"expected a run name (text), got {_short(json.dumps(raw))}")
        value = self.text(column, default)
        problem = run_name_problem(value)
        if problem:
            source = "; the file name gives it: add a 'run' column" if column not in self.row else ""
            raise self._fail(column, problem + source)
        return value

    def number(self, column: str, *, minimum: float | None = None, default: Any = _REQUIRED) -> float | None:
        if not self._present(column, default):
            return default
        value = self.row[column]
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise self._fail(column, f"expected a number, got {json.dumps(value)}")
        if isinstance(value, str) and not _DECIMAL.fullmatch(value.strip()):
            # float() also takes Python's own syntax ("1_000", full-width digits), which no CSV writer means
            raise self._fail(column, f"expected a number, got {_short(value.strip())}")
        try:
            number = float(value)
        except ValueError:
            raise self._fail(column, f"expected a number, got {_short(value.strip())}") from None
        except OverflowError:  # an integer too large for a float
            raise self._fail(column, f"expected a finite number, got an integer of {len(str(value))} digits") from None
        if not math.isfinite(number):
            raise self._fail(column, f"expected a finite number, got {_short(str(value).strip())}")
        if minimum is not None and number < minimum:
            raise self._fail(column, f"expected a number >= {minimum:g}, got {_short(str(value).strip())}")
        return number

    def whole(self, column: str, *, default: Any) -> int | None:
        if not self._present(column, default):
            return default
        value = self.row[column]
        if isinstance(value, int) and not isinstance(value, bool):
            whole = value  # exact, however large (a float would round 2**63 - 1 up)
        elif (
            isinstance(value, str) and value.strip().isascii() and value.strip().isdigit() and len(value.strip()) <= 20
        ):
            whole = int(value.strip())
        else:
            number = self.number(column)
            if number != int(number):
                raise self._fail(column, f"expected a whole number >= 0, got {_short(str(value).strip())}")
            whole = int(number)
        if not 0 <= whole <= MAX_INT64:  # the store's integer columns are 64-bit
            raise self._fail(column, f"expected a whole number from 0 to 2**63 - 1, got {_short(str(value).strip())}")
        return whole


def _short(text: str) -> str:
    return repr(text) if len(text) <= 40 else f"{text[:40]!r}... ({len(text)} characters)"
