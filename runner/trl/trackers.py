"""The user's trackers (GRPOConfig.report_to) for a study's runs: grouped by study, named by run, a run's segments
continuing one tracker run; set through the job's env and GRPOConfig keys, never the driver's environment."""

import json
from pathlib import Path

from rlscale.runner.jobs_api import write_whole
from rlscale.runner.tracking import tracker_run_id, tracker_tags

TRACKER_PREFIXES = ("MLFLOW_", "WANDB_", "TRACKIO_")
SECRET_WORDS = ("KEY", "TOKEN", "PASSWORD", "SECRET")
# why each variable is set, as the dry-run lists it
ENV_REASONS = {
    "MLFLOW_EXPERIMENT_NAME": "trackers: runs grouped by study",
    "MLFLOW_TRACKING_URI": "trackers: the MLflow store as the sweep sees it",
    "MLFLOW_MAX_LOG_PARAMS": "trackers: the first segment logged the params",
    "WANDB_PROJECT": "trackers: runs grouped by study",
    "WANDB_RUN_GROUP": "trackers: runs grouped by study",
    "WANDB_RUN_ID": "trackers: a run's segments continue one W&B run",
    "WANDB_RESUME": "trackers: a run's segments continue one W&B run",
}
RUNS_FILE = "tracker_runs.json"  # in the run's directory: {"mlflow_run_id": ...}, written by its first segment


def trackers(report_to) -> set[str]:
    """The tracker names of a report_to value ("all" stands for every installed one)."""
    if report_to in (None, "none"):
        return set()
    names = {report_to} if isinstance(report_to, str) else set(report_to)
    return names - {"none"}


def uses(report_to, tracker: str) -> bool:
    names = trackers(report_to)
    return tracker in names or "all" in names


def forwarded_env(environ: dict) -> dict[str, str]:
    """The sweep's tracker variables a job gets (credentials left to the cluster)."""
    return {
        key: value
        for key, value in environ.items()
        if key.startswith(TRACKER_PREFIXES) and not any(word in key for word in SECRET_WORDS)
    }


def tracker_env(report_to, *, study: str, run_key: str, env: dict, fresh: bool) -> dict[str, str]:
    """`env` (the sweep's tracker variables, then the config's `env:` block) with the grouping, naming and resuming
    variables of the trackers in report_to; `fresh`: the run's first segment."""
    env = dict(env)
    if uses(report_to, "mlflow"):
        env["MLFLOW_EXPERIMENT_NAME"] = study
        env["MLFLOW_TRACKING_URI"] = absolute_uri(env.get("MLFLOW_TRACKING_URI") or _mlflow_default())
        if not fresh:
            env.setdefault("MLFLOW_MAX_LOG_PARAMS", "0")  # logged by the first segment; MLflow refuses changed ones
    if uses(report_to, "wandb"):
        env.setdefault("WANDB_PROJECT", study)
        env["WANDB_RUN_GROUP"] = study
        env["WANDB_RUN_ID"] = tracker_run_id(run_key)
        env.setdefault("WANDB_RESUME", "allow")
    return env


def tracker_keys(report_to, *, study: str) -> dict:
    """GRPOConfig keys that group the runs: trackio's project."""
    return {"project": study} if uses(report_to, "trackio") else {}


def absolute_uri(uri: str) -> str:
    """A local tracking URI (sqlite:///relative.db, a bare path) made absolute from here: the job runs elsewhere."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str(Path(uri[len("sqlite:///") :]).resolve())
    if "://" not in uri and not uri.startswith("/"):
        return str(Path(uri.removeprefix("file:")).resolve())
    return uri


def _mlflow_default() -> str:
    import mlflow

    return mlflow.get_tracking_uri()


def mlflow_run(env: dict, *, study: str, run_key: str, run_dir: Path) -> str:
    """The id of the rlscale run's MLflow run (in experiment `study` at env's MLFLOW_TRACKING_URI), created on first
    use and kept in the run's directory. Not thread-safe: one caller at a time."""
    runs = _runs(run_dir)
    if runs.get("mlflow_run_id"):
        return runs["mlflow_run_id"]
    from mlflow import MlflowClient

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name(study)
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(study)
    run = client.create_run(experiment_id, run_name=run_key, tags=tracker_tags(study, run_key))
    write_whole(run_dir / RUNS_FILE, json.dumps({**runs, "mlflow_run_id": run.info.run_id}))
    return run.info.run_id


def _runs(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / RUNS_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
