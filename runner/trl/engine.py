"""The `trl` engine: a run is a chain of TRL GRPOTrainer jobs (`python -m rlscale.runner.trl.train SPEC`) on Ray, via
the Jobs API, with exactly the GRPOConfig `rlscale export --format trl` writes (or the user's own YAML: setup.py)."""

import json
import sys
import threading

from rlscale.runner.jobs_api import JobFailed, JobsApiEngine, RunDir, Submission
from rlscale.runner.tracking import mlflow_run

from .job import DEVICES_TAKEN, SetupJob, checkpointed_step, make_job, make_setup_job, require_trl, write_spec
from .logs import read_line
from .setup import check_inputs


class TrlJobFailed(JobFailed):
    """A TRL job ended FAILED or STOPPED by someone else; the message carries the Jobs API's reason and log tail."""


def _recipe_key(recipe) -> str:
    return json.dumps(recipe.to_json(), sort_keys=True)


class TrlEngine(JobsApiEngine):
    """Runs each segment as a TRL job (JobsApiEngine). python: the job's interpreter (with rlscale and trl installed);
    gpus: GPUs (vLLM colocate, bf16; untested here), else CPU cores; micro_batch: completions per forward/backward."""

    name = "trl"
    failure = TrlJobFailed

    def __init__(self, *, python: str = sys.executable, gpus: bool = False, micro_batch: int = 64, **options):
        super().__init__(python=python, **options)
        self.gpus, self.micro_batch = gpus, micro_batch
        self._shapes: dict[str, tuple[int, int]] = {}  # a setup study's recipe -> (updates, completions) per step
        self._checked: dict[str, list[str]] = {}  # a setup study's config file -> the user's files, checked
        self._setup_lock = threading.Lock()  # guards _shapes and _checked, and the user's code while it is checked

    def devices(self, recipe) -> list[dict[str, float]]:
        """One node: the trainer's devices as GPUs (generation colocated), or as CPU cores."""
        return [{"GPU" if self.gpus else "CPU": float(recipe.trainer_devices)}]

    def trl_job(self, recipe, run_dir: RunDir, submission_id: str, *, until_step: int):
        """The TRL job of one segment (a SetupJob for a setup study, its inputs checked once); UserError for a recipe
        or config TRL cannot train, or no TRL in this interpreter when the job would run on it."""
        if self.python == sys.executable or self.setup is not None:
            require_trl()
        if self.setup is None:
            sizes = {"micro_batch": self.micro_batch, "max_prompt_tokens": self.max_prompt_tokens}
            return make_job(
                recipe, run_dir, submission_id, until_step=until_step, python=self.python, gpus=self.gpus, **sizes
            )
        with self._setup_lock:  # one thread at a time parses, imports the user's rewards, reads the data
            job = make_setup_job(
                self.setup, recipe, run_dir, submission_id, until_step=until_step, python=self.python, gpus=self.gpus
            )
            self._shapes[_recipe_key(recipe)] = (job.composed.updates, job.composed.batch)
            if self.setup.setup.config_file not in self._checked:
                self._checked[self.setup.setup.config_file] = check_inputs(
                    job.composed,
                    file=self.setup.setup.config_file,
                    eval_prompts=recipe.eval_prompts,
                    python=self.python,
                )
        return job

    def _shape(self, recipe) -> tuple[int | None, int | None]:
        if self.setup is None:
            return None, None
        with self._setup_lock:
            shape = self._shapes.get(_recipe_key(recipe))
        if shape is None:
            job = self.trl_job(recipe, RunDir(self.shared_dir / "RUN_KEY"), "RUN_KEY-1", until_step=recipe.steps)
            shape = job.composed.updates, job.composed.batch
        return shape

    def submission(self, recipe, run_dir: RunDir, submission_id: str, *, until_step: int) -> Submission:
        """The job, holding its devices as Ray resources (GPUs, or CPU cores with as many OpenMP threads); a setup job
        gets its tracker and `env:` variables and, with MLflow, its MLflow run made here (dry-runs never reach it)."""
        job = self.trl_job(recipe, run_dir, submission_id, until_step=until_step)
        env = dict(self.env_vars)
        if isinstance(job, SetupJob):
            env.update(job.composed.env)
            if "MLFLOW_EXPERIMENT_NAME" in env:  # the sweep creates the MLflow run, every segment continues it
                with self._tracker_lock:
                    env["MLFLOW_RUN_ID"] = mlflow_run(
                        env, study=self.setup.study, run_key=run_dir.root.name, run_dir=run_dir.root
                    )
        if not job.gpus:
            env.setdefault("OMP_NUM_THREADS", str(job.devices))
        resources = {"entrypoint_num_gpus": job.devices} if job.gpus else {"entrypoint_num_cpus": job.devices}
        return Submission(
            submission_id=submission_id,
            entrypoint=job.entrypoint,
            devices=job.devices,
            until_step=until_step,
            runtime_env={"env_vars": env},
            resources=resources,
        )

    def prepare(self, recipe, run_dir: RunDir, job: Submission) -> None:
        write_spec(self.trl_job(recipe, run_dir, job.submission_id, until_step=job.until_step), recipe)

    def line_reader(self, recipe):
        return read_line

    def rollouts_per_step(self, recipe) -> int:
        """Completions a step generates: a setup study's generation batch, else B_p x n."""
        return self._shape(recipe)[1] or recipe.total_batch

    def checkpointed_step(self, recipe, run_dir: RunDir) -> int:
        return checkpointed_step(recipe, run_dir, self._shape(recipe)[0])

    def devices_taken(self, logs: str, last_step: int | None) -> str | None:
        return DEVICES_TAKEN if DEVICES_TAKEN in logs else None

    def dry_run_job(self, recipe, run_dir: RunDir, submission_id: str, *, until_step: int) -> dict:
        """A TRL job as the dry-run shows it: entrypoint, devices and GRPOConfig as `rlscale export --format trl`
        renders it (with nearest-form and not-expressible notes); a setup study's job: _setup_dry_run."""
        from rlscale.planner.frameworks.trl import render

        job = self.trl_job(recipe, run_dir, submission_id, until_step=until_step)
        if isinstance(job, SetupJob):
            return self._setup_dry_run(job, recipe)
        return {
            **self._shown(job, recipe),
            "nearest": job.mapping.nearest,
            "not_expressible": job.mapping.missing,
            "config_text": render(
                recipe, job.deployment, [f"rlscale sweep --dry-run: job {job.submission_id}"], run_keys=job.run_keys
            ),
        }

    def _shown(self, job, recipe) -> dict:
        return {"entrypoint": job.entrypoint, "devices": self.devices(recipe), "config": job.config}

    def _setup_dry_run(self, job, recipe) -> dict:
        import yaml

        header = [
            f"# rlscale sweep --dry-run: job {job.submission_id}, the config it reads: "
            f"{self.setup.setup.config_file} with rlscale's changes"
        ]
        with self._setup_lock:
            files = self._checked[self.setup.setup.config_file]
        return {
            **self._shown(job, recipe),
            "env_vars": job.composed.env,
            "setup_files": files,
            "changes": [change.to_dict() for change in job.composed.changes],
            "nearest": [],
            "not_expressible": [],
            "config_text": "\n".join(header) + "\n" + yaml.safe_dump(job.config, sort_keys=False, allow_unicode=True),
        }
