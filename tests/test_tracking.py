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
        assert run.info.status == "FINISHED"  # ended when the run did, not left RUNNING
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
    from rlscale.runner.tracking import mlflow_run, tracker_env

    key = "gsm8k_n-3-0123456789"
    assert tracker_run_id(key) == key  # a key W&B takes stays itself
    dotted = "my.study.v2" * 6 + "-3-0123456789"
    ident = tracker_run_id(dotted)
    assert len(ident) <= 64 and ident.replace("-", "").replace("_", "").isalnum()
    assert ident != tracker_run_id(dotted.replace("v2", "v3"))  # two keys, two ids, however long
    # TRL's jobs and verl's (test_setup_verl: WANDB_RUN_ID) continue the run under the same W&B id as builtin's tracker
    env = tracker_env(["wandb", "mlflow"], study="s", run_key=dotted, env={})
    assert env["WANDB_RUN_ID"] == ident
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = mlflow_run({"MLFLOW_TRACKING_URI": uri}, study="s", run_key=dotted, run_dir=tmp_path)
    tags = MlflowClient(tracking_uri=uri).get_run(run_id).data.tags
    assert (tags[TAG_STUDY], tags[TAG_RUN_KEY]) == ("s", dotted)  # the tags builtin's MLflow runs carry


def verl_mlflow_study(tmp_path):
    """A one-run verl study of the user's launch, which logs to MLflow."""
    (tmp_path / "run.args").write_text(
        "python3 -m verl.trainer.main_ppo data.train_batch_size=16 actor_rollout_ref.rollout.n=4 "
        'actor_rollout_ref.model.path=Qwen/Qwen3-0.6B trainer.logger=\'["console","mlflow"]\''
    )
    spec = {
        "name": "mine",
        "method": "grid",
        "parameters": {"lr": {"values": [1e-6]}},
        "recipe": {"engine": "verl", "trainer_devices": 1, "steps": 10},
        "setup": {"overrides_file": "run.args"},
    }
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(spec))
    return load_study(tmp_path / "study.yaml")


def test_a_verl_job_logs_to_mlflow_in_the_studys_experiment_at_the_store_the_sweep_sees(tmp_path, monkeypatch):
    from rlscale.planner.frameworks.setup import setup_plan
    from rlscale.planner.planning import planned_runs
    from rlscale.runner.jobs_api import RunDir
    from rlscale.runner.verl.setup import make_setup_job

    pytest.importorskip("mlflow")
    study = verl_mlflow_study(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///m.db")  # relative to the sweep; the job runs elsewhere
    monkeypatch.setenv("MLFLOW_RUN_ID", "one-run-for-the-whole-sweep")
    monkeypatch.setenv("WANDB_API_KEY", "secret")
    arguments = (setup_plan(study), planned_runs(study)[0].recipe, RunDir(tmp_path / "mine-1-ab"), "mine-1-ab-1")
    options = {"until_step": 10, "python": "python", "module": "verl.trainer.main_ppo", "gpus_per_node": 1}
    job, _ = make_setup_job(*arguments, **options)
    env = job.env_vars
    assert env["MLFLOW_EXPERIMENT_NAME"] == "mine" and env["MLFLOW_TRACKING_URI"] == f"sqlite:///{tmp_path / 'm.db'}"
    # not the sweep's run: verl logs the params in every segment, which MLflow refuses in a continued run
    assert "MLFLOW_RUN_ID" not in env and "MLFLOW_MAX_LOG_PARAMS" not in env
    assert "WANDB_API_KEY" not in env and "WANDB_RUN_ID" not in env  # credentials stay on the nodes; no W&B logger
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    job, _ = make_setup_job(*arguments, **options)
    assert "MLFLOW_TRACKING_URI" not in job.env_vars  # none given: the nodes' own, not a file on the driver's disk


def test_each_verl_segment_logs_to_its_own_mlflow_run_nested_under_the_runs_one(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    import mlflow
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient
    from rlscale.planner.frameworks.setup import setup_plan
    from rlscale.planner.planning import planned_runs
    from rlscale.runner.jobs_api import RunDir
    from rlscale.runner.verl.engine import VerlEngine

    study = verl_mlflow_study(tmp_path)
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    engine = VerlEngine(shared_dir=tmp_path / "shared", setup=setup_plan(study))
    recipe, run_dir = planned_runs(study)[0].recipe, RunDir(tmp_path / "mine-1-ab")
    segments = [engine.submission(recipe, run_dir, f"mine-1-ab-{i}", until_step=step) for i, step in ((1, 5), (2, 10))]
    children = [job.runtime_env["env_vars"]["MLFLOW_RUN_ID"] for job in segments]
    client = MlflowClient(tracking_uri=uri)
    parent = client.search_runs(
        [client.get_experiment_by_name("mine").experiment_id], f"tags.`{TAG_RUN_KEY}` = 'mine-1-ab'"
    )
    assert len(parent) == 1  # the one run the study's tracker mirrors to (MlflowTracker finds it by this tag)
    for child, step in zip(children, (5, 10)):
        run = client.get_run(child)
        assert run.data.tags["mlflow.parentRunId"] == parent[0].info.run_id
        assert run.info.run_name == f"mine-1-ab to step {step}"
        # as verl's Tracking does with MLFLOW_RUN_ID set: continue the run, log the segment's config as params
        with mlflow.start_run(run_id=child):
            mlflow.log_params({"trainer.total_training_steps": step})
    with mlflow.start_run(run_id=parent[0].info.run_id):  # one run for both segments refuses the second's params
        mlflow.log_params({"trainer.total_training_steps": 5})
        with pytest.raises(MlflowException):
            mlflow.log_params({"trainer.total_training_steps": 10})
    monkeypatch.delenv("MLFLOW_TRACKING_URI")  # no store named: verl makes its runs where its nodes say
    assert (
        "MLFLOW_RUN_ID" not in engine.submission(recipe, run_dir, "mine-1-ab-3", until_step=10).runtime_env["env_vars"]
    )


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_mlflow_server_that_does_not_answer_is_refused_in_seconds_and_nothing_is_stored(
    tmp_path, monkeypatch, capsys
):
    import time

    from helpers import run_cli

    monkeypatch.chdir(tmp_path)
    uri = f"http://someone:hunter2@127.0.0.1:{_closed_port()}/mlflow"
    spec = {
        "name": "away",
        "method": "grid",
        "parameters": {"lr": {"values": [2e-4]}},
        "recipe": {"steps": 4},
        "tracking": {"backend": "mlflow", "uri": uri},
    }
    (tmp_path / "away.yaml").write_text(yaml.safe_dump(spec))
    started = time.perf_counter()
    code, _out, err = run_cli(monkeypatch, capsys, "sweep", "away.yaml", "--db", "sqlite:///s.db")
    assert code == 2 and err.count("\n") == 1 and "tracking.uri" in err, err
    assert f"http://127.0.0.1:{uri.rsplit(':', 1)[1].split('/')[0]}/mlflow" in err and "hunter2" not in err
    assert time.perf_counter() - started < 30  # MLflow's own retries took 251 s to give up
    assert not (tmp_path / "s.db").exists() and not (tmp_path / "reports").exists()


def test_an_mlflow_server_that_answers_passes_whatever_its_health_says():
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from rlscale.planner.study import Tracking
    from rlscale.runner.tracking import check_tracking

    class Health(BaseHTTPRequestHandler):
        def do_GET(self):  # a proxy in front of MLflow may refuse the path: it still answered
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        check_tracking(Tracking(backend="mlflow", uri=f"http://127.0.0.1:{port}"))
        check_tracking(Tracking(backend="mlflow", uri=f"http://127.0.0.1:{port}/behind/a/proxy/"))
    finally:
        server.shutdown()
        server.server_close()


def test_a_runs_mlflow_run_is_found_by_one_lookup_and_ends_as_the_run_does(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    from rlscale.planner.frameworks.setup import setup_plan
    from rlscale.planner.planning import planned_runs
    from rlscale.runner.jobs_api import RunDir
    from rlscale.runner.tracking import MlflowTracker
    from rlscale.runner.verl.engine import VerlEngine

    study = verl_mlflow_study(tmp_path)
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    tracker = MlflowTracker("mine", uri=uri)
    tracker.log("mine-1-ab", [{"step": 0, "val_reward": 0.1}])  # the mirror made the run's MLflow run first
    engine = VerlEngine(shared_dir=tmp_path / "shared", setup=setup_plan(study))
    recipe, run_dir = planned_runs(study)[0].recipe, RunDir(engine.shared_dir / "mine-1-ab")
    child = engine.submission(recipe, run_dir, "mine-1-ab-1", until_step=5).runtime_env["env_vars"]["MLFLOW_RUN_ID"]
    client = MlflowClient(tracking_uri=uri)
    parent = client.get_run(child).data.tags["mlflow.parentRunId"]
    assert parent == tracker.runs["mine-1-ab"]  # found by its tag, not made twice
    status = lambda: client.get_run(parent).info.status  # noqa: E731
    engine.ended("mine-1-ab", "paused")
    assert status() == "RUNNING"  # a paused run continues
    engine.ended("mine-1-ab", "stopped")
    assert status() == "KILLED"
    engine.submission(recipe, run_dir, "mine-1-ab-2", until_step=10)  # extended: running again
    assert status() == "RUNNING"
    tracker.end("mine-1-ab", "done")
    assert status() == "FINISHED"
    MlflowTracker("mine", uri=uri).log("mine-1-ab", [{"step": 5, "val_reward": 0.2}])  # the next sweep's mirror
    assert status() == "RUNNING"
    engine.ended("mine-1-ab", "failed")
    assert status() == "FAILED"
    tracker.end("never-mirrored", "done")  # no run made just to end it
    assert not client.search_runs(
        [client.get_experiment_by_name("mine").experiment_id], "tags.`rlscale.run_key` = 'never-mirrored'"
    )


def test_a_tracker_that_cannot_be_told_a_run_ended_leaves_a_note_beside_why_it_ended(tmp_path, paced_engine):
    from rlscale.runner.tracking import Tracker

    class Gone(Tracker):  # a tracker whose server went away after the run's last evaluation
        def write(self, run_key, evaluations):
            pass

        def end(self, run_key, status):
            raise ConnectionError("tracker.example:5000 refused")

    class Crashing(paced_engine):
        def run(self, recipe, **options):
            if recipe.lr == 3e-4:
                raise RuntimeError("CUDA out of memory")
            return super().run(recipe, **options)

    spec = {"name": "gone", "method": "grid", "parameters": {"lr": {"values": [2e-4, 3e-4]}}, "recipe": {"steps": 4}}
    (tmp_path / "gone.yaml").write_text(yaml.safe_dump(spec))
    with Store(f"sqlite:///{tmp_path / 'store.db'}") as store:
        driver = SweepDriver(load_study(tmp_path / "gone.yaml"), store, engine=Crashing(seconds=0.0), max_retries=0)
        driver.tracker = Gone("gone")
        notes = {run.recipe.lr: (run.status, run.note) for run in driver.run().runs}
        stored = store.runs_frame("gone").set_index("status")["error"]
    untold = "its tracker run not ended: ConnectionError: tracker.example:5000 refused"
    assert notes == {2e-4: ("done", untold), 3e-4: ("failed", f"RuntimeError: CUDA out of memory; {untold}")}
    assert stored["done"] == untold and stored["failed"].splitlines() == ["RuntimeError: CUDA out of memory", untold]
