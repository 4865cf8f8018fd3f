"""Training logs -> the importer's rows: TensorBoard event directories (a run per subdirectory) and verl's
file-logger JSONL (`{"step": N, "data": {metric: value}}` a line, a run per file)."""

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from rlscale.db.importer import json_lines, read_text  # one reader of a JSONL file's lines

from rlscale.base.compute import VERL_THROUGHPUT, VERL_TOKENS, device_hours, verl_step_device_seconds
from rlscale.base.errors import UserError
from rlscale.base.names import run_name_problem

VERL_REWARD = re.compile(r"^val-core/.+/[^/]+/mean@\d+$")
LEGACY_VERL_REWARD = re.compile(r"^val/test_score/.+$")
# the store's health metrics, from what verl logs each step
VERL_HEALTH = {
    "train_reward": "critic/score/mean",
    "entropy": "actor/entropy",
    "kl": "actor/kl_loss",
    "grad_norm": "actor/grad_norm",
    "truncation_rate": "response_length/clip_ratio",
    "clip_fraction": "actor/pg_clipfrac",
}
COMPUTE_UNITS = {
    "gpu_hours": "GPU-hours (verl's perf/total_num_tokens / perf/throughput, summed over steps)",
    "steps": "training steps (the log has no perf/throughput; --compute-tag names another axis)",
}


@dataclass
class _Run:
    name: str
    kind: str  # "column" (JSONL) or "tag" (TensorBoard): what a metric is called in messages
    values: dict[str, dict[int, tuple[Any, str]]] = field(default_factory=dict)

    def put(self, tag: str, step: int, value: Any, where: str, *, replace: bool) -> None:
        steps = self.values.setdefault(tag, {})
        if not replace and step in steps and steps[step][0] != value:
            raise UserError(
                f"step {step} already has {_show(steps[step][0])} (at {steps[step][1]}), here {_show(value)}",
                file=where,
                field=f"{self.kind} {tag!r}",
            )
        steps[step] = (value, where)

    def steps(self) -> set[int]:
        return {step for steps in self.values.values() for step in steps}


def is_training_log(path: str | Path) -> bool:
    """Whether `path` is a TensorBoard directory or a verl file-logger JSONL (first object has step and data)."""
    path = Path(path)
    if path.is_dir():
        return True
    if path.suffix.lower() not in (".jsonl", ".ndjson") or not path.is_file():
        return False
    try:
        with path.open(encoding="utf-8-sig") as handle:
            for line in handle:
                if line.strip() and not line.lstrip().startswith("#"):
                    first = json.loads(line)
                    return (
                        isinstance(first, dict) and set(first) == {"step", "data"} and isinstance(first["data"], dict)
                    )
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False  # the CSV/JSONL reader reports it, with its line
    return False


def read_training_log(path: str | Path, *, tag: str | None = None, compute_tag: str | None = None) -> pd.DataFrame:
    """Importer rows, one per step with a reward; attrs "compute_unit" ("gpu_hours", "steps" or the compute tag)
    and "reward_tags" (run -> the metric read as its reward)."""
    path = Path(path)
    if path.is_dir():
        runs = _tensorboard_runs(path)
    elif path.is_file():
        runs = [_verl_jsonl_run(path)]
    else:
        raise UserError("no such file or directory", file=str(path))
    units = {}
    rows, reward_tags, missing = [], {}, {}
    for run in runs:
        reward_tag = _reward_tag(run, tag, path)
        if isinstance(reward_tag, UserError):  # a run that never logged its reward (it crashed first): left out
            missing[run.name] = reward_tag
            continue
        reward_tags[run.name] = reward_tag
        compute, units[run.name] = _compute(run, compute_tag, path)
        for step, (value, where) in sorted(run.values[reward_tag].items()):
            if step not in compute:
                raise UserError(
                    f"step {step} has a reward but no {compute_tag!r} value",
                    file=where,
                    field=f"{run.kind} {compute_tag!r}",
                )
            rows.append(
                {
                    "run": run.name,
                    "step": step,
                    "compute": compute[step],
                    "reward": _number(value, where, run.kind, reward_tag),
                    "rollouts": None,
                    "tokens": None,
                    **{name: _optional(run, source, step) for name, source in VERL_HEALTH.items()},
                }
            )
    if missing and not reward_tags:
        raise next(iter(missing.values()))
    if len(set(units.values())) > 1:
        detail = ", ".join(f"{name}: {unit}" for name, unit in units.items())
        raise UserError(
            f"runs measure compute in different units ({detail}): pass --compute, or import them separately",
            file=str(path),
        )
    if not rows:
        raise UserError("no step with a reward", file=str(path))
    frame = pd.DataFrame(rows)
    frame = frame.drop(columns=[name for name in VERL_HEALTH if frame[name].isna().all()])
    for column in ("rollouts", "tokens"):
        frame[column] = frame[column].astype("Int64")
    frame.attrs["compute_unit"] = next(iter(units.values()))
    frame.attrs["reward_tags"] = reward_tags
    frame.attrs["runs_left_out"] = list(missing)
    return frame


def compute_note(unit: str) -> str:
    """What the compute axis of an imported training log counts, in words."""
    return COMPUTE_UNITS.get(unit, f"the scalar {unit!r} (--compute-tag)")


def _verl_jsonl_run(path: Path) -> _Run:
    run = _Run(_run_name(path.stem, f"{path}:1", "the file name"), "column")  # verl names the file after the experiment
    for number, obj in json_lines(path, read_text(path)):  # the lines as the CSV/JSONL reader reads and counts them
        where = f"{path}:{number}"
        if not isinstance(obj, dict) or "step" not in obj or not isinstance(obj.get("data"), dict):
            raise UserError('expected a verl file-logger line {"step": N, "data": {metric: value}}', file=where)
        step = obj["step"]
        if (
            isinstance(step, bool)
            or not isinstance(step, (int, float))
            or step != step
            or step < 0
            or step != int(step)
        ):
            raise UserError(f"expected a whole number >= 0, got {_show(step)}", file=where, field="column 'step'")
        for tag, value in obj["data"].items():
            # one step may be logged on several lines (e.g. validation apart from training), never twice differently
            run.put(str(tag), int(step), value, where, replace=False)
    if not run.values:
        raise UserError('empty log: expected one line {"step": N, "data": {metric: value}} per step', file=f"{path}:1")
    return run


def _tensorboard_runs(root: Path) -> list[_Run]:
    files = sorted(p for p in root.rglob("*") if p.is_file() and "tfevents" in p.name)
    if not files:
        raise UserError("no TensorBoard event files (events.out.tfevents.*) in this directory or below", file=str(root))
    by_dir: dict[Path, list[Path]] = {}
    for file in files:
        by_dir.setdefault(file.parent, []).append(file)
    runs = []
    for directory, event_files in by_dir.items():
        # nested run directories (verl: tensorboard_log/<project>/<experiment>) are named by their path below root
        name = root.resolve().name if directory == root else "/".join(directory.relative_to(root).parts)
        run = _Run(_run_name(name, str(directory), "the directory"), "tag")
        for file in event_files:  # file names start with the writer's start time: a resumed run's file comes later
            for step, tag, value in _scalars(file):
                run.put(tag, step, value, f"{file}: step {step}", replace=True)
        runs.append(run)
    return runs


def _scalars(file: Path):
    from tensorboard import data_compat
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto import event_pb2
    from tensorboard.util import tensor_util

    size = file.stat().st_size
    consumed = 0
    records = []
    for record in RawEventFileLoader(str(file)).Load():
        records.append(record)
        consumed += len(record) + 16  # TFRecord framing: length (8) + its CRC (4) + data + data CRC (4)
    if consumed != size:
        # the loader stops quietly at a bad or partial record; an import must not keep half a log
        raise UserError(
            f"truncated or corrupt event record at byte {consumed} of {size} ({len(records)} records read before it)",
            file=str(file),
        )
    for record in records:
        try:
            event = data_compat.migrate_event(event_pb2.Event.FromString(record))
        except Exception as err:  # protobuf's DecodeError and friends: a record whose CRC held but is no Event
            raise UserError(f"not a TensorBoard event record ({type(err).__name__})", file=str(file)) from None
        if not event.HasField("summary"):
            continue
        for value in event.summary.value:
            if not value.HasField("tensor"):
                continue
            array = tensor_util.make_ndarray(value.tensor)
            if array.size == 1 and array.dtype.kind in "fiu":  # scalars only: text, histograms and images are skipped
                yield int(event.step), value.tag, float(array.reshape(()))


def _reward_tag(run: _Run, tag: str | None, path: Path) -> str | UserError:
    """The tag read as `run`'s reward: `tag`, else verl's validation reward; the error to give if the run has none
    (raised at once where it has several)."""
    if tag is not None:
        if tag in run.values:
            return tag
        return UserError(f"run {run.name!r} has no {run.kind} {tag!r} ({_some_tags(run)})", file=str(path))
    for pattern in (VERL_REWARD, LEGACY_VERL_REWARD):
        found = sorted(tag for tag in run.values if pattern.match(tag))
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise UserError(
                f"run {run.name!r} has several validation rewards ({', '.join(found)}): pick one with --reward",
                file=str(path),
            )
    return UserError(
        f"run {run.name!r} has no verl validation reward (val-core/<source>/reward/mean@k): name the "
        f"reward with --reward ({_some_tags(run)})",
        file=str(path),
    )


def _compute(run: _Run, compute_tag: str | None, path: Path) -> tuple[dict[int, float], str]:
    if compute_tag is not None:
        if compute_tag not in run.values:
            raise UserError(
                f"run {run.name!r} has no {run.kind} {compute_tag!r} ({_some_tags(run)})",
                file=str(path),
                field="--compute-tag",
            )
        return (
            {
                step: _number(value, where, run.kind, compute_tag, minimum=0.0)
                for step, (value, where) in run.values[compute_tag].items()
            },
            compute_tag,
        )
    if VERL_TOKENS in run.values and VERL_THROUGHPUT in run.values:
        tokens, throughput = run.values[VERL_TOKENS], run.values[VERL_THROUGHPUT]
        total, out = 0.0, {}
        for step in sorted(run.steps()):
            if step in tokens and step in throughput:
                n = _number(*tokens[step], run.kind, VERL_TOKENS, minimum=0.0)
                rate = _number(*throughput[step], run.kind, VERL_THROUGHPUT, minimum=0.0)
                if rate == 0 and n > 0:
                    raise UserError(
                        "expected a throughput > 0 on a step that processed tokens, got 0",
                        file=throughput[step][1],
                        field=f"{run.kind} {VERL_THROUGHPUT!r}",
                    )
                total += verl_step_device_seconds({VERL_TOKENS: n, VERL_THROUGHPUT: rate})  # the live meter's
            out[step] = device_hours(total)
        return out, "gpu_hours"
    return {step: float(step) for step in run.steps()}, "steps"


def _run_name(name: str, where: str, source: str) -> str:
    problem = run_name_problem(name)
    if problem:
        raise UserError(f"{source} gives the run name: {problem}; rename it", file=where)
    return name


def _number(value: Any, where: str, kind: str, tag: str, *, minimum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"expected a number, got {_show(value)}", file=where, field=f"{kind} {tag!r}")
    number = float(value)
    if not math.isfinite(number):
        raise UserError(f"expected a finite number, got {_show(value)}", file=where, field=f"{kind} {tag!r}")
    if minimum is not None and number < minimum:
        raise UserError(f"expected a number >= {minimum:g}, got {_show(value)}", file=where, field=f"{kind} {tag!r}")
    return number


def _optional(run: _Run, tag: str, step: int) -> float | None:
    # health metrics are kept when they are plain finite numbers and left out otherwise (verl writes NaN as null)
    value = run.values.get(tag, {}).get(step, (None, ""))[0]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _some_tags(run: _Run, limit: int = 8) -> str:
    tags = sorted(run.values)
    shown = ", ".join(tags[:limit]) + (f", ... ({len(tags)} in all)" if len(tags) > limit else "")
    return f"it has: {shown}" if tags else "it has no scalars"


def _show(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
