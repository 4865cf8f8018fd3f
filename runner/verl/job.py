"""One verl job of a run (a *segment*: from the run's last checkpoint up to a step): its entrypoint, Hydra overrides,
paths under the shared dir and runtime env. Nothing here submits or writes: engine.py does."""

import math
import shlex
from dataclasses import dataclass
from pathlib import Path

from rlscale.planner.frameworks.common import Deployment
from rlscale.planner.frameworks.setup import Change
from rlscale.planner.frameworks.verl import ACTOR, PPO_TRAINER_SEEDS, ROLLOUT, SEED_KEYS, hydra_value, verl_mapping
from rlscale.runner.jobs_api import RunDir

from rlscale.base.errors import UserError

from .data import DATA_SOURCE
from .logs import ValReward, reward_metrics

ENTRYPOINT = "verl.trainer.main_ppo"
REWARD_MODULE = "pkg://rlscale.runner.verl.reward"  # importable on the cluster through the runtime env's py_modules
PROJECT = "rlscale"
# verl writes this file once a checkpoint is saved in default_local_dir (verl/trainer/ppo/ray_trainer.py)
LATEST_CHECKPOINT = "latest_checkpointed_iteration.txt"
# rlscale modules the reward function imports on the cluster (no third-party imports)
REWARD_IMPORTS = (
    "rlscale",
    "rlscale.base",
    "rlscale.base.errors",
    "rlscale.runner",
    "rlscale.runner.rl",
    "rlscale.runner.rl.tasks",
    "rlscale.runner.verl",
    "rlscale.runner.verl.reward",
)


def checkpointed_step(run_dir: RunDir) -> int:
    """The step of the run's last verl checkpoint (0 if it has none)."""
    try:
        return int((run_dir.checkpoints / LATEST_CHECKPOINT).read_text().strip())
    except (OSError, ValueError):
        return 0


@dataclass(frozen=True)
class Job:
    """One submission: what `rlscale sweep --dry-run` prints and what the engine submits."""

    submission_id: str
    entrypoint: str
    overrides: list[str]
    env_vars: dict
    train_file: Path
    val_file: Path
    log_file: Path
    until_step: int
    gpus: int


@dataclass(frozen=True)
class SetupJob:
    """One segment's verl arguments on the user's own setup (after `python -m verl.trainer.main_ppo`; setup.py makes
    them), what they change in the user's setup, the job's environment, and notes on keys left out."""

    overrides: list[str]
    changes: list[Change]
    env_vars: dict
    notes: tuple[str, ...] = ()


def gpus_held(recipe) -> int:
    """GPUs a job holds: the trainer's, plus the generator's own in `async: pipeline` (verl's separate_async)."""
    return recipe.trainer_devices + (recipe.generator_devices if recipe.async_mode == "pipeline" else 0)


def job_devices(recipe, gpus_per_node: int) -> list[int]:
    """GPUs per node of each node a job holds: the trainer pool's nodes, then the rollout pool's in `pipeline`."""
    nodes, per_node = _layout(recipe.trainer_devices, gpus_per_node, "trainer")
    layout = [per_node] * nodes
    if recipe.async_mode == "pipeline":
        nodes, per_node = _layout(recipe.generator_devices, gpus_per_node, "generator")
        layout += [per_node] * nodes
    return layout


def _layout(devices: int, gpus_per_node: int, what: str) -> tuple[int, int]:
    nodes = math.ceil(devices / gpus_per_node)
    if devices % nodes:
        raise UserError(
            f"{what} {devices} GPUs do not split evenly over {nodes} nodes of {gpus_per_node}", field=f"{what}_devices"
        )
    return nodes, devices // nodes


def run_keys(
    recipe, run_dir: RunDir, *, until_step: int, gpus_per_node: int = 8, config_keys: frozenset | None = None
) -> dict[str, tuple]:
    """key -> (value, why) for what every job of a run sets itself: stop, checkpoints, eval cadence, devices, seeds,
    name. config_keys: the composed config's keys (seeds go to those it has); None: verl's ppo_trainer."""
    if recipe.eval_early_per_decade:
        raise UserError(
            "engine: verl evaluates every trainer.test_freq steps only; expected eval_early_per_decade: 0",
            field="eval_early_per_decade",
        )
    trainer_nodes, trainer_per_node = _layout(recipe.trainer_devices, gpus_per_node, "trainer")
    keys = {
        # verl checkpoints at the job's last step; total_epochs >= a step an epoch, so data never ends a job first
        "trainer.total_training_steps": (until_step, "compute stop"),
        "trainer.total_epochs": (until_step, "compute stop"),
        "trainer.save_freq": (recipe.checkpoint_every, "checkpoints"),
        "trainer.resume_mode": ("auto", "checkpoints"),
        "trainer.default_local_dir": (str(run_dir.checkpoints), "checkpoints"),
        "trainer.del_local_ckpt_after_load": (False, "checkpoints"),
        # verl writes no latest_checkpointed_iteration.txt after an async save: the next segment would start afresh
        f"{ACTOR}.checkpoint.async_save": (False, "checkpoints"),
        "trainer.test_freq": (recipe.eval_every, "evaluations"),
        # step 0 once; a resumed job would evaluate its checkpoint's step again
        "trainer.val_before_train": (checkpointed_step(run_dir) == 0, "evaluations"),
        "trainer.nnodes": (trainer_nodes, "devices"),
        "trainer.n_gpus_per_node": (trainer_per_node, "devices"),
    }
    if recipe.async_mode == "pipeline":
        nodes, per_node = _layout(recipe.generator_devices, gpus_per_node, "generator")
        keys[f"{ROLLOUT}.nnodes"], keys[f"{ROLLOUT}.n_gpus_per_node"] = (nodes, "devices"), (per_node, "devices")
    seeds = PPO_TRAINER_SEEDS if config_keys is None else [key for key in SEED_KEYS if key in config_keys]
    for key in seeds:
        keys[key] = (recipe.seed, "seed")
    keys["trainer.experiment_name"] = (run_dir.root.name, "run name")
    return keys


def job_overrides(
    recipe, run_dir: RunDir, *, until_step: int, gpus_per_node: int = 8, max_prompt_tokens: int = 1024
) -> list[str]:
    """verl 0.9.1 Hydra overrides for one segment up to `until_step`: the export's mapping (planner/frameworks/verl)
    plus this run's devices, data, reward function, validation, checkpoints and file logger."""
    if recipe.model == "tiny":
        raise UserError(
            "engine: verl needs a HF model directory the cluster can read, not the tiny CPU policy", field="model"
        )
    pipeline = recipe.async_mode == "pipeline"
    owned = run_keys(recipe, run_dir, until_step=until_step, gpus_per_node=gpus_per_node)
    trainer_nodes, trainer_per_node = owned["trainer.nnodes"][0], owned["trainer.n_gpus_per_node"][0]
    deployment = Deployment(
        gpus_per_node=trainer_per_node * (2 if pipeline else 1),
        nodes=trainer_nodes,
        max_prompt_tokens=max_prompt_tokens,
    )
    keys = verl_mapping(recipe, deployment).keys()
    keys.update(
        {
            "actor_rollout_ref.model.path": recipe.model,
            "data.train_files": str(run_dir.data / "train.parquet"),
            "data.val_files": str(run_dir.data / "val.parquet"),
            "reward.custom_reward_function.path": REWARD_MODULE,
            "reward.custom_reward_function.name": "compute_score",
            # validation = rlscale's val reward: eval_samples samples per held-out prompt at the training temperature
            f"{ROLLOUT}.val_kwargs.n": recipe.eval_samples,
            f"{ROLLOUT}.val_kwargs.temperature": recipe.temperature,
            f"{ROLLOUT}.val_kwargs.do_sample": True,
            "trainer.project_name": PROJECT,
        }
    )
    keys.update({key: value for key, (value, _) in owned.items()})
    keys["trainer.logger"] = ["console", "file"]
    return [f"{key}={hydra_value(value)}" for key, value in keys.items()]


def val_reward_metric(recipe) -> ValReward:
    """The verl metric that is rlscale's val reward: the mean pass rate over eval_samples samples per prompt."""
    return reward_metrics(DATA_SOURCE, recipe.eval_samples)


def make_job(
    recipe,
    run_dir: RunDir,
    submission_id: str,
    *,
    until_step: int,
    python: str = "python3",
    module: str = ENTRYPOINT,
    gpus_per_node: int = 8,
    max_prompt_tokens: int = 1024,
    env_vars: dict | None = None,
) -> Job:
    """The job of one segment: `python -m module overrides...` with VERL_FILE_LOGGER_PATH set."""
    overrides = job_overrides(
        recipe, run_dir, until_step=until_step, gpus_per_node=gpus_per_node, max_prompt_tokens=max_prompt_tokens
    )
    files = run_dir.data / "train.parquet", run_dir.data / "val.parquet"
    return segment_job(recipe, run_dir, submission_id, overrides, env_vars or {}, files, until_step, python, module)


def segment_job(
    recipe,
    run_dir: RunDir,
    submission_id: str,
    overrides: list[str],
    env_vars: dict,
    files: tuple,
    until_step: int,
    python: str,
    module: str,
) -> Job:
    """The Job running `python -m module overrides...` with verl's file logger (the records) writing to its log;
    files: its (train, val) data."""
    log = run_dir.log(submission_id)
    entrypoint = " ".join(map(shlex.quote, [python, "-m", module, *overrides]))
    env = {**env_vars, "VERL_FILE_LOGGER_PATH": str(log)}
    return Job(submission_id, entrypoint, overrides, env, *files, log, until_step, gpus_held(recipe))
