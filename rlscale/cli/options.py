"""Options several commands share, each defined once (typer's Annotated form: `db: DbUrl = None`)."""

import math
from typing import Annotated

import typer

from rlscale.base.errors import UserError

MAX_BOOTSTRAP = 100_000  # bootstrap draws a command takes: each draw holds a refit, memory grows with them

DbUrl = Annotated[
    str | None, typer.Option("--db", help="SQLAlchemy URL of the store (default: RLSCALE_DB or sqlite:///rlscale.db)")
]
# A log's reward and compute metrics, for every command that reads a log (the errors of db/logs.py name them).
RewardTag = Annotated[
    str | None,
    typer.Option(
        "--reward",
        "--tag",
        help="the reward metric (trackers: required; CSV/JSONL: a column, default `reward`; TensorBoard/verl: "
        "default verl's mean validation reward (docs/import.md))",
    ),
]
ComputeTag = Annotated[
    str | None,
    typer.Option(
        "--compute",
        "--compute-tag",
        help="a logged metric of cumulative compute (GPU-hours, tokens, ...); CSV/JSONL: a column, default "
        "`compute` or `gpu_hours`; TensorBoard/verl default: "
        "GPU-hours from verl's perf/total_num_tokens / perf/throughput, else the step",
    ),
]


def check_fit_source(
    file,
    study: str | None,
    db: str | None,
    *,
    command: str,
    noise: str,
    unbounded: bool,
    r0: float | None,
    tags: tuple = (None, None),
) -> None:
    """Checks `fit` and `backtest` share on FILE/--study, --db, --reward/--compute, --noise, --r0; raises UserError."""
    from rlscale.fitting.sigmoid import NOISE_MODELS

    if (file is None) == (study is None):
        raise UserError("give either a run-log FILE or --study NAME (not both)", field=command)
    if study is None and db is not None:
        raise UserError("--db is only used with --study", field="--db")
    for name, tag in zip(("--reward", "--compute"), tags):
        if study is not None and tag is not None:
            raise UserError(f"{name} names a metric of a run-log FILE; a study's records are stored", field=name)
    if noise not in NOISE_MODELS:
        raise UserError(f"expected one of {', '.join(NOISE_MODELS)}, got {noise!r}", field="--noise")
    if unbounded and noise == "binomial":
        raise UserError(
            "binomial noise is for pass rates in [0, 1]; with --unbounded use auto, constant or multiplicative",
            field="--noise",
        )
    if r0 is not None and not (math.isfinite(r0) and (unbounded or 0.0 <= r0 <= 1.0)):
        raise UserError(
            f"expected a finite reward{'' if unbounded else ' in [0, 1] (or pass --unbounded)'}, got {r0:g}",
            field="--r0",
        )


def check_out_dir(path, what: str, field: str = "--out") -> None:
    """UserError if `path` cannot be the directory `what` is written into: it, or a folder above it, is a file."""
    from pathlib import Path

    for folder in (Path(path), *Path(path).parents):
        if folder.exists():
            if not folder.is_dir():
                raise UserError(f"{folder} is a file: expected a directory for {what}", field=field)
            return
