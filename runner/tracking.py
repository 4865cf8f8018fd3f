"""A run's one identity in the user's trackers on every engine (ids, tags, a job's tracker env); a study's `tracking:`
key mirrors each stored evaluation to its tracker, a group per study and a run per run, one client call at a time."""

import hashlib
import importlib
import json
import os
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from abc import ABC, abstractmethod
from pathlib import Path

from rlscale.base.errors import UserError
from rlscale.base.files import write_whole

# record columns mirrored at each evaluation, under these names
MIRRORED = ("val_reward", "gpu_hours", "rollouts", "tokens")
# a run's identity in every tracker, whichever engine trains it: MLflow tags, and the W&B run id (tracker_run_id)
TAG_STUDY, TAG_RUN_KEY = "rlscale.study", "rlscale.run_key"
RUN_ID_CHARACTERS, RUN_ID_LENGTH = re.compile(r"[^A-Za-z0-9_-]"), 64  # what W&B takes as a run id
TRACKER_PREFIXES = ("MLFLOW_", "WANDB_", "TRACKIO_")
PROBE_TIMEOUT_S = 10.0  # an MLflow server that does not answer /health within this is refused before a sweep
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
# in the run's directory: {"mlflow_run_id": ..., "mlflow_tracking_uri": ...}, written by its first segment
RUNS_FILE = "tracker_runs.json"
# a run's end in the store -> its MLflow run's status (a paused run stays RUNNING: it continues)
MLFLOW_END_STATUS = {"done": "FINISHED", "stopped": "KILLED", "failed": "FAILED"}


def tracker_run_id(run_key: str) -> str:
    """A run's W&B run id (every segment of the run continues it), the same on every engine: its key if W&B takes it,
    else its allowed characters with a hash of the whole key, so two keys never share one."""
    if len(run_key) <= RUN_ID_LENGTH and not RUN_ID_CHARACTERS.search(run_key):
        return run_key
    digest = hashlib.sha256(run_key.encode()).hexdigest()[:10]
    return f"{RUN_ID_CHARACTERS.sub('-', run_key)[: RUN_ID_LENGTH - 11]}-{digest}"


def tracker_tags(study: str, run_key: str) -> dict[str, str]:
    """The tags that find a run again in MLflow, the same on every engine: its study and its key."""
    return {TAG_STUDY: study, TAG_RUN_KEY: run_key}


def forwarded_env(environ: dict) -> dict[str, str]:
    """The sweep's tracker variables a job gets (credentials left to the cluster)."""
    return {
        key: value
        for key, value in environ.items()
        if key.startswith(TRACKER_PREFIXES) and not any(word in key for word in SECRET_WORDS)
    }


def tracker_env(
    backends, *, study: str, run_key: str, env: dict, params_logged: bool = False, default_uri: bool = True
) -> dict[str, str]:
    """`env` with the grouping, naming and resuming variables of the job's trackers among `backends` ("mlflow",
    "wandb"); `params_logged`: continues an MLflow run; `default_uri`: no URI in `env` means MLflow's default here."""
    env = dict(env)
    if "mlflow" in backends:
        env["MLFLOW_EXPERIMENT_NAME"] = study
        if env.get("MLFLOW_TRACKING_URI") or default_uri:
            env["MLFLOW_TRACKING_URI"] = absolute_uri(env.get("MLFLOW_TRACKING_URI") or _mlflow_default())
        if params_logged:
            env.setdefault("MLFLOW_MAX_LOG_PARAMS", "0")  # MLflow refuses changed params
    if "wandb" in backends:
        env.setdefault("WANDB_PROJECT", study)
        env["WANDB_RUN_GROUP"] = study
        env["WANDB_RUN_ID"] = tracker_run_id(run_key)
        env.setdefault("WANDB_RESUME", "allow")
    return env


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
    """The id of the rlscale run's MLflow run (in experiment `study` at env's MLFLOW_TRACKING_URI), found by its tags
    or created on first use, and kept in the run's directory. Not thread-safe: one caller at a time."""
    runs = _runs(run_dir)
    if runs.get("mlflow_run_id"):
        return runs["mlflow_run_id"]
    from mlflow import MlflowClient

    uri = env["MLFLOW_TRACKING_URI"]
    client = MlflowClient(uri)
    run_id = find_mlflow_run(client, _experiment(client, study), study, run_key, create=True)
    write_whole(run_dir / RUNS_FILE, json.dumps({**runs, "mlflow_run_id": run_id, "mlflow_tracking_uri": uri}))
    return run_id


def mlflow_segment_run(env: dict, *, study: str, run_key: str, run_dir: Path, until_step: int) -> str:
    """The id of a new MLflow run for one segment of a verl run, nested under the run's MLflow run (mlflow_run), set
    running again: verl logs its params in every segment, which MLflow refuses in a continued run. Not thread-safe."""
    from mlflow import MlflowClient

    parent = mlflow_run(env, study=study, run_key=run_key, run_dir=run_dir)
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    client.update_run(parent, status="RUNNING")  # an extended run's segments continue a finished one
    tags = {"mlflow.parentRunId": parent, TAG_STUDY: study}
    experiment_id = client.get_run(parent).info.experiment_id
    return client.create_run(experiment_id, run_name=f"{run_key} to step {until_step}", tags=tags).info.run_id


def end_mlflow_run(run_dir: Path, status: str) -> None:
    """Mark the MLflow run kept in the run's directory (mlflow_run) ended as the run's `status` in the store says;
    nothing for a run without one, or a status that is not an end."""
    runs = _runs(run_dir)
    if status in MLFLOW_END_STATUS and runs.get("mlflow_run_id") and runs.get("mlflow_tracking_uri"):
        from mlflow import MlflowClient

        MlflowClient(runs["mlflow_tracking_uri"]).set_terminated(runs["mlflow_run_id"], MLFLOW_END_STATUS[status])


def find_mlflow_run(client, experiment_id: str, study: str, run_key: str, *, create: bool) -> str | None:
    """The id of run `run_key`'s MLflow run in the experiment, found by its run key tag; else a new one (`create`),
    named by its key and tagged by tracker_tags, or None. The one lookup of the engines and the mirror."""
    found = client.search_runs([experiment_id], f"tags.`{TAG_RUN_KEY}` = '{run_key}'", max_results=1)
    if found:
        return found[0].info.run_id
    if not create:
        return None
    return client.create_run(experiment_id, run_name=run_key, tags=tracker_tags(study, run_key)).info.run_id


def _experiment(client, name: str) -> str:
    experiment = client.get_experiment_by_name(name)
    return experiment.experiment_id if experiment else client.create_experiment(name)


def _runs(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / RUNS_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def mirrored(record: dict) -> list[tuple[str, float]]:
    """(name, value) of each MIRRORED column the record has."""
    return [(key, float(record[key])) for key in MIRRORED if record.get(key) is not None]


class Tracker(ABC):
    """Mirrors a study's evaluations to one tracker."""

    def __init__(self, study: str, project: str | None = None):
        self.group = project or study
        self.lock = threading.Lock()

    def log(self, run_key: str, records: list[dict]) -> None:
        """Mirror the evaluations among `records` of the run `run_key` names (its tracker name, as verl's and TRL's)."""
        evaluations = [record for record in records if record.get("val_reward") is not None]
        if evaluations:
            with self.lock:
                self.write(run_key, evaluations)

    @abstractmethod
    def write(self, run_key: str, evaluations: list[dict]) -> None:
        """Send the evaluations to the tracker."""

    def close(self) -> None:
        """Flush and end what the tracker holds open."""

    def end(self, run_key: str, status: str) -> None:
        """The run ended in the store with `status` (done, stopped, failed): say so where the tracker keeps a run's
        status. Default: nothing (a write already ends what it opened)."""


class MlflowTracker(Tracker):
    """MLflow: an experiment per study, a run per rlscale run (found again by its run key tag), metrics at their step.
    `uri`: the tracking URI (a server, or sqlite:///path); None: MLflow's own default (MLFLOW_TRACKING_URI)."""

    def __init__(self, study: str, project: str | None = None, uri: str | None = None):
        super().__init__(study, project)
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        self.experiment = _experiment(self.client, self.group)
        self.runs: dict[str, str] = {}

    def write(self, run_key: str, evaluations: list[dict]) -> None:
        from mlflow.entities import Metric

        if run_key not in self.runs:  # its first evaluation in this sweep: it trains again (an extended run had ended)
            self.client.update_run(self._run_id(run_key, create=True), status="RUNNING")
        run_id = self.runs[run_key]
        now = int(time.time() * 1000)
        metrics = [
            Metric(key, value, now, int(record["step"])) for record in evaluations for key, value in mirrored(record)
        ]
        self.client.log_batch(run_id, metrics=metrics)

    def end(self, run_key: str, status: str) -> None:
        if status not in MLFLOW_END_STATUS:
            return
        with self.lock:
            run_id = self._run_id(run_key, create=False)
            if run_id is not None:
                self.client.set_terminated(run_id, MLFLOW_END_STATUS[status])

    def _run_id(self, run_key: str, *, create: bool) -> str | None:
        if run_key not in self.runs:
            run_id = find_mlflow_run(self.client, self.experiment, self.group, run_key, create=create)
            if run_id is None:
                return None
            self.runs[run_key] = run_id
        return self.runs[run_key]


class TrackioTracker(Tracker):
    """trackio (local-first, SQLite): a project per study, a run per rlscale run, resumed by name."""

    def __init__(self, study: str, project: str | None = None):
        super().__init__(study, project)
        import trackio  # noqa: F401  (missing: UserError before the sweep starts)

    def write(self, run_key: str, evaluations: list[dict]) -> None:
        import trackio

        trackio.init(project=self.group, name=run_key, resume="allow")
        for record in evaluations:
            trackio.log(dict(mirrored(record)), step=int(record["step"]))
        trackio.finish()


class WandbTracker(Tracker):
    """Weights & Biases (online, or offline with WANDB_MODE=offline): a project per study, a run per rlscale run
    with the run's tracker_run_id as the W&B run id (a resumed run continues it)."""

    def __init__(self, study: str, project: str | None = None):
        super().__init__(study, project)
        import wandb  # noqa: F401  (missing: UserError before the sweep starts)

    def write(self, run_key: str, evaluations: list[dict]) -> None:
        import wandb

        with wandb.init(
            project=self.group, name=run_key, id=tracker_run_id(run_key), resume="allow", reinit="create_new"
        ) as handle:
            for record in evaluations:
                handle.log(dict(mirrored(record)), step=int(record["step"]))


TRACKERS = {"mlflow": MlflowTracker, "trackio": TrackioTracker, "wandb": WandbTracker}


def make_tracker(tracking, study: str) -> Tracker | None:
    """The tracker a study's `tracking` block names (None without one); UserError when its client library is missing
    (the sweep command probes its server before the store is made)."""
    if tracking is None:
        return None
    check_tracking(tracking, reach=False)
    if tracking.backend == "mlflow":
        return MlflowTracker(study, tracking.project, tracking.uri)
    return TRACKERS[tracking.backend](study, tracking.project)


def check_tracking(tracking, *, reach: bool = True, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """UserError when a study's tracker cannot work from here: its client library is missing, or (`reach`) its MLflow
    server does not answer within `timeout_s` (MLflow's own retries take minutes to give up)."""
    if tracking is None:
        return
    package = {"mlflow": "mlflow-skinny"}.get(tracking.backend, tracking.backend)
    try:
        importlib.import_module(tracking.backend)
    except ImportError:
        raise UserError(
            f"tracking {tracking.backend} needs its client library: pip install {package}", field="tracking.backend"
        ) from None
    uri = tracking.uri or os.environ.get("MLFLOW_TRACKING_URI") or ""
    if reach and tracking.backend == "mlflow" and uri.startswith(("http://", "https://")):
        _probe_mlflow(uri, timeout_s)


def _probe_mlflow(uri: str, timeout_s: float) -> None:
    parts = urllib.parse.urlsplit(uri)
    host = parts.netloc.rpartition("@")[2]  # credentials stay out of the probe and the message
    shown = urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))
    try:
        health = urllib.parse.urlunsplit((parts.scheme, host, parts.path.rstrip("/") + "/health", "", ""))
        urllib.request.urlopen(health, timeout=timeout_s).close()
    except urllib.error.HTTPError:
        return  # it answered (a proxy's 401 or 404): MLflow's client says the rest
    except (urllib.error.URLError, OSError, ValueError) as err:
        why = getattr(err, "reason", None) or err
        raise UserError(
            f"the MLflow server {shown} does not answer within {timeout_s:g} s: {why}", field="tracking.uri"
        ) from None
