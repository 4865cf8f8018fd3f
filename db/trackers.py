"""MLflow, trackio and W&B runs read through each tracker's own client library (no copy of their schemas), as
db/tracker_logs.py's TrackerRuns named as the tracker shows them."""

import importlib
import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import pandas as pd
from rlscale.db.tracker_logs import TrackerRun, check_choice, run_seconds, tracker_frame

from rlscale.base.errors import UserError, first_line

PACKAGES = {"mlflow": "mlflow-skinny", "trackio": "trackio", "wandb": "wandb"}  # module -> what pip installs


def read_mlflow_log(
    uri: str, experiment: str | None, *, reward: str | None, compute: str | None, gpus: float | None
) -> pd.DataFrame:
    """tracker_frame of the runs of MLflow `experiment` (a name or an id) at tracking URI `uri`."""
    uri = _mlflow_uri(uri)
    source = f"MLflow {uri}"
    check_choice(source, reward, compute, gpus)
    if experiment is None:
        raise UserError("name the MLflow experiment with --experiment", file=source, field="--experiment")
    _client("mlflow")
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        client = MlflowClient(tracking_uri=uri)
        found = client.get_experiment_by_name(experiment)
        if found is None and experiment.isdigit():
            found = client.get_experiment(experiment)
    except MlflowException as err:
        if "RESOURCE_DOES_NOT_EXIST" not in str(err.error_code):
            raise UserError(first_line(err), file=source) from None
        found = None
    if found is None:
        names = sorted(e.name for e in client.search_experiments())
        raise UserError(
            f"no experiment {experiment!r} (experiments there: {', '.join(names) or 'none'})",
            file=source,
            field="--experiment",
        )
    source = f"{source} experiment {found.name}"
    listed, token = [], None
    while True:  # search_runs pages at 1,000 runs
        page = client.search_runs([found.experiment_id], max_results=1000, page_token=token)
        listed.extend(page)
        token = page.token
        if not token:
            break
    runs = []
    for listed_run in sorted(listed, key=lambda r: r.info.start_time or 0):
        info = listed_run.info
        run = TrackerRun(info.run_name or info.run_id, info.run_id)
        for key in listed_run.data.metrics:
            run.metrics[key] = {}
            if key in (reward, compute):  # the histories read are the two metrics used
                history = sorted(client.get_metric_history(run.run_id, key), key=lambda m: m.timestamp)
                times = [point.timestamp / 1000.0 for point in history]
                start = info.start_time / 1000.0 if info.start_time else min(times, default=0.0)
                (seconds,) = run_seconds([(start, times)])  # MLflow keeps no resumes: one segment
                for point, at in zip(history, seconds):
                    run.metrics[key][int(point.step)] = (point.value, at)  # a step logged again: its last value
        runs.append(run)
    return tracker_frame(runs, source=source, reward=reward, compute=compute, gpus=gpus)


def read_trackio_log(project: str, *, reward: str | None, compute: str | None, gpus: float | None) -> pd.DataFrame:
    """tracker_frame of the runs of trackio `project` (TRACKIO_DIR/<project>.db, as trackio itself finds it)."""
    check_choice(f"trackio project {project}", reward, compute, gpus)
    trackio = _client("trackio")
    from trackio.sqlite_storage import SQLiteStorage
    from trackio.utils import TRACKIO_DIR

    source = f"trackio {TRACKIO_DIR}"
    try:
        listed = list(trackio.Api().runs(project))
    except ValueError:  # Api.runs: "Project ... does not exist"
        projects = SQLiteStorage.get_projects()
        raise UserError(
            f"no project {project!r} (projects there: {', '.join(projects) or 'none'}; TRACKIO_DIR says where)",
            file=source,
            field="--trackio",
        ) from None
    source = f"{source} project {project}"
    runs = []
    for listed_run in listed:
        run = TrackerRun(listed_run.name, listed_run.id)
        lines = SQLiteStorage.get_logs(project, listed_run.name, run_id=listed_run.id, scalar_only=True)
        times = [_seconds(line["timestamp"]) for line in lines]  # when trackio wrote each batch of logs
        # trackio keeps no resumes: the run counts from its creation (a resume stamps it anew) or its first log
        created = (listed_run.config or {}).get("_Created")
        start = min([*times, *([_seconds(created)] if created else [])], default=0.0)
        (seconds,) = run_seconds([(start, times)])
        for line, at in zip(lines, seconds):
            for key, value in line.items():
                if key not in ("step", "timestamp"):
                    run.metrics.setdefault(key, {})[int(line["step"])] = (value, at)
        runs.append(run)
    return tracker_frame(runs, source=source, reward=reward, compute=compute, gpus=gpus)


def is_wandb_log(path: str | Path) -> bool:
    """Whether `path` is a W&B .wandb file, a run directory holding one, or a wandb directory of run directories."""
    return bool(_wandb_files(Path(path)))


def read_wandb_log(path: str | Path, *, reward: str | None, compute: str | None, gpus: float | None) -> pd.DataFrame:
    """tracker_frame of the W&B runs under `path`; a resumed run's directories are one run (its W&B id)."""
    path = Path(path)
    source = str(path)
    check_choice(source, reward, compute, gpus)
    files = _wandb_files(path)
    _client("wandb")
    reader = _wandb_reader(source)
    with ThreadPoolExecutor(max_workers=4) as pool:  # one reader process per file
        segments = list(pool.map(lambda file: _wandb_records(reader, file), files))
    by_id: dict[str, list[tuple[dict, list[dict]]]] = {}  # a run id's segments: its first run, then each resume
    for file, (header, history) in zip(files, segments):
        if not header:
            raise UserError("no run record in this file (not a W&B run log?)", file=str(file))
        by_id.setdefault(header["run_id"], []).append((header, history))
    runs = []
    for run_id, parts in by_id.items():
        parts.sort(key=lambda part: _seconds(part[0]["start_time"]) if part[0].get("start_time") else 0.0)
        run = TrackerRun(parts[-1][0].get("display_name") or run_id, run_id)
        times = [[float(item["_timestamp"]) for item in history] for _, history in parts]
        starts = [
            _seconds(header["start_time"]) if header.get("start_time") else min(stamps, default=0.0)
            for (header, _), stamps in zip(parts, times)
        ]
        for (_, history), seconds in zip(parts, run_seconds(list(zip(starts, times)))):
            for item, at in zip(history, seconds):  # a step logged again by a later segment: the later value
                for key, value in item.items():
                    if not key.startswith("_"):
                        run.metrics.setdefault(key, {})[int(item["_step"])] = (value, at)
        runs.append(run)
    return tracker_frame(runs, source=source, reward=reward, compute=compute, gpus=gpus)


def _client(module: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UserError(
            f"reading {module} runs needs its client library: pip install {PACKAGES[module]} "
            "(or rlscale[trackers] for all three)"
        ) from None


def _mlflow_uri(uri: str) -> str:
    path = Path(uri.removeprefix("file://")) if "://" not in uri or uri.startswith("file://") else None
    if uri.startswith("sqlite:///"):
        path = Path(uri.removeprefix("sqlite:///"))
        if not path.is_file():
            raise UserError("no such file", file=uri, field="--mlflow")
        return uri
    if path is not None:
        if path.is_file():
            return f"sqlite:///{path.resolve()}"
        if not path.is_dir():  # MLflow would create a missing local store
            raise UserError("no such file or directory", file=uri, field="--mlflow")
    return uri


def _wandb_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path] if path.suffix == ".wandb" else []
    if not path.is_dir():
        return []
    found = {p.resolve() for p in [*path.glob("run-*.wandb"), *path.glob("*/run-*.wandb")]}  # latest-run: a link
    return sorted(found)


def _wandb_reader(source: str) -> list[str]:
    # wandb-core's `leet inspect` called directly, with `wandb leet inspect`'s flags: that wrapper costs ~0.7 s a file
    from wandb.errors import WandbCoreNotAvailableError
    from wandb.util import get_core_path

    try:
        return [get_core_path(), "leet", "inspect", "-json", "-no-observability"]  # no telemetry to W&B's servers
    except WandbCoreNotAvailableError as err:
        raise UserError(f"W&B's reader is not available here: {first_line(err)}", file=source) from None


def _wandb_records(reader: list[str], file: Path) -> tuple[dict, list[dict]]:
    done = subprocess.run([*reader, "-run-file", str(file), str(file.parent.parent)], capture_output=True, text=True)
    if done.returncode != 0:
        raise UserError(
            f"W&B's reader failed: {first_line(done.stderr or done.stdout) or f'exit {done.returncode}'}",
            file=str(file),
        )
    header, history = {}, []
    for line in done.stdout.splitlines():
        record = json.loads(line)
        if record.get("type") == "run":
            header = record["run"]
        elif record.get("type") == "history":
            history.append(record["history"]["item"])
    return header, history


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
