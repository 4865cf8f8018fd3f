"""What every target's export shares: the deployment choices, the result of a mapping, and the ScaleRL knobs
that no pinned target can express."""

import math
import shlex
from dataclasses import dataclass, field, fields

from rlscale.planner.recipe import Recipe

MODEL_PLACEHOLDER = "/path/to/hf-model"
TRAIN_DATA_PLACEHOLDER = "/path/to/train.parquet"
VAL_DATA_PLACEHOLDER = "/path/to/val.parquet"
VERIFIER_PLACEHOLDER = "http://VERIFIER_HOST:PORT/get_reward"


@dataclass(frozen=True)
class Deployment:
    """How a job is laid out (`rlscale export --gpus N --nodes K ...`); none of it changes what is trained.
    micro_batch_per_gpu is for targets without dynamic batching (TRL); cpu: one process on CPU cores."""

    gpus_per_node: int = 8
    nodes: int = 1
    tensor_parallel: int = 1
    max_prompt_tokens: int = 1024
    max_tokens_per_gpu: int = 16384
    micro_batch_per_gpu: int = 4
    cpu: bool = False

    def __post_init__(self):
        for name in (f.name for f in fields(self) if f.name != "cpu"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.gpus_per_node % self.tensor_parallel:
            raise ValueError(
                f"tensor_parallel ({self.tensor_parallel}) must divide gpus_per_node ({self.gpus_per_node})"
            )

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    def tokens_per_gpu(self, recipe: Recipe) -> int:
        """The dynamic-batching token budget: max_tokens_per_gpu, raised to hold one prompt + response."""
        return max(self.max_tokens_per_gpu, self.max_prompt_tokens + recipe.max_new_tokens)

    def describe(self) -> str:
        return (
            f"--gpus {self.gpus_per_node} --nodes {self.nodes} --tp {self.tensor_parallel} "
            f"--prompt-tokens {self.max_prompt_tokens}"
        )


@dataclass
class Mapping:
    """One recipe in one target's keys (`recipe`: its meaning; `deployment`: layout only); `nearest` names each
    inexact form's difference, `missing` what the pinned target cannot express."""

    framework: str
    version: str
    recipe: dict = field(default_factory=dict)
    deployment: dict = field(default_factory=dict)
    nearest: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    def keys(self) -> dict:
        """Recipe and deployment keys together (deployment last)."""
        return {**self.recipe, **self.deployment}


def updates_per_batch(recipe: Recipe) -> int:
    """Optimizer updates per generated batch: ppo_minibatches for ppo_off_policy, else exactly one."""
    return recipe.ppo_minibatches if recipe.async_mode == "ppo_off_policy" else 1


def minibatch_prompts(recipe: Recipe, mapping: Mapping) -> int:
    """Prompts per optimizer update; names the rounding when B_p does not split into ppo_minibatches."""
    k = updates_per_batch(recipe)
    per_update = max(1, recipe.prompts_per_batch // k)
    if per_update * k != recipe.prompts_per_batch:
        k_real = math.ceil(recipe.prompts_per_batch / per_update)
        mapping.nearest.append(
            f"ppo_minibatches {k}: B_p {recipe.prompts_per_batch} does not split into {k} equal "
            f"minibatches; {per_update} prompts per update ({k_real} updates per batch)"
        )
    return per_update


def warmup_fraction(recipe: Recipe) -> float:
    """lr_warmup_steps as a fraction f of all optimizer updates, for ratio targets: ceil(updates x f) == the steps."""
    updates = recipe.steps * updates_per_batch(recipe)
    warmup = min(recipe.lr_warmup_steps, updates)
    return 0.0 if warmup == 0 else (warmup - 0.5) / updates


def common_missing(recipe: Recipe, target: str) -> list[str]:
    """ScaleRL knobs that none of the pinned targets has a key for (each target adds its own)."""
    missing = []
    if recipe.no_positive_resampling is not None:
        missing.append(
            f"no_positive_resampling: {recipe.no_positive_resampling} (retire prompts whose pass rate "
            f"exceeds it) has no {target} key; filter the dataset between epochs instead"
        )
    if recipe.length_control == "interrupt":
        missing.append(
            f"length_control: interrupt (append an end-of-thinking marker at the limit and let the model "
            f"answer) has no {target} key; responses are truncated at the limit"
        )
    if recipe.head_precision != "fp32":
        missing.append(
            f"head_precision: {recipe.head_precision} (the FP32 head's matmul precision) has no {target} key; "
            "the head runs at the target's own precision"
        )
    return missing


def lr_note(recipe: Recipe) -> str:
    """How the exported lr was computed (the recipe's sqrt batch scaling, already applied)."""
    if recipe.lr_scaling == "sqrt":
        return (
            f"lr {recipe.scaled_lr:.6g} = lr {recipe.lr:g} x sqrt(B_p x n {recipe.total_batch} / "
            f"{recipe.lr_reference_batch}) (lr_scaling: sqrt, applied here)"
        )
    return f"lr {recipe.scaled_lr:.6g} (lr_scaling: none)"


def comment_block(title: str, items: list[str]) -> list[str]:
    if not items:
        return []
    return [f"# {title}:"] + [f"#   - {item}" for item in items]


def launch_script(
    target: str,
    recipe: Recipe,
    header: list[str],
    mapping,
    recipe_words: list[list[str]],
    deployment,
    deployment_words: list[list[str]],
    module: str,
    keys: str,
) -> str:
    """A bash script for a framework's launcher `python3 -m module`: the header, how the lr was computed, what is
    only near or not expressible (from `mapping`), then the recipe's and the deployment's words in two arrays."""
    lines = ["#!/usr/bin/env bash", f"# target: {target}"]
    lines += [f"# {line}" for line in header]
    lines += [f"# {lr_note(recipe)}"]
    lines += comment_block("nearest form (the difference named)", mapping.nearest)
    lines += comment_block("not expressible", mapping.missing)
    lines += [f"# the recipe: {keys} with rlscale's meaning"]
    lines += shell_array("recipe", recipe_words)
    lines += [f"# deployment choices ({deployment.describe()}): how the job is laid out, not what it trains"]
    lines += shell_array("deployment", deployment_words)
    lines += [f'python3 -m {module} "${{recipe[@]}}" "${{deployment[@]}}"']
    return "\n".join(lines) + "\n"


def shell_array(name: str, lines_of_words: list[list[str]]) -> list[str]:
    """A bash array `name=( ... )`: each list of words on one line, every word shell-quoted."""
    lines = [f"{name}=("]
    for words in lines_of_words:
        lines.append("  " + " ".join(shlex.quote(word) for word in words))
    lines.append(")")
    return lines
