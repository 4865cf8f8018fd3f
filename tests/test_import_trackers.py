"""`rlscale import` from trackers: an MLflow experiment, a trackio project and W&B run directories, each written by
the tracker's own client (mlflow-skinny, trackio, wandb offline), read back through it into a study."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from rlscale.db.store import Store
from rlscale.db.tracker_logs import TrackerRun, run_seconds, tracker_frame

from rlscale.base.errors import UserError

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "scalerl_runs.csv"
T0 = 1_790_000_000.0  # a run's start, unix seconds
NAMES = ("GRPO lr=1e-6 (seed 1)", "dapo/clip=0.28")  # run names as researchers type them


# --- the compute meter and the checks, on runs built by hand --------------------------------------------


def test_run_time_counts_each_segment_from_its_own_start_and_leaves_out_the_downtime():
    # segment 1 starts at 0 and logs until 100 s; the run resumes at 1000 s (900 s down) and logs at 1100 and 1300
    assert run_seconds([(0.0, [10.0, 100.0]), (1000.0, [1100.0, 1300.0])]) == [[10.0, 100.0], [200.0, 400.0]]


def test_a_cumulative_metric_logged_every_k_steps_is_interpolated_and_starts_at_zero():
    run = TrackerRun("r", "id1")
    run.metrics["reward"] = {step: (0.1, 0.0) for step in (0, 5, 10, 25)}
    run.metrics["tokens"] = {10: (100.0, 0.0), 20: (300.0, 0.0), 30: (400.0, 0.0)}
    frame = tracker_frame([run], source="s", reward="reward", compute="tokens", gpus=None)
    assert frame["compute"].tolist() == pytest.approx([0.0, 50.0, 100.0, 350.0])
    assert frame.attrs["compute_unit"] == "tokens"


def test_a_metric_that_falls_is_not_cumulative_and_is_refused_naming_run_and_steps():
    run = TrackerRun("r", "id1")
    run.metrics["reward"] = {1: (0.1, 0.0), 2: (0.2, 0.0)}
    run.metrics["tokens_per_step"] = {1: (500.0, 0.0), 2: (480.0, 0.0)}
    with pytest.raises(UserError) as err:
        tracker_frame([run], source="s", reward="reward", compute="tokens_per_step", gpus=None)
    assert err.value.file == "s: run 'r'" and "falls from 500 at step 1 to 480 at step 2" in err.value.detail


@pytest.mark.parametrize("compute, gpus", [(None, None), ("tokens", 8.0)])
def test_the_compute_is_named_one_way_exactly(compute, gpus):
    run = TrackerRun("r", "id1", {"reward": {0: (0.1, 0.0)}, "tokens": {0: (0.0, 0.0)}})
    with pytest.raises(UserError) as err:
        tracker_frame([run], source="s", reward="reward", compute=compute, gpus=gpus)
    assert err.value.field == "--compute" and "one of them" in err.value.detail


def test_two_runs_of_one_name_are_refused_since_they_would_merge():
    runs = [TrackerRun("same", "a", {"reward": {0: (0.1, 0.0)}}), TrackerRun("same", "b", {"reward": {0: (0.2, 0.0)}})]
    with pytest.raises(UserError, match="ids a and b"):
        tracker_frame(runs, source="s", reward="reward", compute=None, gpus=1)


# --- MLflow ---------------------------------------------------------------------------------------------


def _mlflow_run(client, experiment_id: str, name: str, points: dict[str, dict[int, tuple[float, float]]]):
    """A run that started at T0 with metric -> step -> (value, seconds after T0)."""
    from mlflow.entities import Metric

    run = client.create_run(experiment_id, start_time=int(T0 * 1000), run_name=name)
    metrics = [
        Metric(key, value, int((T0 + seconds) * 1000), step)
        for key, steps in points.items()
        for step, (value, seconds) in steps.items()
    ]
    client.log_batch(run.info.run_id, metrics=metrics)
    return run.info.run_id


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory):
    """An MLflow SQLite store with experiment `grpo`: two runs with rewards and a crashed run without one."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    grpo = client.create_experiment("grpo")
    for name in NAMES:
        _mlflow_run(
            client,
            grpo,
            name,
            {
                "eval/reward": {0: (0.10, 60.0), 10: (0.20, 960.0), 20: (0.30, 1860.0)},
                "train/num_tokens": {10: (5e5, 950.0), 20: (1e6, 1850.0)},
            },
        )
    _mlflow_run(client, grpo, "crashed", {"train/loss": {1: (2.0, 30.0)}})
    return uri


def test_mlflow_runs_import_by_name_with_gpu_hours_from_step_times(cli, mlflow_uri, tmp_path):
    db = f"sqlite:///{tmp_path / 'store.db'}"
    args = ("import", "--mlflow", mlflow_uri, "--experiment", "grpo", "--reward", "eval/reward", "--study", "m")
    code, out, err = cli(*args, "--gpus", "8", "--db", db, "--json")
    assert (code, err) == (0, "")
    summary = json.loads(out)
    assert (summary["runs_created"], summary["records_added"]) == (2, 6)
    assert summary["runs_left_out"] == ["crashed"] and summary["compute_unit"] == "gpu_hours"
    with Store(db) as store:
        records = store.records_frame("m")
    assert sorted(set(records["run"])) == sorted(NAMES)  # as typed: spaces, '=', '/', parentheses
    mine = records[records["run"] == NAMES[0]]
    assert mine["step"].tolist() == [0, 10, 20]
    assert mine["gpu_hours"].tolist() == pytest.approx([60 * 8 / 3600, 960 * 8 / 3600, 1860 * 8 / 3600])
    assert mine["val_reward"].tolist() == pytest.approx([0.1, 0.2, 0.3])

    code, out, _ = cli("import", *args[1:-1], "tokens", "--compute", "train/num_tokens", "--db", db)
    assert code == 0 and "compute: the logged metric 'train/num_tokens'" in out
    with Store(db) as store:
        tokens = store.records_frame("tokens")
    assert tokens[tokens["run"] == NAMES[1]]["gpu_hours"].tolist() == [0.0, 5e5, 1e6]


def test_an_mlflow_reimport_adds_only_the_steps_logged_since(cli, mlflow_uri, tmp_path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_uri)
    experiment = client.create_experiment("growing")
    run_id = _mlflow_run(client, experiment, "grpo", {"eval/reward": {0: (0.1, 10.0), 5: (0.2, 20.0)}})
    db = f"sqlite:///{tmp_path / 'store.db'}"
    args = ("import", "--mlflow", mlflow_uri, "--experiment", "growing", "--reward", "eval/reward", "--gpus", "1")
    assert cli(*args, "--study", "g", "--db", db)[0] == 0
    from mlflow.entities import Metric

    client.log_batch(run_id, metrics=[Metric("eval/reward", 0.3, int((T0 + 30) * 1000), 10)])
    code, out, _ = cli(*args, "--study", "g", "--db", db, "--json")
    summary = json.loads(out)
    assert code == 0 and (summary["runs_created"], summary["records_added"], summary["records_skipped"]) == (0, 1, 2)
    with Store(db) as store:
        assert store.records_frame("g")["step"].tolist() == [0, 5, 10]


@pytest.mark.parametrize(
    "change, named",
    [
        (("--experiment", "nope"), "no experiment 'nope' (experiments there: Default,"),
        (("--reward", "eval/acc"), "no run logged the metric 'eval/acc' (metrics logged: eval/reward, train/loss,"),
        (("--compute", "tokens"), "': --compute: no metric 'tokens' (metrics logged: eval/reward, train/num_tokens)"),
        (("--gpus", "0"), "--gpus: expected a number of GPUs > 0"),
    ],
)
def test_a_missing_experiment_or_metric_is_one_line_exit_2_and_nothing_stored(cli, mlflow_uri, tmp_path, change, named):
    options = {"--experiment": "grpo", "--reward": "eval/reward", "--gpus": "2"}
    if change[0] == "--compute":
        del options["--gpus"]
    options[change[0]] = change[1]
    db = tmp_path / "store.db"
    code, out, err = cli(
        "import",
        "--mlflow",
        mlflow_uri,
        *[x for kv in options.items() for x in kv],
        "--study",
        "s",
        "--db",
        f"sqlite:///{db}",
    )
    assert (code, out) == (2, "") and named in err and err.count("\n") == 1
    assert not db.exists()


def test_a_missing_client_library_is_one_line_naming_the_package(cli, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "mlflow", None)
    code, _, err = cli(
        "import", "--mlflow", str(tmp_path), "--experiment", "x", "--reward", "r", "--gpus", "1", "--study", "s"
    )
    assert code == 2 and "pip install mlflow-skinny" in err and err.count("\n") == 1
    monkeypatch.setitem(sys.modules, "trackio", None)
    code, _, err = cli("import", "--trackio", "p", "--reward", "r", "--gpus", "1", "--study", "s")
    assert code == 2 and "pip install trackio" in err and err.count("\n") == 1
    monkeypatch.setitem(sys.modules, "wandb", None)
    (tmp_path / "run-abc.wandb").write_bytes(b"")
    code, _, err = cli("import", str(tmp_path), "--reward", "r", "--gpus", "1", "--study", "s")
    assert code == 2 and "pip install wandb" in err and err.count("\n") == 1
    assert not (tmp_path / "rlscale.db").exists()  # the default store was never opened


def test_a_file_that_wandbs_reader_refuses_is_one_line_naming_it_and_nothing_is_stored(cli, tmp_path):
    (tmp_path / "run-abc.wandb").write_bytes(b"not a W&B log")
    db = tmp_path / "store.db"
    code, out, err = cli(
        "import", str(tmp_path), "--reward", "r", "--gpus", "1", "--study", "s", "--db", f"sqlite:///{db}"
    )
    assert (code, out) == (2, "") and f"{tmp_path / 'run-abc.wandb'}: W&B's reader failed" in err
    assert err.count("\n") == 1 and not db.exists()
    code, out, err = cli(
        "fit", str(tmp_path)
    )  # fit takes run logs; W&B runs go through the import, which names metrics
    assert (code, out) == (2, "") and "rlscale import" in err and err.count("\n") == 1


# --- trackio --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trackio(tmp_path_factory):
    """trackio with TRACKIO_DIR in a temporary folder (trackio reads it once, when imported)."""
    if "trackio" in sys.modules:
        pytest.fail("trackio was imported before this module set TRACKIO_DIR")
    os.environ["TRACKIO_DIR"] = str(tmp_path_factory.mktemp("trackio"))
    import trackio

    return trackio


def test_a_trackio_project_imports_its_runs_and_a_resumed_run_adds_only_its_new_steps(cli, trackio, tmp_path, capsys):
    for name in NAMES:
        trackio.init(project="grpo", name=name)
        for step in (0, 10, 20):
            trackio.log({"eval/reward": 0.1 + step / 100, "gpu_hours": step / 10}, step=step)
        trackio.finish()
    db = f"sqlite:///{tmp_path / 'store.db'}"
    args = (
        "import",
        "--trackio",
        "grpo",
        "--reward",
        "eval/reward",
        "--compute",
        "gpu_hours",
        "--study",
        "t",
        "--db",
        db,
    )
    code, out, err = cli(*args)
    assert (code, err) == (0, "") and "2 runs (2 new), 6 records added" in out
    with Store(db) as store:
        records = store.records_frame("t")
    assert sorted(set(records["run"])) == sorted(NAMES)
    assert records[records["run"] == NAMES[0]]["gpu_hours"].tolist() == pytest.approx([0.0, 1.0, 2.0])

    trackio.init(project="grpo", name=NAMES[0], resume="must")
    trackio.log({"eval/reward": 0.4, "gpu_hours": 3.0}, step=30)
    trackio.finish()
    capsys.readouterr()  # trackio's own notes
    code, out, _ = cli(*args, "--json")
    summary = json.loads(out)
    assert code == 0 and (summary["records_added"], summary["records_skipped"]) == (1, 6)

    code, out, err = cli("import", "--trackio", "gpro", *args[3:])
    assert (code, out) == (2, "") and "no project 'gpro' (projects there: grpo" in err


# --- W&B ------------------------------------------------------------------------------------------------

# offline runs as a user's script writes them; the first is resumed (a second run directory of the same id) after a
# pause, and every point is stamped at a known number of seconds after its segment's start
USER_WANDB = """
import sys, time, wandb
root, first, second = sys.argv[1:]
with wandb.init(project="grpo", name=first, id="grpo1", dir=root) as run:
    for i, step in enumerate((0, 10, 20)):
        stamp = run.start_time + 60 * (i + 1)
        run.log({"eval/reward": 0.1 + step / 100, "perf": {"tokens": 1000 * step}, "_timestamp": stamp}, step=step)
time.sleep(1.1)  # W&B names a run directory by the second it starts in
with wandb.init(project="grpo", name=first, id="grpo1", dir=root, resume="allow") as run:
    run.log({"eval/reward": 0.4, "perf": {"tokens": 30000}, "_timestamp": run.start_time + 30}, step=30)
with wandb.init(project="grpo", name=second, dir=root) as run:
    run.log({"eval/reward": 0.2, "perf": {"tokens": 0}, "_timestamp": run.start_time + 10}, step=0)
"""


def _wandb(script: str, root: Path, *args: str) -> None:
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    env |= {name: str(root) for name in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR")}
    subprocess.run([sys.executable, "-c", textwrap.dedent(script), str(root), *args], env=env, check=True, timeout=300)


def test_wandb_offline_runs_import_with_resumes_merged_and_their_downtime_left_out(cli, tmp_path):
    _wandb(USER_WANDB, tmp_path, *NAMES)
    db = f"sqlite:///{tmp_path / 'store.db'}"
    code, out, err = cli(
        "import", str(tmp_path / "wandb"), "--reward", "eval/reward", "--gpus", "4", "--study", "w", "--db", db
    )
    assert (code, err) == (0, "") and "2 runs (2 new), 5 records added" in out  # latest-run is not read twice
    with Store(db) as store:
        records = store.records_frame("w")
    first = records[records["run"] == NAMES[0]]
    assert first["step"].tolist() == [0, 10, 20, 30]
    # 60, 120, 180 s into the first segment, then 30 s into the resumed one: the pause between them is not compute
    assert first["gpu_hours"].tolist() == pytest.approx([s * 4 / 3600 for s in (60, 120, 180, 210)], rel=1e-6)
    assert records[records["run"] == NAMES[1]]["gpu_hours"].tolist() == pytest.approx([10 * 4 / 3600], rel=1e-6)

    code, out, _ = cli(
        "import",
        str(tmp_path / "wandb"),
        "--reward",
        "eval/reward",
        "--compute",
        "perf.tokens",
        "--study",
        "tok",
        "--db",
        db,
    )
    assert code == 0
    with Store(db) as store:
        assert store.records_frame("tok").query("run == @NAMES[0]")["gpu_hours"].tolist() == [0, 10000, 20000, 30000]


# --- the round trip: a study mirrored to each tracker by rlscale's tracking, imported back, fits the same -------

MIRROR_WANDB = """
import json, sys
from rlscale.runner.tracking import WandbTracker
root, study, records = sys.argv[1:]
tracker = WandbTracker(study)
for run, rows in json.loads(records).items():
    tracker.log(run, rows)
"""


def _fits(cli, study: str, db: str) -> dict[str, dict]:
    code, out, err = cli("fit", "--study", study, "--db", db, "--json")
    assert code == 0, err
    return {fit["run"]: fit for fit in json.loads(out)}


def test_a_study_mirrored_to_mlflow_trackio_and_wandb_imports_back_with_the_same_fits(cli, trackio, tmp_path, capsys):
    from rlscale.runner.tracking import MlflowTracker, TrackioTracker

    db = f"sqlite:///{tmp_path / 'store.db'}"
    assert cli("import", str(EXAMPLE), "--study", "scalerl", "--db", db)[0] == 0
    with Store(db) as store:
        frame = store.records_frame("scalerl")
    records = {
        run: rows[["step", "val_reward", "gpu_hours", "rollouts", "tokens"]].astype(float).to_dict("records")
        for run, rows in frame.groupby("run")
    }
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for tracker in (MlflowTracker("scalerl", uri=uri), TrackioTracker("scalerl")):
        for run, rows in records.items():
            tracker.log(run, rows)
    _wandb(MIRROR_WANDB, tmp_path, "scalerl", json.dumps(records))
    capsys.readouterr()  # trackio's own notes

    common = ("--reward", "val_reward", "--compute", "gpu_hours", "--db", db)
    sources = {
        "mlflow": ("--mlflow", uri, "--experiment", "scalerl"),
        "trackio": ("--trackio", "scalerl"),
        "wandb": (str(tmp_path / "wandb"),),
    }
    expected = _fits(cli, "scalerl", db)
    assert len(expected) == 4
    for tracker, source in sources.items():
        code, _, err = cli("import", *source, *common, "--study", f"from_{tracker}")
        assert (code, err) == (0, ""), tracker
        # every number the tracker kept is the float rlscale sent, so the fits are equal, not merely close
        assert _fits(cli, f"from_{tracker}", db) == expected, tracker
