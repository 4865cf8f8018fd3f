"""One TRL job of a run (a *segment*: from the run's last checkpoint up to a step): its GRPOConfig (or a setup
study's config), its spec file, its entrypoint, and where its checkpoints and records live. Only write_spec writes."""

import json
import shlex
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

import yaml
from rlscale.planner.frameworks.common import Deployment, Mapping, updates_per_batch
from rlscale.planner.frameworks.trl import VERSION, trl_mapping
from rlscale.runner.jobs_api import RunDir

from rlscale.base.errors import UserError
from rlscale.base.files import write_whole

ENTRYPOINT = "rlscale.runner.trl.train"
CHECKPOINT_PREFIX = "checkpoint-"  # TRL's (transformers.Trainer's) checkpoint directories: checkpoint-<global step>
TRAINER_STATE = "trainer_state.json"  # written last into a checkpoint: its presence means the checkpoint is whole
DEVICES_TAKEN = "rlscale-trl: devices unavailable"  # the job's stderr line when the GPUs it was given are not there
DEFAULT_REWARD_METRIC = "eval_reward"  # a setup study's reward: TRL's weighted reward on the held-out split


# checkpoints a run keeps: the newest and one to fall back on (as the builtin engine's); every one kept filled a disk
CHECKPOINTS_KEPT = 2


def last_checkpoint(run_dir: RunDir) -> Path | None:
    """The run's newest whole TRL checkpoint directory (None if there is none)."""
    whole = [
        (int(path.name[len(CHECKPOINT_PREFIX) :]), path)
        for path in run_dir.checkpoints.glob(f"{CHECKPOINT_PREFIX}*")
        if path.name[len(CHECKPOINT_PREFIX) :].isdigit() and (path / TRAINER_STATE).is_file()
    ]
    return max(whole)[1] if whole else None


def checkpointed_step(recipe, run_dir: RunDir, updates: int | None = None) -> int:
    """The rlscale step of the last checkpoint (0: none); TRL counts updates: `updates` (else the recipe's) per step."""
    last = last_checkpoint(run_dir)
    return int(last.name[len(CHECKPOINT_PREFIX) :]) // (updates or updates_per_batch(recipe)) if last else 0


@dataclass(frozen=True)
class Job:
    """One submission: what `rlscale sweep --dry-run` prints and what the engine submits."""

    submission_id: str
    entrypoint: str
    deployment: Deployment
    mapping: Mapping
    config: dict  # GRPOConfig keyword arguments: the mapping's keys, then the run's
    run_keys: dict
    spec_file: Path
    log_file: Path
    until_step: int
    devices: int
    gpus: bool

    def spec(self, recipe) -> dict:
        """What the job reads (train.py): the recipe, its GRPOConfig, where to stop and where to write records."""
        return {
            "recipe": recipe.to_json(),
            "config": self.config,
            "until_step": self.until_step,
            "log_file": str(self.log_file),
            "devices": self.devices,
            "gpus": self.gpus,
        }


def check_recipe(recipe) -> None:
    """UserError (naming the field) for a recipe whose loss TRL trains differently, not just more coarsely."""
    low, _high = recipe.clip_range
    if recipe.loss == "cispo" and low < 1:
        raise UserError(
            f"engine: trl: TRL {VERSION}'s CISPO clamps its weight from above only; expected clip_low: 1 "
            f"(no lower truncation), got {low:g}",
            field="clip_low",
        )


def require_trl() -> None:
    """UserError naming the package when this interpreter has no TRL (the job runs GRPOTrainer from it)."""
    if find_spec("trl") is None:
        raise UserError(f"engine: trl needs the package trl=={VERSION} (pip install 'rlscale[runner]')", field="engine")


def deployment(recipe, *, gpus: bool, micro_batch: int, max_prompt_tokens: int) -> Deployment:
    """One node: on GPUs a process per trainer device, vLLM colocated; on CPU one process, transformers' generate."""
    return Deployment(
        gpus_per_node=recipe.trainer_devices if gpus else 1,
        nodes=1,
        max_prompt_tokens=max_prompt_tokens,
        micro_batch_per_gpu=micro_batch,
        cpu=not gpus,
    )


def run_keys(recipe, run_dir: RunDir, until_step: int | None = None) -> dict:
    """The GRPOConfig keys owned by the run, not the recipe: the segment's last step, checkpoints every
    checkpoint_every steps (the newest CHECKPOINTS_KEPT), a log line per optimizer update, no trackers."""
    return {
        "max_steps": (until_step or recipe.steps) * updates_per_batch(recipe),
        "output_dir": str(run_dir.checkpoints),
        "save_strategy": "steps",
        "save_steps": recipe.checkpoint_every * updates_per_batch(recipe),
        "save_total_limit": CHECKPOINTS_KEPT,
        "logging_steps": 1,
        "report_to": "none",
        "disable_tqdm": True,
    }


def make_job(
    recipe,
    run_dir: RunDir,
    submission_id: str,
    *,
    until_step: int,
    python: str,
    gpus: bool = False,
    micro_batch: int = 64,
    max_prompt_tokens: int = 64,
) -> Job:
    """The job of one segment: `python -m rlscale.runner.trl.train SPEC` (on several GPUs, under accelerate launch)."""
    check_recipe(recipe)
    layout = deployment(recipe, gpus=gpus, micro_batch=micro_batch, max_prompt_tokens=max_prompt_tokens)
    mapping = trl_mapping(recipe, layout)
    keys = run_keys(recipe, run_dir, until_step)
    spec = run_dir.spec(submission_id)
    return Job(
        submission_id=submission_id,
        entrypoint=entrypoint(python, spec, processes=layout.gpus if gpus else 1),
        deployment=layout,
        mapping=mapping,
        config={**mapping.keys(), **keys},
        run_keys=keys,
        spec_file=spec,
        log_file=run_dir.log(submission_id),
        until_step=until_step,
        devices=recipe.trainer_devices,
        gpus=gpus,
    )


def entrypoint(python: str, spec: Path, *, processes: int) -> str:
    """`python -m rlscale.runner.trl.train SPEC`, under accelerate launch on several processes."""
    launcher = (
        [python, "-m", "accelerate.commands.launch", "--num_processes", str(processes)] if processes > 1 else [python]
    )
    return " ".join(shlex.quote(word) for word in [*launcher, "-m", ENTRYPOINT, str(spec)])


@dataclass(frozen=True)
class SetupJob:
    """One submission of a study that starts from the user's `trl grpo` YAML: `composed` is its config (the user's
    keys with rlscale's changes, setup.py), written to config_file for the job to read with TRL's parser."""

    submission_id: str
    entrypoint: str
    composed: object  # rlscale.runner.trl.setup.Composed
    spec_file: Path
    config_file: Path
    log_file: Path
    until_step: int
    devices: int
    gpus: bool
    reward_metric: str
    import_paths: list

    @property
    def config(self) -> dict:
        return self.composed.keys

    def spec(self, recipe) -> dict:
        """What the job reads (setup_train.py): the recipe, the config file, where to stop and write records."""
        return {
            "recipe": recipe.to_json(),
            "until_step": self.until_step,
            "log_file": str(self.log_file),
            "devices": self.devices,
            "gpus": self.gpus,
            "use_vllm": bool(self.config.get("use_vllm")),
            "setup": {
                "config_file": str(self.config_file),
                "updates": self.composed.updates,
                "lr_decay_updates": self.composed.lr_decay_updates,
                "reward_metric": self.reward_metric,
                "eval_prompts": recipe.eval_prompts,
                "import_paths": self.import_paths,
            },
        }


def make_setup_job(
    plan, recipe, run_dir: RunDir, submission_id: str, *, until_step: int, python: str, gpus: bool = False
) -> SetupJob:
    """A setup study's segment job (plan: its SetupPlan); UserError naming the user's file and key TRL refuses."""
    from .setup import compose, import_paths

    check_recipe(recipe)
    composed = compose(
        plan,
        recipe,
        run_dir=run_dir,
        run_key=run_dir.root.name,
        until_step=until_step,
        fresh=last_checkpoint(run_dir) is None,
        gpus=gpus,
    )
    spec = run_dir.spec(submission_id)
    return SetupJob(
        submission_id=submission_id,
        entrypoint=entrypoint(python, spec, processes=recipe.trainer_devices if gpus else 1),
        composed=composed,
        spec_file=spec,
        config_file=spec.with_suffix(".yaml"),
        log_file=run_dir.log(submission_id),
        until_step=until_step,
        devices=recipe.trainer_devices,
        gpus=gpus,
        reward_metric=plan.reward_metric or DEFAULT_REWARD_METRIC,
        import_paths=import_paths(plan.setup.config_file),
    )


def write_spec(job: Job | SetupJob, recipe) -> Path:
    """Write the job's spec file (and a setup job's config) whole: a reader never sees half of it."""
    job.log_file.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(job, SetupJob):
        write_whole(job.config_file, yaml.safe_dump(job.config, sort_keys=False))
    return write_whole(job.spec_file, json.dumps(job.spec(recipe), indent=1))
