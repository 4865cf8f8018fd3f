"""A study's `tracking:` key: each evaluation the sweep stores goes to the tracker the user watches (MLflow here, a
local SQLite store read back with MLflow's own client), grouped by study, named by run key, and a resumed run continues
its tracker run. The engine is conftest's PacedEngine: the test isolates the driver's mirror from Ray on purpose."""

import pytest
import yaml
from rlscale.db.store import Store
from rlscale.planner.study_file import load_study
from rlscale.runner.sweep.driver import SweepDriver
from rlscale.runner.tracking import TAG_RUN_KEY, TAG_STUDY, tracker_run_id


def test_each_evaluation_is_mirrored_to_mlflow_by_study_and_run_and_a_resume_continues_it(tmp_path, paced_engine):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = {
        "name": "mirror",
        "method": "grid",
        "parameters": {"lr": {"values": [2e-4, 3e-4]}},
        "recipe": {"steps": 8, "eval_every": 2, "checkpoint_every": 2, "async": "sync"},
        "tracking": {"backend": "mlflow", "uri": uri},
    }
    (tmp_path / "mirror.yaml").write_text(yaml.safe_dump(spec))
    engine = paced_engine(seconds=0.0)
    with Store(f"sqlite:///{tmp_path / 'store.db'}") as store:
        SweepDriver(load_study(tmp_path / "mirror.yaml"), store, engine=engine, max_concurrent=2).run()
        driver = SweepDriver(
            load_study(tmp_path / "mirror.yaml").model_copy(update={"extend": 1.5}),
            store,
            engine=engine,
            max_concurrent=2,
        )
        driver.run()  # every run resumed to 12 steps
        stored = store.records_frame("mirror").dropna(subset=["val_reward"])
        keys = {driver.run_key(state): state.name for state in driver.plan()}
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("mirror")
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(run.info.run_name for run in runs) == sorted(keys)  # one MLflow run each, named as TRL's and verl's
    for run in runs:
        assert run.data.tags[TAG_STUDY] == "mirror" and run.data.tags[TAG_RUN_KEY] == run.info.run_name
        history = client.get_metric_history(run.info.run_id, "val_reward")
        mine = stored[stored["run"] == keys[run.info.run_name]]
        assert sorted(point.step for point in history) == sorted(mine["step"]) == list(range(0, 13, 2))
        hours = {point.step: point.value for point in client.get_metric_history(run.info.run_id, "gpu_hours")}
        assert hours == pytest.approx(dict(zip(mine["step"], mine["gpu_hours"])))


def test_a_tracker_whose_library_is_missing_is_one_line(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)
    spec = {
        "name": "w",
        "method": "grid",
        "parameters": {"lr": {"values": [2e-4]}},
        "recipe": {"steps": 4},
        "tracking": {"backend": "wandb"},
    }
    (tmp_path / "w.yaml").write_text(yaml.safe_dump(spec))
    from rlscale.runner.tracking import make_tracker

    from rlscale.base.errors import UserError

    with pytest.raises(UserError, match="pip install wandb"):
        make_tracker(load_study(tmp_path / "w.yaml").tracking, "w")


def test_a_run_has_one_tracker_identity_whichever_engine_trains_it(tmp_path):
    from rlscale.runner.trl.trackers import mlflow_run, tracker_env

    key = "gsm8k_n-3-0123456789"
    assert tracker_run_id(key) == key  # a key W&B takes stays itself
    dotted = "my.study.v2" * 6 + "-3-0123456789"
    ident = tracker_run_id(dotted)
    assert len(ident) <= 64 and ident.replace("-", "").replace("_", "").isalnum()
    assert ident != tracker_run_id(dotted.replace("v2", "v3"))  # two keys, two ids, however long
    # TRL's jobs and verl's (test_setup_verl: WANDB_RUN_ID) continue the run under the same W&B id as builtin's tracker
    env = tracker_env(["wandb", "mlflow"], study="s", run_key=dotted, env={}, fresh=True)
    assert env["WANDB_RUN_ID"] == ident
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = mlflow_run({"MLFLOW_TRACKING_URI": uri}, study="s", run_key=dotted, run_dir=tmp_path)
    tags = MlflowClient(tracking_uri=uri).get_run(run_id).data.tags
    assert (tags[TAG_STUDY], tags[TAG_RUN_KEY]) == ("s", dotted)  # the tags builtin's MLflow runs carry
