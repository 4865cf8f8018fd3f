"""A study's `tracking:` key: each stored evaluation mirrored to the user's tracker (MLflow, trackio, W&B), a group per
study and a run per run. The driver calls `log` from each run's thread, so a tracker serialises its client calls."""

import hashlib
import re
import threading
import time
from abc import ABC, abstractmethod

from rlscale.base.errors import UserError

# record columns mirrored at each evaluation, under these names
MIRRORED = ("val_reward", "gpu_hours", "rollouts", "tokens")
# a run's identity in every tracker, whichever engine trains it: MLflow tags, and the W&B run id (tracker_run_id)
TAG_STUDY, TAG_RUN_KEY = "rlscale.study", "rlscale.run_key"
RUN_ID_CHARACTERS, RUN_ID_LENGTH = re.compile(r"[^A-Za-z0-9_-]"), 64  # what W&B takes as a run id


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


class MlflowTracker(Tracker):
    """MLflow: an experiment per study, a run per rlscale run (found again by its run key tag), metrics at their step.
    `uri`: the tracking URI (a server, or sqlite:///path); None: MLflow's own default (MLFLOW_TRACKING_URI)."""

    def __init__(self, study: str, project: str | None = None, uri: str | None = None):
        super().__init__(study, project)
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(self.group)
        self.experiment = experiment.experiment_id if experiment else self.client.create_experiment(self.group)
        self.runs: dict[str, str] = {}

    def write(self, run_key: str, evaluations: list[dict]) -> None:
        from mlflow.entities import Metric

        run_id = self.runs.get(run_key) or self._run_id(run_key)
        now = int(time.time() * 1000)
        metrics = [
            Metric(key, float(record[key]), now, int(record["step"]))
            for record in evaluations
            for key in MIRRORED
            if record.get(key) is not None
        ]
        self.client.log_batch(run_id, metrics=metrics)

    def _run_id(self, run_key: str) -> str:
        found = self.client.search_runs([self.experiment], f"tags.`{TAG_RUN_KEY}` = '{run_key}'", max_results=1)
        if found:
            run_id = found[0].info.run_id
        else:
            run_id = self.client.create_run(
                self.experiment, run_name=run_key, tags=tracker_tags(self.group, run_key)
            ).info.run_id
        self.runs[run_key] = run_id
        return run_id


class TrackioTracker(Tracker):
    """trackio (local-first, SQLite): a project per study, a run per rlscale run, resumed by name."""

    def __init__(self, study: str, project: str | None = None):
        super().__init__(study, project)
        import trackio  # noqa: F401  (missing: UserError before the sweep starts)

    def write(self, run_key: str, evaluations: list[dict]) -> None:
        import trackio

        trackio.init(project=self.group, name=run_key, resume="allow")
        for record in evaluations:
            trackio.log(
                {key: float(record[key]) for key in MIRRORED if record.get(key) is not None}, step=int(record["step"])
            )
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
                handle.log(
                    {key: float(record[key]) for key in MIRRORED if record.get(key) is not None},
                    step=int(record["step"]),
                )


TRACKERS = {"mlflow": MlflowTracker, "trackio": TrackioTracker, "wandb": WandbTracker}


def make_tracker(tracking, study: str) -> Tracker | None:
    """The tracker a study's `tracking` block names (None without one); UserError naming the package when its
    client library is not installed."""
    if tracking is None:
        return None
    package = {"mlflow": "mlflow-skinny"}.get(tracking.backend, tracking.backend)
    try:
        if tracking.backend == "mlflow":
            return MlflowTracker(study, tracking.project, tracking.uri)
        return TRACKERS[tracking.backend](study, tracking.project)
    except ImportError:
        raise UserError(
            f"tracking {tracking.backend} needs its client library: pip install {package}", field="tracking.backend"
        ) from None
