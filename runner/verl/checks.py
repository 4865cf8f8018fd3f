"""The user's verl data (parquet columns and rows) and reward (its file read with `ast`, never imported), checked on
the driver before anything is stored; a path the driver cannot see is skipped with a note."""

import ast
from dataclasses import dataclass
from pathlib import Path

from rlscale.base.errors import UserError

TRAIN_FILES, VAL_FILES = "data.train_files", "data.val_files"
PROMPT_KEY, DEFAULT_PROMPT_KEY = "data.prompt_key", "prompt"  # verl 0.9.1's legacy_data.yaml default
DATA_SOURCE, REWARD_MODEL, GROUND_TRUTH = "data_source", "reward_model", "ground_truth"
REWARD_PATH, REWARD_NAME = "reward.custom_reward_function.path", "reward.custom_reward_function.name"
DEFAULT_REWARD_NAME = "compute_score"  # verl 0.9.1's reward.yaml default
MANAGER = "reward.reward_manager.name"
ROWS_PER_READ = 65_536


@dataclass(frozen=True)
class SetupFacts:
    """What the checks found: notes for the dry-run (what was not checked, and why), the validation files' data
    sources (None: not every file read) and the training rows (None: not every file read)."""

    notes: tuple[str, ...]
    val_sources: tuple[str, ...] | None
    train_rows: int | None


def check_setup(keys: dict, source: dict, *, study_file: str | None = None) -> SetupFacts:
    """Check the data and reward of a user's verl keys (live names; `source`: the file that sets each key).
    UserError, one line naming the file and the column or key, on a missing file, column or function."""
    notes: list[str] = []
    prompt_key = str(keys.get(PROMPT_KEY) or DEFAULT_PROMPT_KEY)
    found: dict[str, tuple[int, set] | None] = {}
    for key in (TRAIN_FILES, VAL_FILES):
        if keys.get(key) is None:
            raise UserError(
                "not set: verl's data files (a parquet path or a list)", file=source.get(key, study_file), field=key
            )
        counts, sources, complete = 0, set(), True
        for name in files(keys[key]):
            path = visible(name, key, source.get(key, study_file), notes)
            if path is None:
                complete = False
                continue
            if path.suffix != ".parquet":
                notes.append(f"{key}: {name}: not parquet, not checked here")
                complete = False
                continue
            rows, seen = check_parquet(path, prompt_key)
            counts, sources = counts + rows, sources | seen
        found[key] = (counts, sources) if complete else None
    notes += check_reward(keys, source, study_file)
    val, train = found[VAL_FILES], found[TRAIN_FILES]
    return SetupFacts(tuple(notes), tuple(sorted(map(str, val[1]))) if val else None, train[0] if train else None)


def files(value) -> list[str]:
    """The paths a data.*_files value names (one path, or a list of them)."""
    return [str(item) for item in value] if isinstance(value, list | tuple) else [str(value)]


def visible(name: str, key: str, origin: str | None, notes: list[str]) -> Path | None:
    """The file `name` if the driver can read it; None with a note when it cannot see where it is. UserError for a
    file missing from a folder the driver sees (a typo, not a cluster path)."""
    if "://" in name and not name.startswith("file://"):
        notes.append(f"{key}: {name}: read on the cluster, not checked here")
        return None
    path = Path(name.removeprefix("file://"))
    if not path.is_absolute():
        notes.append(f"{key}: {name}: relative, read from the job's working directory; not checked here")
        return None
    if path.is_file():
        return path
    if path.parent.is_dir():
        raise UserError(f"file not found: {name}", file=origin, field=key)
    notes.append(f"{key}: {name}: not on this machine (a cluster path?), not checked here")
    return None


def check_parquet(path: Path, prompt_key: str) -> tuple[int, set]:
    """(rows, data sources) of a parquet file verl will read; UserError naming the file and the column when a column
    verl reads is missing or a row has no prompt or data source."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as err:
        raise UserError(f"not a parquet file ({err})", file=str(path)) from None
    schema = parquet.schema_arrow
    for column, why in (
        (prompt_key, "the prompt, data.prompt_key"),
        (DATA_SOURCE, "the reward and metrics' source"),
        (REWARD_MODEL, "the reward's ground truth"),
    ):
        if column not in schema.names:
            raise UserError(f"missing column ({why}; columns: {', '.join(schema.names)})", file=str(path), field=column)
    reward = schema.field(REWARD_MODEL).type
    if not pa.types.is_struct(reward) or reward.get_field_index(GROUND_TRUTH) < 0:
        raise UserError(
            f"missing column: verl's reward reads {REWARD_MODEL}.{GROUND_TRUTH}, got {reward}",
            file=str(path),
            field=f"{REWARD_MODEL}.{GROUND_TRUTH}",
        )
    prompt = schema.field(prompt_key).type
    messages = pa.types.is_list(prompt) or pa.types.is_large_list(prompt)
    if (
        not messages
        or not pa.types.is_struct(prompt.value_type)
        or {"role", "content"} - {field.name for field in prompt.value_type}
    ):
        raise UserError(
            f"expected a list of chat messages {{role, content}}, got {prompt}", file=str(path), field=prompt_key
        )
    rows, sources = 0, set()
    for batch in parquet.iter_batches(batch_size=ROWS_PER_READ, columns=[prompt_key, DATA_SOURCE]):
        prompts, data_sources = batch.column(0), batch.column(1)
        empty = pc.or_kleene(prompts.is_null(), pc.equal(pc.list_value_length(prompts), 0))
        for column, bad, what in (
            (prompt_key, empty, "no prompt messages"),
            (DATA_SOURCE, data_sources.is_null(), "no data source"),
        ):
            if pc.any(bad).as_py():
                row = rows + pc.index(bad, True).as_py()
                raise UserError(f"row {row}: {what}", file=str(path), field=column)
        sources.update(pc.unique(data_sources).to_pylist())
        rows += batch.num_rows
    return rows, sources


def check_reward(keys: dict, source: dict, study_file: str | None = None) -> list[str]:
    """Notes on the user's reward; UserError when custom_reward_function's file is missing, not Python, or lacks it."""
    spec = keys.get(REWARD_PATH)
    if not spec:
        manager = keys.get(MANAGER) or "naive"
        return [f"reward: verl's {manager} reward manager with verl's default scorer for each data_source"]
    name = str(keys.get(REWARD_NAME) or DEFAULT_REWARD_NAME)
    spec = str(spec)
    if spec.startswith("pkg://"):
        return [f"reward: {name} from module {spec}, imported on the cluster; not checked here"]
    notes: list[str] = []
    path = visible(spec, REWARD_PATH, source.get(REWARD_PATH, study_file), notes)
    if path is None:
        return notes
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except (SyntaxError, UnicodeDecodeError, ValueError) as err:
        raise UserError(f"not Python the reward loop can load ({err})", file=str(path), field=REWARD_PATH) from None
    defined = top_level_names(tree.body)
    if name not in defined:
        raise UserError(
            f"defines no {name!r} (it defines: {', '.join(sorted(defined)) or 'nothing'})",
            file=str(path),
            field=REWARD_NAME,
        )
    return [f"reward: {name} from {path}"]


def top_level_names(body: list) -> set[str]:
    """The names a module binds at its top level (functions, classes, assignments, imports; inside if/try/with too)."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.If | ast.Try | ast.With):
            handlers = [h.body for h in getattr(node, "handlers", [])]
            for block in (node.body, getattr(node, "orelse", []), getattr(node, "finalbody", []), *handlers):
                names |= top_level_names(block)
    return names


def check_batch(facts: SetupFacts, recipe, origin: str | None) -> None:
    """UserError when the training files hold fewer rows than one batch: verl's epoch would hold no step."""
    if facts.train_rows is not None and facts.train_rows < recipe.prompts_per_batch:
        raise UserError(
            f"{facts.train_rows} training rows, fewer than one batch of the run ({recipe.prompts_per_batch} prompts)",
            file=origin,
            field="data.train_batch_size",
        )
