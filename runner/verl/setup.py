"""A segment's verl job on the user's own setup (`setup:` block): their command, then the study's axes and run keys.
Each key is given once; legacy reward keys move to live `reward.*` keys; LR schedules decay over the run's steps."""

import math
import os
from pathlib import Path

from rlscale.planner.frameworks import schedule
from rlscale.planner.frameworks.setup import Change, UserSetup, by_axes, one_error
from rlscale.planner.frameworks.verl import ACTOR, ROLLOUT, hydra_value
from rlscale.planner.loading import load_yaml_mapping
from rlscale.runner.jobs_api import RunDir
from rlscale.runner.tracking import forwarded_env, tracker_env

from rlscale.base.errors import UserError

from .job import Job, SetupJob, run_keys, segment_job

VERL_CONFIG = "pkg://verl.trainer.config"  # verl's own configs, on Hydra's search path for a user YAML
DEFAULT_LOGGER = ["console", "wandb"]  # verl 0.9.1's trainer.logger (ppo_trainer.yaml; the checker composes it)
DEFAULT_VAL_SAMPLES = 1  # verl 0.9.1's rollout.val_kwargs.n (the checker composes it)
VAL_SAMPLES = f"{ROLLOUT}.val_kwargs.n"
WANDB_LOGGERS = ("wandb", "tracking")  # verl's names for W&B (`tracking`: its deprecated alias)
# legacy reward keys -> live ones (experimental/reward_loop/reward_loop.py, migrate_legacy_reward_impl); "." = subtree
LEGACY_REWARD = {
    "custom_reward_function.": "reward.custom_reward_function.",
    "sandbox_fusion.": "reward.sandbox_fusion.",
    "reward_model.reward_manager": "reward.reward_manager.name",
    "reward_model.num_workers": "reward.num_workers",
    "reward_model.reward_loop_source": "reward.reward_manager.source",
    "reward_model.reward_loop_module_path": "reward.reward_manager.module.path",
    "reward_model.reward_loop_class_name": "reward.reward_manager.module.name",
    "reward_model.enable": "reward.reward_model.enable",
    "reward_model.enable_resource_pool": "reward.reward_model.enable_resource_pool",
    "reward_model.n_gpus_per_node": "reward.reward_model.n_gpus_per_node",
    "reward_model.nnodes": "reward.reward_model.nnodes",
    "reward_model.model.path": "reward.reward_model.model_path",
    "reward_model.reward_kwargs.": "reward.reward_kwargs.",
    "reward_model.rollout.": "reward.reward_model.rollout.",
}
DEFAULT_COSINE_CYCLES = 0.5  # verl 0.9.1's optim.num_cycles (trainer/config/optim/fsdp.yaml): a half cosine


def config_words(setup: UserSetup) -> list[str]:
    """main_ppo's config arguments: --config-name, or a YAML's absolute --config-path/--config-name with verl's configs
    on Hydra's search path ([] for verl's default ppo_trainer)."""
    if setup.config_name is not None:
        return [f"--config-name={setup.config_name}"]
    if setup.config_file is None:
        return []
    path = Path(setup.config_file)
    if path.suffix != ".yaml":
        raise UserError("Hydra reads a config named NAME.yaml", file=setup.config_file, field="setup.config")
    words = [f"--config-path={path.parent}", f"--config-name={path.stem}"]
    search = list((load_yaml_mapping(path).get("hydra") or {}).get("searchpath") or [])
    if VERL_CONFIG not in search and not setup.sets("hydra.searchpath"):
        words.append(f"hydra.searchpath={hydra_value([*search, VERL_CONFIG])}")
    return words


def user_command(setup: UserSetup) -> list[str]:
    """The user's own arguments to verl.trainer.main_ppo: their config words, then their overrides as written."""
    return config_words(setup) + list(setup.overrides)


def user_config_keys(setup: UserSetup) -> tuple[str, frozenset]:
    """(verl's version, the keys of the user's config as verl's Hydra composes it: the only keys a job sets).
    UserError naming every key Hydra refuses, with the file that sets it."""
    from .compose import user_config

    version, composed = user_config(user_command(setup), setup.files())
    if not composed.ok:
        raise refused(setup, composed, version)
    return version, composed.keys


def refused(
    setup: UserSetup | None, composed, version: str, *, study_file: str | None = None, why: dict | None = None
) -> UserError:
    """The UserError for a command verl's Hydra refused: one line per missing key naming the file (or study and
    `why`, key -> reason) that sets it; otherwise verl's reason, naming the file of the key it quotes."""
    where = f"verl {version}'s {composed.config} config"
    source = setup.source if setup is not None else {}
    problems = [
        UserError(
            f"not a key of {where}; Hydra refuses it at launch (a new key takes a leading +)",
            file=source[key],
            field=key,
        )
        if key in source
        else UserError(
            f"rlscale sets it ({(why or {}).get(key, 'the run')}), and {where} has no such key",
            file=study_file,
            field=key,
        )
        for key in composed.missing
    ]
    if not problems:
        named = [key for key in source if f"'{key}'" in composed.error or f" {key}=" in composed.error]
        files = ", ".join(setup.files()) if setup is not None else ""
        file = source[named[0]] if named else files or study_file
        if not named and setup is not None and setup.config_name and f"'{setup.config_name}'" in composed.error:
            named, file = ["--config-name"], setup.config_origin
        problems = [
            UserError(f"verl's Hydra refuses {where}: {composed.error}", file=file, field=next(iter(named), None))
        ]
    return one_error(problems)


def override_key(word: str) -> str:
    """The config key a Hydra override sets or deletes (`+k=v`, `++k=v`, `k=v`, `~k`)."""
    return word.lstrip("+~").split("=", 1)[0]


def legacy_moves(setup: UserSetup) -> dict[str, str]:
    """The user's legacy reward keys -> the live keys they move to; UserError when the live key is set too."""
    moves = {}
    for key in setup.keys:
        live = next(
            (
                new + key[len(old) :]
                for old, new in LEGACY_REWARD.items()
                if key == old or (old.endswith(".") and key.startswith(old))
            ),
            None,
        )
        if live is None or setup.keys[key] is None:
            continue
        if setup.sets(live):
            raise UserError(
                f"set twice: as {live} and as the legacy {key} (verl 0.9.1's main_ppo reads only {live}); keep one",
                file=setup.source[key],
                field=key,
            )
        moves[key] = live
    return moves


def live_keys(setup: UserSetup) -> tuple[dict, dict]:
    """The user's keys as main_ppo reads them (legacy reward keys renamed live), and the file that sets each."""
    moves = legacy_moves(setup)
    return (
        {moves.get(key, key): value for key, value in setup.keys.items()},
        {moves.get(key, key): origin for key, origin in setup.source.items()},
    )


def loggers(setup: UserSetup) -> list[str]:
    """The user's trainer.logger (verl's default when unset) with rlscale's file logger beside it."""
    user = setup.keys.get("trainer.logger", DEFAULT_LOGGER)
    user = [user] if isinstance(user, str) else list(user or [])
    return list(dict.fromkeys([*map(str, user), "file"]))


def mlflow_segments(setup: UserSetup, env: dict) -> bool:
    """Whether the sweep makes each segment's MLflow run (VerlEngine.submission): verl logs to MLflow at a store the
    sweep sees too (a URI given)."""
    return "mlflow" in loggers(setup) and bool(env.get("MLFLOW_TRACKING_URI"))


def val_samples(setup: UserSetup) -> int:
    """Responses per prompt in validation (rollout.val_kwargs.n), as the user's config says."""
    return int(setup.keys.get(VAL_SAMPLES) or DEFAULT_VAL_SAMPLES)


def setup_job(
    plan,
    recipe,
    run_dir: RunDir,
    *,
    until_step: int,
    gpus_per_node: int = 8,
    config_keys: frozenset | None = None,
    env_vars: dict | None = None,
) -> SetupJob:
    """One segment's verl arguments up to `until_step`, the changes to the user's config with why, and tracker env.
    With config_keys (user_config_keys) rlscale sets only those keys and notes the run keys it leaves out."""
    setup = plan.setup
    words = user_command(setup)
    check_parallelism(setup, recipe)
    axes = plan.values(recipe)
    if config_keys is not None:
        axes = reachable_axes(plan, axes, config_keys)
    owned = {key: (value, f"axis {plan.changed[key]}") for key, value in axes.items()}
    owned.update(run_keys(recipe, run_dir, until_step=until_step, gpus_per_node=gpus_per_node, config_keys=config_keys))
    owned["trainer.logger"] = (loggers(setup), "file logger")
    owned["trainer.project_name"] = (plan.study, "run name: the study")
    if setup.keys.get("trainer.resume_from_path") is not None:
        owned["trainer.resume_from_path"] = (None, "checkpoints: the run's own, resume_mode auto")
    owned.update(schedule_keys(setup.keys, owned, recipe, plan.lr_decay_steps))
    left_out = [] if config_keys is None else [(key, why) for key, (_, why) in owned.items() if key not in config_keys]
    for key, _ in left_out:
        del owned[key]
    moves = legacy_moves(setup)
    kept = words[: len(words) - len(setup.overrides)]  # the YAML's words
    for word in setup.overrides:
        key = override_key(word)
        if key in moves:
            sign, _, value = word.partition(key)  # a legacy word keeps its +/++ and its value as written
            kept.append(f"{sign}{moves[key]}{value}")
        elif key not in owned:
            kept.append(word)
    from_yaml = [key for key in moves if setup.source[key] == setup.config_file]
    kept += [f"{moves[key]}={hydra_value(setup.keys[key])}" for key in from_yaml]
    # valueless axis keeps verl's default, run key resets to null; +/++ kept (Hydra refuses plain override of new key)
    signs = {override_key(word): word[: len(word) - len(word.lstrip("+"))] for word in setup.overrides}
    kept += [
        f"{signs.get(key, '')}{key}={hydra_value(value)}"
        for key, (value, _) in owned.items()
        if value is not None or key not in axes
    ]
    changes = plan.changes(recipe)
    for key in moves:
        if key not in from_yaml:
            changes.append(Change(key, setup.keys[key], None, f"legacy reward key: main_ppo reads {moves[key]}"))
        changes.append(Change(moves[key], None, setup.keys[key], f"legacy reward key {key}"))
    changes += [
        Change(key, setup.keys.get(key), value, why)
        for key, (value, why) in owned.items()
        if key not in axes and repr(value) != repr(setup.keys.get(key))
    ]
    backends = ["wandb" if name in WANDB_LOGGERS else name for name in loggers(setup)]
    given = {**forwarded_env(dict(os.environ)), **(env_vars or {})}
    # no URI given: verl's own (the node's MLFLOW_TRACKING_URI), not a file on the driver's disk the nodes may lack
    env = tracker_env(backends, study=plan.study, run_key=run_dir.root.name, env=given, default_uri=False)
    # not the sweep's MLFLOW_RUN_ID: verl logs its params in every segment (VerlEngine nests a run per segment)
    env.pop("MLFLOW_RUN_ID", None)
    notes = tuple(f"not set: {key} ({why}): your config has no such key" for key, why in left_out)
    if mlflow_segments(setup, env):
        notes += ("MLflow: each job logs to a run of its own (MLFLOW_RUN_ID, made at submission) under the run's",)
    return SetupJob(kept, changes, env, notes)


def reachable_axes(plan, axes: dict, config_keys: frozenset) -> dict:
    """The axes' keys the composed config has (e.g. megatron's actor lacks grad_clip); UserError for an axis reaching
    none."""
    fields = {field for why in plan.changed.values() for field in why.split(", ")}
    problems = []
    for field in sorted(fields):
        keys = [key for key in axes if field in plan.changed[key].split(", ")]
        if keys and not any(key in config_keys for key in keys):
            problems.append(
                UserError(
                    f"not in your config as verl composes it, so {by_axes(field)} would reach no job",
                    file=", ".join(plan.setup.files()) or None,
                    field=", ".join(keys),
                )
            )
    if problems:
        raise one_error(problems)
    return {key: value for key, value in axes.items() if key in config_keys}


def schedule_keys(keys: dict, owned: dict, recipe, study_steps: int | None = None) -> dict[str, tuple]:
    """key -> (value, why) making an LR schedule verl fits to each job's total_training_steps decay over the run's
    planned steps (FSDP cosine via num_cycles, megatron via lr_decay_steps, warmup ratio as steps)."""
    steps = schedule.decay_steps(recipe, study_steps)
    job_steps = owned["trainer.total_training_steps"][0]
    out = {}
    for prefix in (ACTOR, "critic"):

        def current(name, prefix=prefix):
            key = f"{prefix}.optim.{name}"
            return owned[key][0] if key in owned else keys.get(key)

        fsdp = current("warmup_style") or current("lr_scheduler_type")  # warmup_style: verl's deprecated name wins
        megatron = current("lr_decay_style")
        name = next((style for style in (fsdp, megatron) if style not in (None, "constant")), None)
        ratio, warmup = current("lr_warmup_steps_ratio"), current("lr_warmup_steps")
        if isinstance(ratio, int | float) and ratio > 0 and (warmup is None or warmup <= 0):
            warmup = schedule.warmup_steps(ratio, steps)
            why = schedule.warmup_reason(ratio, steps, study_steps=study_steps)
            out[f"{prefix}.optim.lr_warmup_steps"] = (warmup, why)
        if name is None:
            continue
        why = schedule.reason(name, steps, study_steps=study_steps)
        if fsdp == "cosine":
            cycles = current("num_cycles")
            cycles = schedule.cosine_cycles(
                DEFAULT_COSINE_CYCLES if cycles is None else cycles,
                job_steps=job_steps,
                steps=steps,
                warmup=max(0, warmup or 0),
            )
            out[f"{prefix}.optim.num_cycles"] = (round(cycles, 12), why)
        if megatron not in (None, "constant") and current("lr_decay_steps") is None:
            out[f"{prefix}.optim.lr_decay_steps"] = (steps, why)
    return out


def check_parallelism(setup: UserSetup, recipe) -> None:
    """UserError when rollout parallelism (tensor x data x pipeline) doesn't divide the study's rollout GPUs (verl
    doesn't check: leftover GPUs idle, or no replica at all)."""
    sizes = {
        name: setup.keys.get(f"{ROLLOUT}.{name}_parallel_size") for name in ("tensor_model", "data", "pipeline_model")
    }
    if not any(sizes.values()):
        return
    product = math.prod(int(value or 1) for value in sizes.values())
    pipeline = recipe.async_mode == "pipeline"
    gpus = recipe.generator_devices if pipeline else recipe.trainer_devices
    if gpus % product:
        key = next(f"{ROLLOUT}.{name}_parallel_size" for name, value in sizes.items() if value)
        field = "generator_devices" if pipeline else "trainer_devices"
        raise UserError(
            f"rollout parallelism {product} (tensor x data x pipeline) does not divide the run's {gpus} "
            f"rollout GPUs (recipe.{field})",
            file=setup.source[key],
            field=key,
        )


def make_setup_job(
    plan,
    recipe,
    run_dir: RunDir,
    submission_id: str,
    *,
    until_step: int,
    python: str,
    module: str,
    gpus_per_node: int,
    env_vars: dict | None = None,
    config_keys: frozenset | None = None,
) -> tuple[Job, SetupJob]:
    """The job of one segment on the user's setup, and what it changes in the user's config (SetupJob)."""
    options = {"gpus_per_node": gpus_per_node, "config_keys": config_keys, "env_vars": env_vars}
    job = setup_job(plan, recipe, run_dir, until_step=until_step, **options)
    keys = live_keys(plan.setup)[0]
    files = keys.get("data.train_files"), keys.get("data.val_files")
    made = segment_job(recipe, run_dir, submission_id, job.overrides, job.env_vars, files, until_step, python, module)
    return made, job
