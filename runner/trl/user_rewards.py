"""The user's reward functions as `trl grpo` names them (trl/scripts/grpo.py): a name in TRL's registry, or a dotted
path to a TRL-signature reward function, imported from where the sweep started, then from the config's folder."""

import importlib
import inspect
import sys
from contextlib import contextmanager

from rlscale.base.errors import UserError

# what GRPOTrainer passes every reward function besides the dataset's columns (grpo_trainer.py _calculate_rewards)
TRAINER_ARGUMENTS = {
    "prompts",
    "completions",
    "completion_ids",
    "trainer_state",
    "log_extra",
    "log_metric",
    "environments",
}


def registry() -> dict:
    """`trl grpo`'s reward functions by name, made as its script makes them."""
    from trl.rewards import (
        accuracy_reward,
        get_soft_overlong_punishment,
        reasoning_accuracy_reward,
        think_format_reward,
    )

    return {
        "accuracy_reward": accuracy_reward,
        "reasoning_accuracy_reward": reasoning_accuracy_reward,
        "think_format_reward": think_format_reward,
        "get_soft_overlong_punishment": get_soft_overlong_punishment(max_completion_len=1280, soft_punish_cache=256),
    }


@contextmanager
def importable(paths: list[str]):
    """sys.path with `paths` in front while the block runs."""
    added = [path for path in paths if path not in sys.path]
    sys.path[:0] = added
    try:
        yield
    finally:
        for path in added:
            if path in sys.path:
                sys.path.remove(path)


def reward_functions(script_args, *, paths: list[str], file: str) -> list:
    """The reward functions (and reward model, first, as a name GRPOTrainer loads) of the user's config; UserError
    naming `file` and reward_funcs for a name that is neither TRL's nor importable."""
    funcs = [script_args.reward_model_name_or_path] if script_args.reward_model_name_or_path else []
    names = script_args.reward_funcs or []
    if not funcs and not names:
        raise UserError(
            "expected at least one reward function (or reward_model_name_or_path)", file=file, field="reward_funcs"
        )
    known = registry()
    with importable(paths):
        for name in names:
            if name in known:
                funcs.append(known[name])
            elif "." in name:
                funcs.append(_import(name, file))
            else:
                raise UserError(
                    f"{name!r} is neither one of {', '.join(known)} nor a dotted import path",
                    file=file,
                    field="reward_funcs",
                )
    return funcs


def _import(name: str, file: str):
    module_name, attribute = name.rsplit(".", 1)
    try:
        function = getattr(importlib.import_module(module_name), attribute)
    except Exception as err:  # the user's module may raise anything while it imports
        text = (str(err).strip().splitlines() or [""])[0][:200]
        raise UserError(
            f"{name}: cannot import it ({type(err).__name__}: {text})", file=file, field="reward_funcs"
        ) from None
    if not callable(function):
        raise UserError(f"{name} is not a function", file=file, field="reward_funcs")
    return function


def needed_columns(funcs: list) -> list[str]:
    """The dataset columns the reward functions take by name without a default (e.g. `answer`, `solution`)."""
    columns = []
    for func in funcs:
        if isinstance(func, str):  # a reward model reads the prompt and completion only
            continue
        try:
            parameters = inspect.signature(func).parameters.values()
        except (TypeError, ValueError):  # a builtin or C callable: nothing to read
            continue
        for parameter in parameters:
            if (
                parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
                and parameter.default is parameter.empty
                and parameter.name not in TRAINER_ARGUMENTS
                and parameter.name not in columns
            ):
                columns.append(parameter.name)
    return columns
