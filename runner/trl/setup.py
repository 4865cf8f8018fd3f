"""A TRL job from the user's own `trl grpo` YAML (`setup: {config: FILE}`): their keys as TRL's parser reads them, with
only what rlscale must own changed (axes, run keys, schedule, devices, trackers), each change with its reason."""

import inspect
import json
import math
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from rlscale.planner.frameworks import schedule
from rlscale.planner.frameworks.setup import Change
from rlscale.planner.frameworks.trl import TRL_DEFAULTS, updates_per_generated_batch
from rlscale.runner.tracking import ENV_REASONS, forwarded_env, tracker_env

from rlscale.base.errors import UserError

from . import trackers, user_config
from .job import CHECKPOINTS_KEPT

PREFLIGHT_SECONDS = 900  # the checks in the job's environment: imports, the dataset's load, a Hub request


@dataclass
class Composed:
    """One job's config: `keys` (the YAML it reads), `changes` to the user's, its `env`, optimizer `updates` per rlscale
    step (one generated batch), its `batch` of completions, and TRL's `parsed` (script_args, GRPOConfig, ...)."""

    keys: dict
    changes: list[Change] = field(default_factory=list)
    env: dict = field(default_factory=dict)
    updates: int = 1
    batch: int = 0
    parsed: tuple = ()
    gpus: bool = False  # a GPU job (its device keys are the user's)
    lr_decay_updates: int | None = None  # optimizer updates a decaying schedule decays over (None: a steady one)

    def put(self, key: str, value, why: str) -> None:
        """Set `key` to `value` (None: remove it) and note the change when it is one."""
        before = self.keys.get(key)
        if value is None:
            if key in self.keys:
                del self.keys[key]
                self.changes.append(Change(key, before, None, why))
        elif key not in self.keys or repr(before) != repr(value):
            self.keys[key] = value
            self.changes.append(Change(key, before, value, why))


def compose(plan, recipe, *, run_dir, run_key: str, until_step: int, fresh: bool, gpus: bool) -> Composed:
    """The job's config for `recipe`'s run, from its last checkpoint (`fresh`: none yet) to `until_step`; UserError
    naming the user's file and key for what TRL refuses or rlscale cannot keep."""
    file = plan.setup.config_file
    keys, user_env = user_config.read_keys(file)
    job = Composed(dict(keys), gpus=gpus)
    for key, value in local_paths(keys, file).items():
        job.put(key, value, "path: made absolute, the job runs elsewhere")
    known = user_config.known_keys(user_config.make_parser())
    launcher = user_config.accelerate_keys()
    for key in [key for key in keys if key not in known]:
        if key in launcher or user_config.trl_launcher_key(key, keys[key], file=file):
            job.put(key, None, "devices: rlscale lays out the job's processes")
    if not gpus:
        job.put("use_cpu", True, "devices: a CPU job")
        job.put("bf16", False, "devices: a CPU job")
        for key in ("fp16", "use_vllm"):
            if keys.get(key):
                job.put(key, False, "devices: a CPU job")
    from rlscale.runner.rl.policy import TINY, model_path  # torch: TRL's parser has loaded it already

    model = job.keys.get("model_name_or_path")
    if not model:
        job.put("model_name_or_path", model_path(recipe.model), "model: the study's recipe.model")
    elif model == TINY:
        job.put("model_name_or_path", model_path(TINY), "model: tiny, the policy rlscale ships")
    user_updates = updates_per_generated_batch(job.keys)
    for change in plan.changes(recipe):
        job.put(change.key, change.after, change.why)
    _check_micro_batches(job, recipe, file)
    updates = _updates(job, file)
    if updates != user_updates:  # the generation batch moved: scale the accumulation so updates per batch stay
        config = job.parsed[1]
        micro = config.steps_per_generation * config.num_iterations
        if user_updates < 1 or micro % user_updates:
            raise UserError(
                f"a generated batch of {config.generation_batch_size} completions cannot keep "
                f"{user_updates} update(s) of equal size",
                file=file,
                field="per_device_train_batch_size",
            )
        job.put(
            "gradient_accumulation_steps",
            int(micro // user_updates),
            f"axis {plan.changed.get('generation_batch_size', 'batch')}: {user_updates:g} update(s) per "
            "generated batch, as in your config",
        )
        updates = int(user_updates)
    _run_keys(job, recipe, run_dir=run_dir, run_key=run_key, until_step=until_step, updates=updates, fresh=fresh)
    _schedule(job, recipe, updates=updates, study_steps=plan.lr_decay_steps)
    for key, value in trackers.tracker_keys(keys.get("report_to"), study=plan.study).items():
        job.put(key, value, "trackers: runs grouped by study")
    job.updates = _updates(job, file)  # the final keys, parsed as the job will
    assert job.updates == updates, "the run's keys changed the updates per generated batch"
    job.batch = job.parsed[1].generation_batch_size
    _check_geometry(job.parsed[1], recipe, plan, file)
    job.env = _env(job, plan, user_env, run_key=run_key, fresh=fresh)
    return job


_CPU_CHECK = {"use_cpu": True, "bf16": False, "fp16": False}


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _schedule(job: Composed, recipe, *, updates: int, study_steps: int | None) -> None:
    steps = schedule.decay_steps(recipe, study_steps)
    warmup = job.keys.get("warmup_steps")
    if isinstance(warmup, float) and 0 < warmup < 1:  # TRL takes it of max_steps, the segment's end
        why = schedule.warmup_reason(warmup, steps, study_steps=study_steps)
        job.put("warmup_steps", schedule.warmup_steps(warmup, steps * updates), why)
    name = _schedule_name(job.parsed[1])
    if not decays(name):
        return
    job.lr_decay_updates = steps * updates
    if job.lr_decay_updates != job.keys["max_steps"]:  # TRL would fit the schedule to max_steps
        why = schedule.reason(name, steps, study_steps=study_steps)
        before = job.keys.get("lr_scheduler_type")
        job.keys["lr_scheduler_type"] = name  # the job's YAML names the schedule it trains, TRL's default too
        job.changes.append(Change("lr_scheduler_type", before, name, why))


def _schedule_name(config) -> str:
    return str(getattr(config.lr_scheduler_type, "value", config.lr_scheduler_type))


def decays(name: str) -> bool:
    """Whether transformers' schedule `name` depends on the run's length (its function takes num_training_steps)."""
    from transformers.optimization import TYPE_TO_SCHEDULER_FUNCTION
    from transformers.trainer_utils import SchedulerType

    function = TYPE_TO_SCHEDULER_FUNCTION[SchedulerType(name)]
    return "num_training_steps" in inspect.signature(function).parameters


def _updates(job: Composed, file: str) -> int:
    # a GPU job parses as a CPU job's where this process has no GPU (TRL refuses bf16 without one)
    job.parsed = user_config.parse({**job.keys, **(_CPU_CHECK if job.gpus and not _cuda() else {})}, file=file)
    try:
        return user_config.updates_per_generation(job.parsed[1])
    except UserError as err:
        raise UserError(err.detail, file=file, field=err.field) from None


def _check_micro_batches(job: Composed, recipe, file: str) -> None:
    batch = job.keys.get("generation_batch_size")
    per_device = job.keys.get("per_device_train_batch_size", TRL_DEFAULTS["per_device_train_batch_size"])
    processes = recipe.trainer_devices if job.gpus else 1
    if batch and isinstance(per_device, int) and per_device > 0 and batch % (per_device * processes):
        raise UserError(
            f"{per_device} x {processes} process(es) does not divide the study's generation batch of {batch} "
            f"completions (B_p {recipe.prompts_per_batch} x n {recipe.rollouts}); give a micro-batch that divides "
            "every point's generation batch",
            file=file,
            field="per_device_train_batch_size",
        )


def _check_geometry(config, recipe, plan, file: str) -> None:
    for key, trained, planned, field_ in (
        ("num_generations", config.num_generations, recipe.rollouts, "rollouts"),
        ("generation_batch_size", config.generation_batch_size, recipe.total_batch, "prompts_per_batch x rollouts"),
    ):
        if trained != planned and key not in plan.keep:
            raise UserError(
                f"TRL would train {trained}, the study plans {planned} (recipe {field_}); give it in one place: "
                "this file or the study",
                file=file,
                field=key,
            )


def _run_keys(job: Composed, recipe, *, run_dir, run_key: str, until_step: int, updates: int, fresh: bool) -> None:
    job.put("max_steps", until_step * updates, "compute stop: the segment's last step")
    job.put("output_dir", str(run_dir.checkpoints), "checkpoints")
    job.put("save_strategy", "steps", "checkpoints")
    job.put("save_steps", recipe.checkpoint_every * updates, "checkpoints: the study's checkpoint_every")
    job.put("save_total_limit", CHECKPOINTS_KEPT, "checkpoints: the newest and one to fall back on")
    if job.keys.get("save_only_model"):
        job.put("save_only_model", False, "checkpoints: a resume needs the optimizer")
    job.put("resume_from_checkpoint", None, "checkpoints: rlscale resumes the run")
    job.put("logging_steps", 1, "records: a log line per update")
    job.put("disable_tqdm", True, "job log")
    job.put("seed", recipe.seed, "seed")
    job.put("run_name", run_key, "run name")
    job.put("eval_strategy", "no", "eval cadence: the study's eval steps")
    job.put("eval_on_start", fresh, "eval cadence: the reward before training (first segment)")
    if job.keys.get("load_best_model_at_end"):
        job.put("load_best_model_at_end", False, "eval cadence: the study's eval steps")
    if job.keys.get("num_generations_eval") is None:
        job.put("num_generations_eval", recipe.eval_samples, "eval: the study's eval_samples per held-out prompt")
    per_prompt = job.keys["num_generations_eval"]
    eval_batch = job.keys.get("per_device_eval_batch_size", 8)
    if eval_batch % per_prompt:
        job.put(
            "per_device_eval_batch_size",
            per_prompt * math.ceil(eval_batch / per_prompt),
            "eval: a whole number of prompts per batch",
        )


def _env(job: Composed, plan, user_env: dict, *, run_key: str, fresh: bool) -> dict:
    given = {**forwarded_env(dict(os.environ)), **user_env}
    backends = trackers.env_backends(job.keys.get("report_to"))
    env = tracker_env(backends, study=plan.study, run_key=run_key, env=given, params_logged=not fresh)
    for key, value in env.items():
        if given.get(key) != value:
            job.changes.append(Change(f"env.{key}", given.get(key), value, ENV_REASONS.get(key, "trackers")))
    return env


def check_inputs(job: Composed, *, file: str, eval_prompts: int, python: str) -> list[str]:
    """The user's files the job reads (config, data, reward modules), once preflight.py passes under the job's
    interpreter `python`; UserError (file and field) for a problem or an interpreter that cannot run the check."""
    keys = {**job.keys, **(_CPU_CHECK if job.gpus and not _cuda() else {})}  # as _updates parses a GPU job's
    request = {"keys": keys, "file": file, "import_paths": import_paths(file), "eval_prompts": eval_prompts}
    try:
        done = subprocess.run(
            [python, "-m", "rlscale.runner.trl.preflight"],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=PREFLIGHT_SECONDS,
            env={**os.environ, **job.env},
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise UserError(f"the job's interpreter {python} could not run the checks ({err})", field="python") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise UserError(f"the job's interpreter {python} could not run the checks ({last})", field="python")
    answer = json.loads(lines[-1])
    if "error" in answer:
        error = answer["error"]
        raise UserError(error["message"], file=error["file"], field=error["field"])
    return answer["files"]


def import_paths(file: str, launch_dir: str | None = None) -> list[str]:
    """Where dotted reward paths are imported from and relative data paths found: where the sweep runs (as `trl grpo`:
    `launch_dir`, or this process's directory), then the config's folder."""
    return list(dict.fromkeys([launch_dir or str(Path.cwd()), str(Path(file).resolve().parent)]))


def local_paths(keys: dict, file: str, launch_dir: str | None = None) -> dict:
    """The config `file`'s path keys that name local files, made absolute as a job (or an export) needs them."""
    return user_config.local_paths(keys, [Path(folder) for folder in import_paths(file, launch_dir)])
