"""The user's `trl grpo --config FILE` YAML, read as TRL 1.16 reads it (trl/scripts/grpo.py's make_parser), every
problem a one-line UserError naming the file and field; its `env:` block is kept out of the parsing process."""

import argparse
import contextlib
import dataclasses
import io
import tempfile
from pathlib import Path

import yaml

from rlscale.base.errors import UserError, first_line

# keys of a `trl grpo` YAML whose values are local paths when such a file exists (else a Hub id)
PATH_KEYS = ("model_name_or_path", "dataset_name", "reward_model_name_or_path")
MESSAGE_CHARS = 300  # the most of a TRL or accelerate message an error shows


def read_keys(path: str) -> tuple[dict, dict]:
    """(keys, env) of the YAML at `path` as TRL reads it (yaml.safe_load), its `env:` block apart."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise UserError(f"not a readable YAML file ({str(err).splitlines()[0]})", file=path) from None
    if not isinstance(data, dict):
        raise UserError("expected a YAML mapping of GRPOConfig and `trl grpo` keys", file=path)
    env = data.pop("env", None) or {}
    if not isinstance(env, dict):
        raise UserError("expected a mapping of environment variables", file=path, field="env")
    return data, {str(key): str(value) for key, value in env.items()}


def make_parser():
    """A fresh `trl grpo` parser (TRL mutates a parser's defaults while it reads a file)."""
    from trl.scripts.grpo import make_parser as trl_parser

    parser = trl_parser()
    parser.exit_on_error = False  # a bad value raises ArgumentError instead of printing usage and exiting
    return parser


def known_keys(parser) -> set[str]:
    """The fields a `trl grpo` YAML may set: the script's arguments, GRPOConfig, ModelConfig, the mixture."""
    return {field.name for kind in parser.dataclass_types for field in dataclasses.fields(kind)}


def accelerate_keys() -> set[str]:
    """The `accelerate launch` options `trl grpo` takes from a YAML (num_processes, mixed_precision, ...)."""
    from accelerate.commands.launch import launch_command_parser

    options = vars(launch_command_parser().parse_args(["script.py"]))  # every option's name, at its default
    return set(options) - {"config_file", "training_script", "training_script_args"}


def trl_launcher_key(key: str, value, *, file: str) -> bool:
    """Whether `key` is an option TRL's own CLI turns into `accelerate launch`'s (accelerate_config: a file or one of
    TRL's shipped configs, trl/cli/accelerate_config.py); UserError naming the key for a value TRL's CLI refuses."""
    from trl.cli.accelerate_config import resolve_accelerate_config_argument

    try:
        launch = resolve_accelerate_config_argument([f"--{key}", str(value)])
    except ValueError as err:
        raise UserError(first_line(str(err))[:MESSAGE_CHARS], file=file, field=key) from None
    return launch[:1] == ["--config_file"]


def parse(keys: dict, *, file: str) -> tuple:
    """(script_args, GRPOConfig, ModelConfig, DatasetMixtureConfig) of `keys` through TRL's parser; UserError naming
    `file` and the field for a key TRL does not know or a value it refuses."""
    parser = make_parser()
    unknown = sorted(set(keys) - known_keys(parser))
    if unknown:
        raise UserError(
            "not a field of GRPOConfig, ModelConfig or the `trl grpo` script's arguments", file=file, field=unknown[0]
        )
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as handle:
        yaml.safe_dump(keys, handle)
        handle.flush()
        return parse_file(handle.name, shown=file, parser=parser)


def parse_file(path: str, *, shown: str | None = None, parser=None) -> tuple:
    """parse() of the YAML file at `path` (no `env:` block), as the job reads its config."""
    parser = parser or make_parser()
    printed = io.StringIO()
    try:
        with contextlib.redirect_stderr(printed):
            return tuple(parser.parse_args_and_config(["--config", path]))
    except argparse.ArgumentError as err:  # argument_name is "max_steps/--max-steps": the YAML's key first
        key = (err.argument_name or "").split("/")[0].lstrip("-")
        raise UserError(first_line(err.message)[:MESSAGE_CHARS], file=shown or path, field=key) from None
    except (ValueError, TypeError) as err:
        raise UserError(first_line(str(err))[:MESSAGE_CHARS], file=shown or path, field="GRPOConfig") from None
    except Exception as err:  # TRL's arithmetic on a value it lets through (num_generations: 0 divides by zero)
        detail = f"refused by TRL's GRPOConfig ({type(err).__name__}: {first_line(err)})"
        raise UserError(detail[:MESSAGE_CHARS], file=shown or path, field="GRPOConfig") from None
    except SystemExit:  # argparse printed its usage, then the error on the last line
        last = (printed.getvalue().strip().splitlines() or ["refused by TRL's parser"])[-1]
        raise UserError(first_line(last)[:MESSAGE_CHARS], file=shown or path) from None


def local_path(value: str, folders: list[Path]) -> str:
    """`value` as an absolute path when it names a file or directory under one of `folders` (in order: where the sweep
    was started, as `trl grpo` resolves it, then the config's folder); else unchanged (a Hub id)."""
    path = Path(value).expanduser()
    if path.is_absolute():
        return str(path)
    for folder in folders:
        if (folder / path).exists():
            return str((folder / path).resolve())
    return value


def local_paths(keys: dict, folders: list[Path]) -> dict:
    """The keys whose values are local paths (PATH_KEYS, the mixture's `path` and `data_files`) made absolute: the job
    runs in another directory, perhaps on another node of a shared filesystem."""
    out = {key: local_path(keys[key], folders) for key in PATH_KEYS if isinstance(keys.get(key), str)}
    if isinstance(keys.get("datasets"), list):
        out["datasets"] = [_mixture_entry(entry, folders) for entry in keys["datasets"]]
    return {key: value for key, value in out.items() if value != keys[key]}


def _mixture_entry(entry, folders: list[Path]):
    if not isinstance(entry, dict):
        return entry
    entry = dict(entry)
    if isinstance(entry.get("path"), str):
        entry["path"] = local_path(entry["path"], folders)
    files = entry.get("data_files")
    if isinstance(files, str):
        entry["data_files"] = local_path(files, folders)
    elif isinstance(files, list):
        entry["data_files"] = [local_path(f, folders) if isinstance(f, str) else f for f in files]
    elif isinstance(files, dict):
        entry["data_files"] = {k: local_path(f, folders) if isinstance(f, str) else f for k, f in files.items()}
    return entry


def updates_per_generation(config) -> int:
    """Optimizer updates per generated batch of a parsed GRPOConfig (steps_per_generation x num_iterations
    micro-batches over gradient_accumulation_steps); UserError when that is not a whole number."""
    micro = config.steps_per_generation * config.num_iterations
    if micro % config.gradient_accumulation_steps:
        raise UserError(
            f"a generated batch is {config.steps_per_generation} micro-batches x {config.num_iterations} "
            f"iterations, not a whole number of updates of {config.gradient_accumulation_steps}",
            field="gradient_accumulation_steps",
        )
    return micro // config.gradient_accumulation_steps
