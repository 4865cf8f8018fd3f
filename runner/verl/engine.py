"""The `verl` engine: a run is a chain of verl jobs (`python3 -m verl.trainer.main_ppo`) on Ray, via the Jobs API.
A job pauses a run at a rung by ending there (verl checkpoints its last step); the next resumes (resume_mode=auto)."""

import shutil
import threading
from importlib.util import find_spec
from pathlib import Path

from rlscale.planner.frameworks.setup import setup_files
from rlscale.runner.jobs_api import JobFailed, JobsApiEngine, RunDir, Submission
from rlscale.runner.tracking import mlflow_segment_run

from rlscale.base.errors import UserError

from .job import ENTRYPOINT, REWARD_IMPORTS, checkpointed_step, job_devices, make_job, val_reward_metric
from .logs import ANY_SOURCE, ValReward, line_reader, reward_metrics
from .setup import mlflow_segments

# verl 0.9.1's start error when the cluster lacks its pools' GPUs (ppo/ray_trainer.py, _check_resource_available)
GPUS_TAKEN = "Total available GPUs"


class VerlJobFailed(JobFailed):
    """A verl job ended FAILED or STOPPED by someone else; the message carries the Jobs API's reason and log tail."""


class VerlEngine(JobsApiEngine):
    """Runs each segment of a run as a verl job (JobsApiEngine). module: what the job runs (verl.trainer.main_ppo);
    gpus_per_node: the nodes' GPUs, which lay a run's pools out."""

    name = "verl"
    failure = VerlJobFailed

    def __init__(
        self,
        *,
        module: str = ENTRYPOINT,
        gpus_per_node: int = 8,
        poll_seconds: float = 5.0,
        **options,
    ):
        super().__init__(poll_seconds=poll_seconds, **options)
        self.module, self.gpus_per_node = module, gpus_per_node
        self._facts, self._facts_lock = None, threading.Lock()

    def verl_job(self, recipe, run_dir: RunDir, submission_id: str, *, until_step: int):
        """The verl job of one segment (rlscale.runner.verl.job.Job: its overrides, environment and paths)."""
        return self._job(recipe, run_dir, submission_id, until_step=until_step)[0]

    def _job(self, recipe, run_dir: RunDir, submission_id: str, *, until_step: int):
        layout = {"python": self.python, "module": self.module, "gpus_per_node": self.gpus_per_node}
        if self.setup is not None:
            from .setup import make_setup_job, user_config_keys

            job, made = make_setup_job(
                self.setup,
                recipe,
                run_dir,
                submission_id,
                until_step=until_step,
                env_vars=self.env_vars,
                config_keys=user_config_keys(self.setup.setup)[1],
                **layout,
            )
            return job, made.changes, list(made.notes)
        job = make_job(
            recipe,
            run_dir,
            submission_id,
            until_step=until_step,
            env_vars=self.env_vars,
            max_prompt_tokens=self.max_prompt_tokens,
            **layout,
        )
        return job, [], []

    def setup_facts(self):
        """The user's data and reward checked once per engine (SetupFacts; None: no setup); UserError on bad input."""
        if self.setup is None:
            return None
        with self._facts_lock:
            if self._facts is None:
                from .checks import check_setup
                from .setup import live_keys

                user = self.setup.setup
                mine = user.files()  # a key none of them sets is named against the user's first file
                self._facts = check_setup(*live_keys(user), study_file=mine[0] if mine else None)
            return self._facts

    def val_reward(self, recipe) -> ValReward:
        """The logged verl metric that is the study's val reward: the study's setup.reward_metric; else verl's
        validation reward of the run's data source (the validation files' one source, else the mean over them)."""
        if self.setup is None:
            return val_reward_metric(recipe)
        if self.setup.reward_metric:
            return ValReward((self.setup.reward_metric,))
        from .setup import val_samples

        sources = self.setup_facts().val_sources
        source = sources[0] if sources and len(sources) == 1 else ANY_SOURCE
        return reward_metrics(source, val_samples(self.setup.setup))

    def submission(self, recipe, run_dir: RunDir, submission_id: str, *, until_step: int) -> Submission:
        """The segment's verl job, holding no Ray resources: verl's placement groups hold (and check) the GPUs."""
        job = self.verl_job(recipe, run_dir, submission_id, until_step=until_step)
        # the user's setup brings its own reward; rlscale's task ships its reward module
        modules = {} if self.setup is not None else {"py_modules": [str(run_dir.modules)]}
        env = dict(job.env_vars)
        if self.setup is not None and mlflow_segments(self.setup.setup, env):
            with self._tracker_lock:  # the segment's own MLflow run, nested under the run's (dry-runs never reach it)
                env["MLFLOW_RUN_ID"] = mlflow_segment_run(
                    env, study=self.setup.study, run_key=run_dir.root.name, run_dir=run_dir.root, until_step=until_step
                )
        return Submission(
            submission_id=submission_id,
            entrypoint=job.entrypoint,
            devices=job.gpus,
            until_step=until_step,
            runtime_env={"env_vars": env, **modules},
            resources={"entrypoint_num_cpus": 0},
        )

    def prepare(self, recipe, run_dir: RunDir, job: Submission) -> None:
        """The run's parquet files (once) and reward package (py_modules); a user's setup keeps its data and reward."""
        from .data import write_task_parquet

        (run_dir.root / "logs").mkdir(parents=True, exist_ok=True)
        if self.setup is not None:
            return
        if not (run_dir.data / "val.parquet").exists():
            write_task_parquet(recipe, run_dir.data)
        stage_reward_modules(run_dir.modules)

    def line_reader(self, recipe):
        return line_reader(self.val_reward(recipe))

    def checkpointed_step(self, recipe, run_dir: RunDir) -> int:
        return checkpointed_step(run_dir)

    def devices_taken(self, logs: str, last_step: int | None) -> str | None:
        """verl's start-up check failing (only before the job's first step)."""
        return _line_with(logs, GPUS_TAKEN) if GPUS_TAKEN in logs and last_step is None else None

    def dry_run_job(self, recipe, run_dir: RunDir, submission_id: str, *, until_step: int) -> dict:
        """A verl job as the dry-run shows it (entrypoint, overrides, env, data, GPUs, val reward metric; with a setup
        also setup_files, changes and notes). UserError on bad data, reward or layout."""
        facts = self.setup_facts()
        job, changes, left_out = self._job(recipe, run_dir, submission_id, until_step=until_step)
        out = {
            "entrypoint": f"{self.python} -m {self.module}",
            "overrides": job.overrides,
            "env_vars": job.env_vars,
            "train_file": _shown(job.train_file),
            "val_file": _shown(job.val_file),
            "gpus": job.gpus,
            "reward_metric": list(self.val_reward(recipe).names),
        }
        if facts is not None:
            from .checks import TRAIN_FILES, check_batch

            check_batch(facts, recipe, self.setup.setup.source.get(TRAIN_FILES))
            out.update(
                setup_files=setup_files(self.setup.setup),
                changes=[change.to_dict() for change in changes],
                notes=[*facts.notes, *left_out],
            )
        return out

    def rehearse(self, points: list[dict], *, study_file: str | None = None) -> None:
        """Compose and check each point's first job in verl's environment (compose.py), adding `composed` and notes to
        each point. UserError with every problem at once: a key verl's config lacks, or verl's reason per refusal."""
        from rlscale.planner.frameworks.setup import one_error

        from .compose import compose
        from .setup import refused

        if not points:
            return
        version, results = compose([point["overrides"] for point in points])
        problems, refusals = [], {}
        for point, composed in zip(points, results):
            if composed.ok:
                point["composed"] = {"framework": "verl", "version": version, "config": composed.config}
                point["notes"] = [*point.get("notes", []), *composed.notes]
            elif composed.missing:
                why = {change["key"]: change["why"] for change in point.get("changes", [])}
                problems.append(refused(self.setup, composed, version, study_file=study_file, why=why))
            else:
                axes = ", ".join(
                    f"{c['key']}={c['after']}" for c in point.get("changes", []) if c["why"].startswith("axis")
                )
                refusals.setdefault(composed.error, []).append(f"{point['run']} ({axes})" if axes else point["run"])
        if refusals and self.setup is not None:  # the user's own command, checked alike: is the refusal theirs?
            from .setup import user_command

            user = self.setup.setup
            _, (own,) = compose([user_command(user)])
            if not own.ok and own.error in refusals:
                mine = user.files()
                why = f"verl {version} refuses your own command at its start, before rlscale changes a key: {own.error}"
                problems.append(UserError(why, file=mine[0] if mine else study_file))
                refusals.pop(own.error)
        for error, runs in refusals.items():
            problems.append(
                UserError(f"verl {version} refuses run {'; '.join(runs)} at its start: {error}", file=study_file)
            )
        if problems:
            raise one_error(problems)

    def devices(self, recipe) -> list[dict[str, float]]:
        """verl's pools, a bundle per node: the trainer's (rollouts share it), plus `async: pipeline`'s rollout pool."""
        return [{"GPU": float(gpus)} for gpus in job_devices(recipe, self.gpus_per_node)]


def stage_reward_modules(target: Path) -> Path:
    """Copy the modules rlscale's reward function imports into `target` (a package directory named rlscale), so the
    job's runtime env (py_modules) makes `rlscale.runner.verl.reward` importable on nodes without rlscale."""
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    for name in REWARD_IMPORTS:
        origin = Path(find_spec(name).origin)
        relative = Path(*name.split(".")[1:])
        package = origin.name == "__init__.py"
        destination = staging / (relative / "__init__.py" if package else relative.with_suffix(".py"))
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(origin, destination)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def _shown(files) -> str:
    return ", ".join(map(str, files)) if isinstance(files, list | tuple) else str(files)


def _line_with(text: str, needle: str) -> str:
    return next((line.strip() for line in reversed(text.splitlines()) if needle in line), needle)[:200]
