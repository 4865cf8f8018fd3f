"""`python -m rlscale.runner.trl.preflight`: a setup study's checks in the TRL job's own interpreter, so what a job
lacks shows here, not on the cluster. Reads a JSON request on stdin; prints {"files"} or {"error"} as one JSON line."""

import inspect
import json
import os
import re
import sys
from pathlib import Path

from rlscale.base.errors import UserError

SAMPLE_ROWS = 2  # held-out rows each reward function is called on
SAMPLE_COMPLETION = "0"  # what the rows are scored as: a short answer, as a policy may write one
HUB_TIMEOUT_SECONDS = 10
# what GRPOTrainer passes a reward function besides the dataset's columns (grpo_trainer.py _calculate_rewards)
TRAINER_KEYWORDS = ("trainer_state", "log_extra", "log_metric")


def environment() -> str:
    """The job's environment as the messages name it: its interpreter's prefix (a venv's folder)."""
    return sys.prefix


def check(request: dict) -> list[str]:
    """The user's files the job reads (config, data, reward modules), after every check; UserError otherwise."""
    from . import user_config, user_data, user_rewards

    file, paths = request["file"], request["import_paths"]
    script_args, config, model_args, mixture = user_config.parse(request["keys"], file=file)
    check_model(model_args.model_name_or_path, file=file, field="model_name_or_path")
    if script_args.reward_model_name_or_path:
        check_model(script_args.reward_model_name_or_path, file=file, field="reward_model_name_or_path")
    funcs = user_rewards.reward_functions(script_args, paths=paths, file=file)
    if config.reward_weights is not None and len(config.reward_weights) != len(funcs):
        raise UserError(
            f"{len(config.reward_weights)} weights for {len(funcs)} reward functions", file=file, field="reward_weights"
        )
    train, held_out = user_data.load_splits(script_args, mixture, eval_prompts=int(request["eval_prompts"]))
    source = user_data.dataset_source(script_args, mixture)
    columns = user_rewards.needed_columns(funcs)
    conversational = user_data.check_rows(train, columns=columns, split="train", source=source)
    user_data.check_rows(held_out, columns=columns, split="held-out", source=source)
    if conversational:
        user_data.check_chat_template(model_args.model_name_or_path, source=source)
    names = script_args.reward_funcs or []
    with user_rewards.importable(paths):
        for name, func in zip(names, [func for func in funcs if not isinstance(func, str)]):
            call_reward(func, name, held_out, conversational=conversational, file=file)
    check_trackers(config.report_to, file)
    modules = {_source_file(func) for func in funcs if not isinstance(func, str)}
    return [file, source, *sorted(path for path in modules if path and "site-packages" not in path)]


def check_model(name: str, *, file: str, field: str) -> None:
    """UserError unless `name` is a local HF model directory, in this environment's Hub cache, or on the Hub as this
    environment reaches it (one request, HUB_TIMEOUT_SECONDS)."""
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UserError(f"{name} has no config.json: not a Hugging Face model", file=file, field=field)
        return
    if path.is_absolute() or name.startswith((".", "~")) or name.count("/") > 1:
        raise UserError(f"{name}: no such model directory", file=file, field=field)
    from huggingface_hub import HfApi, try_to_load_from_cache

    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return
    try:
        HfApi().model_info(name, timeout=HUB_TIMEOUT_SECONDS)
    except Exception as err:  # no network, no such repo, a gated one: the job could not load it either
        raise UserError(
            f"{name!r} is neither a model directory, tiny (the policy rlscale ships), nor a model the Hugging Face "
            f"Hub gives the job's environment {environment()} ({type(err).__name__}: {_line(err)})",
            file=file,
            field=field,
        ) from None


def call_reward(func, name: str, rows, *, conversational: bool, file: str) -> None:
    """Call a reward function on `rows` as GRPOTrainer does; UserError for a missing package, arguments it cannot take
    or not one reward per completion. Other exceptions are ignored: the trainer's real completions differ."""
    rows = rows.select(range(min(SAMPLE_ROWS, len(rows))))
    prompts = list(rows["prompt"])
    text = SAMPLE_COMPLETION
    completions = [[{"role": "assistant", "content": text}] if conversational else text for _ in prompts]
    columns = {key: list(rows[key]) for key in rows.column_names if key not in ("prompt", "completion")}
    keywords = {**columns, **dict.fromkeys(TRAINER_KEYWORDS)}
    keywords["log_extra"] = keywords["log_metric"] = lambda *args, **kwargs: None
    arguments = {"prompts": prompts, "completions": completions, "completion_ids": [[0] for _ in prompts], **keywords}
    try:
        inspect.signature(func).bind(**arguments)
    except TypeError as err:
        why = f"{name} cannot take GRPOTrainer's arguments ({err})"
        raise UserError(why, file=file, field="reward_funcs") from None
    except ValueError:  # a callable without a signature: the call below says
        pass
    try:
        rewards = func(**arguments)
    except ImportError as err:
        package = getattr(err, "name", None) or next(iter(re.findall(r"`([\w.-]+)`", str(err))), None)
        needs = f"needs the package {package}" if package else "cannot import what it needs"
        raise UserError(
            f"{name} {needs}, which the job's environment {environment()} lacks ({type(err).__name__}: {_line(err)})",
            file=file,
            field="reward_funcs",
        ) from None
    except Exception:  # noqa: S110 (see the docstring)
        return
    if inspect.isawaitable(rewards):
        rewards.close()
        return
    if not hasattr(rewards, "__len__") or len(rewards) != len(prompts):
        raise UserError(
            f"{name} returned {type(rewards).__name__} for {len(prompts)} completions; expected one reward each",
            file=file,
            field="reward_funcs",
        )


def check_trackers(report_to, file: str) -> None:
    """UserError naming report_to when a tracker it names is not installed in this environment."""
    from transformers.integrations import get_reporting_integration_callbacks

    try:
        for callback in get_reporting_integration_callbacks(report_to):
            callback()  # raises when its package is not installed
    except (ValueError, RuntimeError, ImportError) as err:
        raise UserError(f"{_line(err)} (the job's environment {environment()})", file=file, field="report_to") from None


def _source_file(func) -> str | None:
    try:
        return inspect.getsourcefile(func)
    except TypeError:
        return None


def _line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [""])[0][:200]


def main() -> None:
    request = json.loads(sys.stdin.read())
    if not request["keys"].get("use_vllm"):
        sys.modules.setdefault("vllm", None)  # TRL imports an installed vLLM it will not use (slow)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        out = {"files": check(request)}
    except UserError as err:
        out = {"error": {"message": err.detail, "file": err.file, "field": err.field}}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
