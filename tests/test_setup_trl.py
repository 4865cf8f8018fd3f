"""A trl study that starts from the user's own `trl grpo` YAML, data, reward functions and tracker (runner/trl/setup.py
and setup_train.py): the dry-run lists the user's files and every key rlscale changes, bad input exits 2 naming the
file and the field with nothing stored, datasets load as users keep them, and a two-point study trains for real on
a Ray head, survives kill -9 of its driver, ends each run at its planned compute and logs both runs to MLflow."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import yaml
from helpers import conversations, write_setup
from rlscale.db.store import Store

pytest.importorskip("trl")


@pytest.fixture(autouse=True)
def no_vllm(monkeypatch):
    if "vllm" not in sys.modules:  # TRL imports an installed vLLM (slow) that a CPU job does not use
        monkeypatch.setitem(sys.modules, "vllm", None)


# ------------------------------------------------------------------------------------------ no Ray, no training


def test_the_dry_run_lists_the_users_files_and_every_key_rlscale_changes(cli, tmp_path):
    import trl
    from rlscale.planner.planning import planned_runs
    from rlscale.planner.study_file import load_study

    study, module = write_setup(tmp_path)
    planned = {run.name: run.recipe.steps for run in planned_runs(load_study(study))}
    code, out, err = cli("sweep", study, "--dry-run", "--json")
    assert code == 0, err
    points = json.loads(out)
    assert [p["run"] for p in points] == ["n2", "n4"]
    for point, n in zip(points, (2, 4)):
        assert point["setup_files"] == [
            str(tmp_path / "grpo.yaml"),
            str(tmp_path / "data"),
            str(tmp_path / f"{module}.py"),
        ]
        changes = {c["key"]: c for c in point["changes"]}
        assert changes["num_generations"] == {
            "key": "num_generations",
            "before": None,
            "after": n,
            "why": "axis rollouts",
        }
        assert {
            "max_steps",
            "output_dir",
            "save_steps",
            "seed",
            "run_name",
            "eval_strategy",
            "lr_scheduler_type",
        } <= set(changes)
        # TRL's default linear schedule decays over the run's planned steps, not max_steps (the segment's end)
        schedule = changes["lr_scheduler_type"]
        assert (schedule["before"], schedule["after"]) == (None, "linear")
        assert f"the run's {planned[point['run']]:,} planned steps" in schedule["why"]
        config = point["config"]
        # the user's keys stay as written; what changed is exactly what the changes list
        user = yaml.safe_load((tmp_path / "grpo.yaml").read_text())
        for key, value in user.items():
            if key not in ("env", "dataset_name"):
                assert config[key] == value, key
        assert {key for key in config if config.get(key) != user.get(key)} == {
            c["key"] for c in point["changes"] if not c["key"].startswith("env.")
        }
        # TRL builds it: B_p x n completions per generated batch, one optimizer update per batch, as the user's
        # config had (8 completions per device, no accumulation)
        grpo = trl.GRPOConfig(**{k: v for k, v in config.items() if k in trl.GRPOConfig.__dataclass_fields__})
        assert grpo.num_generations == n and grpo.generation_batch_size == 4 * n
        assert grpo.steps_per_generation == grpo.gradient_accumulation_steps
        # the trackers group runs by study; the YAML's env reaches the job, not this process
        assert point["env_vars"]["MLFLOW_EXPERIMENT_NAME"] == "mine" and point["env_vars"]["MY_FLAG"] == "1"
    assert "MY_FLAG" not in os.environ


NEEDS_A_PACKAGE = textwrap.dedent("""
    def correct(completions, answer, **kwargs):
        import not_a_package_anywhere  # as trl.rewards.accuracy_reward needs math_verify only when it scores

        return [0.0 for _ in completions]
""")


@pytest.mark.parametrize(
    "case",
    [
        "missing column",
        "bad row",
        "reward does not import",
        "reward needs a package",
        "unknown field",
        "unknown model",
        "micro-batch",
    ],
)
def test_bad_input_exits_2_naming_the_file_and_the_field_and_stores_nothing(cli, tmp_path, case):
    from rlscale.runner.rl.tasks import arithmetic_task

    rows = conversations(arithmetic_task(2, 0).train[:64])
    if case == "missing column":
        rows = [{"prompt": row["prompt"], "solution": row["answer"]} for row in rows]  # the reward takes `answer`
    if case == "bad row":
        rows[3]["prompt"] = [{"role": "user"}]
    grpo = {
        "unknown field": {"learning_rat": 1e-5},
        "unknown model": {"model_name_or_path": "nobody-here/no-such-model"},
        "micro-batch": {"per_device_train_batch_size": 3},
    }.get(case)
    text = {"reward does not import": "import not_a_package_anywhere\n", "reward needs a package": NEEDS_A_PACKAGE}
    study, module = write_setup(tmp_path, rows=rows, grpo=grpo, module_text=text.get(case))
    db = tmp_path / "store.db"
    code, out, err = cli("sweep", study, "--db", f"sqlite:///{db}")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    expected = {
        "missing column": f"{tmp_path / 'data'}: answer:",
        "bad row": f"{tmp_path / 'data'}: prompt: row 3",
        "reward does not import": f"{tmp_path / 'grpo.yaml'}: reward_funcs: {module}.correct",
        "reward needs a package": f"{tmp_path / 'grpo.yaml'}: reward_funcs: {module}.correct needs the package "
        f"not_a_package_anywhere, which the job's environment {sys.prefix} lacks",
        "unknown field": f"{tmp_path / 'grpo.yaml'}: learning_rat:",
        "unknown model": f"{tmp_path / 'grpo.yaml'}: model_name_or_path: 'nobody-here/no-such-model' is neither",
        "micro-batch": f"{tmp_path / 'grpo.yaml'}: per_device_train_batch_size: 3 x 1 process(es) does not divide",
    }[case]
    assert expected in err
    assert not db.exists()


@pytest.mark.parametrize("command", [["plan"], ["sweep", "--dry-run"]])
@pytest.mark.parametrize(
    "key, value",
    [
        ("max_steps", "abc"),
        ("max_steps", [1]),
        ("per_device_train_batch_size", "abc"),
        ("per_device_train_batch_size", [8]),
        ("per_device_train_batch_size", 0),
        ("generation_batch_size", "abc"),
        ("gradient_accumulation_steps", 0),
        ("num_iterations", 0),
    ],
)
def test_a_batch_key_that_is_not_a_positive_whole_number_exits_2_naming_the_file_and_key(
    cli, tmp_path, monkeypatch, command, key, value
):
    study, _ = write_setup(tmp_path, grpo={key: value})
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    code, _, err = cli(*command, study)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{tmp_path / 'grpo.yaml'}: {key}: expected a " in err and repr(value) in err
    assert sorted(tmp_path.rglob("*")) == before  # no store, no plan written


def test_an_exception_of_trls_own_arithmetic_is_a_user_error_naming_the_file():
    from rlscale.runner.trl.user_config import parse

    from rlscale.base.errors import UserError

    keys = {"dataset_name": "data", "reward_funcs": ["x.y"], "use_cpu": True, "bf16": False, "num_generations": 0}
    with pytest.raises(UserError) as raised:  # GRPOConfig divides by num_generations: a ZeroDivisionError
        parse(keys, file="grpo.yaml")
    assert (raised.value.file, raised.value.field) == ("grpo.yaml", "GRPOConfig")
    assert "ZeroDivisionError" in str(raised.value) and len(str(raised.value).splitlines()) == 1
    with pytest.raises(UserError) as raised:  # a value TRL's argparse refuses: its key, without the flag
        parse({**keys, "num_generations": 2, "max_steps": "abc"}, file="grpo.yaml")
    assert (raised.value.file, raised.value.field) == ("grpo.yaml", "max_steps")


def test_a_run_that_failed_and_is_rerun_on_an_edited_yaml_is_one_row(tmp_path):
    from rlscale.planner.study_file import load_study
    from rlscale.runner.sweep.driver import SweepDriver

    study, _ = write_setup(tmp_path)
    with Store(f"sqlite:///{tmp_path / 'store.db'}") as store:
        first = SweepDriver(load_study(study), store).plan()
        store.set_run_status(first[0].run_id, "failed", "ImportError: the reward's package")  # n2: no evaluation
        store.add_records(first[1].run_id, [{"step": 0, "gpu_hours": 0.0, "val_reward": 0.5}])  # n4: one
        store.set_run_status(first[1].run_id, "failed", "killed")
        config = yaml.safe_load((tmp_path / "grpo.yaml").read_text())
        (tmp_path / "grpo.yaml").write_text(yaml.safe_dump({**config, "learning_rate": 1e-5}))  # the user's fix
        again = SweepDriver(load_study(study), store).plan()
        runs = store.runs_frame("mine")
    assert [run.run_id for run in again] != [run.run_id for run in first]  # another config: other runs
    # the failed n2 left nothing to keep: its retry is its one row; n4's evaluation stays with its own config
    assert sorted(zip(runs["run"], runs["status"])) == [("n2", "pending"), ("n4", "failed"), ("n4", "pending")]


def test_a_study_that_cannot_reach_a_step_names_the_profile_that_priced_it(cli, tmp_path):
    study, _ = write_setup(tmp_path, grpo={"model_name_or_path": str(tmp_path / "data")})  # not `tiny`
    spec = yaml.safe_load(study.read_text())
    del spec["compute"]["profile"]  # the default for a model other than tiny: ScaleRL's 8B on GPUs
    study.write_text(yaml.safe_dump(spec))
    code, _, err = cli("plan", study)
    assert code == 2 and "cannot reach 1 step(s)" in err
    assert "priced by profile " in err and "compute.profile chooses another" in err


@pytest.mark.parametrize(
    "form", ["directory of split files", "parquet file", "jsonl file", "save_to_disk", "save_to_disk with splits"]
)
def test_datasets_load_as_users_keep_them_with_a_fixed_held_out_part(tmp_path, form):
    import datasets
    from rlscale.runner.rl.tasks import arithmetic_task
    from rlscale.runner.trl.user_config import parse
    from rlscale.runner.trl.user_data import check_rows, load_splits

    task = arithmetic_task(2, 0)
    train, test = (
        datasets.Dataset.from_list(conversations(task.train[:40])),
        datasets.Dataset.from_list(conversations(task.validation(8))),
    )
    path = tmp_path / "data"
    if form == "directory of split files":
        path.mkdir()
        train.to_json(path / "train.jsonl")
        test.to_json(path / "test.jsonl")
    elif form == "parquet file":
        path = tmp_path / "rows.parquet"
        train.to_parquet(path)
    elif form == "jsonl file":
        path = tmp_path / "rows.jsonl"
        train.to_json(path)
    elif form == "save_to_disk":
        train.save_to_disk(path)
    else:
        datasets.DatasetDict({"train": train, "test": test}).save_to_disk(path)
    parsed = parse(
        {"dataset_name": str(path), "reward_funcs": ["x.y"], "use_cpu": True, "bf16": False, "num_generations": 2},
        file="grpo.yaml",
    )
    first = load_splits(parsed[0], parsed[3], eval_prompts=6)
    again = load_splits(parsed[0], parsed[3], eval_prompts=6)
    assert [len(part) for part in first] == (
        [40, 6] if form in ("directory of split files", "save_to_disk with splits") else [34, 6]
    )  # without a test split, 6 rows are held out
    assert first[1]["prompt"] == again[1]["prompt"]  # the same held-out rows for every run and segment
    held = {str(p) for p in first[1]["prompt"]}
    assert not held & {str(p) for p in first[0]["prompt"]}
    assert check_rows(first[0], columns=["answer"], split="train", source=str(path))  # conversational


@pytest.mark.parametrize("metric", [None, "eval_rewards/correct/mean"])
def test_each_step_is_recorded_once_with_the_studys_reward_metric_at_its_eval_steps(tmp_path, metric):
    from types import SimpleNamespace

    from rlscale.planner.recipe import Recipe
    from rlscale.runner.trl.callback import EvalRecordCallback

    recipe = Recipe.model_validate({"engine": "trl", "steps": 10, "eval_every": 2})
    log = tmp_path / "records.jsonl"
    callback = EvalRecordCallback(recipe, log, until_step=3, updates=2, metric=metric or "eval_reward")
    state, control = (
        SimpleNamespace(global_step=0),
        SimpleNamespace(should_evaluate=False, should_save=False, should_training_stop=False),
    )
    evaluation = {"eval_reward": 0.5, "eval_rewards/correct/mean": 0.25, "eval_loss": 0.0}

    def evaluate():  # what TRL does: log the evaluation's metrics, then call on_evaluate
        callback.on_log(None, state, control, logs=evaluation)
        callback.on_evaluate(None, state, control, metrics=evaluation)

    evaluate()  # eval_on_start
    for update in range(1, 7):  # TRL per update: on_step_end, the log, the evaluation if asked for
        state.global_step = update
        control.should_evaluate = False
        callback.on_step_end(None, state, control)
        callback.on_log(None, state, control, logs={"reward": update / 10, "loss": 0.0})
        if control.should_evaluate:
            evaluate()
    callback.close()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    expected = 0.25 if metric else 0.5
    assert [(line["step"], line["val_reward"]) for line in lines] == [
        (0, expected),
        (1, None),
        (2, expected),
        (3, expected),
    ]
    assert [line["metrics"].get("reward") for line in lines] == [None, 0.2, 0.4, 0.6]  # each step's own update
    assert control.should_training_stop and control.should_save  # the segment ends at until_step, checkpointed


def test_trackers_group_runs_by_study_and_continue_a_run_across_its_jobs(tmp_path, monkeypatch):
    from rlscale.runner.tracking import forwarded_env, tracker_env
    from rlscale.runner.trl.trackers import env_backends, tracker_keys

    monkeypatch.chdir(tmp_path)
    given = forwarded_env(
        {"WANDB_MODE": "offline", "WANDB_API_KEY": "secret", "MLFLOW_TRACKING_URI": "sqlite:///m.db", "HOME": "/root"}
    )
    assert given == {"WANDB_MODE": "offline", "MLFLOW_TRACKING_URI": "sqlite:///m.db"}  # credentials stay on the nodes
    jobs = [
        tracker_env(
            env_backends(["wandb", "mlflow"]), study="mine", run_key="mine-1-ab", env=given, params_logged=later
        )
        for later in (False, True)
    ]
    assert jobs[0]["WANDB_RUN_ID"] == jobs[1]["WANDB_RUN_ID"]  # one W&B run across the run's jobs
    assert jobs[0]["WANDB_PROJECT"] == jobs[0]["WANDB_RUN_GROUP"] == "mine" and jobs[0]["WANDB_RESUME"] == "allow"
    other = tracker_env(env_backends("wandb"), study="mine", run_key="mine-2-cd", env=given)
    assert other["WANDB_RUN_ID"] != jobs[0]["WANDB_RUN_ID"]
    # MLflow: the study is the experiment, at the store the sweep sees (the job runs in another directory)
    assert jobs[0]["MLFLOW_EXPERIMENT_NAME"] == "mine"
    assert jobs[0]["MLFLOW_TRACKING_URI"] == f"sqlite:///{tmp_path / 'm.db'}"
    assert "MLFLOW_MAX_LOG_PARAMS" not in jobs[0] and jobs[1]["MLFLOW_MAX_LOG_PARAMS"] == "0"  # params logged once
    assert tracker_keys(["trackio"], study="mine") == {"project": "mine"} and tracker_keys("none", study="x") == {}
    assert env_backends("all") == ["mlflow", "wandb"] and env_backends(["trackio", "none"]) == []


# ------------------------------------------------------------------------------------------ real TRL jobs on Ray


@pytest.mark.slow
def test_a_users_trl_setup_is_swept_to_equal_compute_through_kill_9_and_logged_to_mlflow(cluster, tmp_path):
    from helpers import TRL_DRIVER, kill_driver_past
    from mlflow import MlflowClient
    from ray.job_submission import JobSubmissionClient
    from rlscale.planner.planning import planned_runs
    from rlscale.planner.study_file import load_study
    from rlscale.runner.jobs_api import RunDir
    from rlscale.runner.trl.job import last_checkpoint

    # device-hours per run: each of its two jobs starts in 15-50 s (imports, model, first evaluation), counted in it;
    # 3% of it (4.3 s) is more than the slowest step seen (3.5 s, while the other run ended and the driver refitted)
    study, _ = write_setup(tmp_path, budget=0.04)
    planned = {run.name: run.gpu_hours for run in planned_runs(load_study(study))}
    url, tracking = f"sqlite:///{tmp_path / 'store.db'}", f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = [sys.executable, "-c", TRL_DRIVER, str(study), url, cluster, str(tmp_path / "shared")]
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking}
    # the node goes too: its jobs die with the driver, so the next sweep resumes them from TRL's checkpoints
    stopped = kill_driver_past(args, url, "mine", cluster, env=env)
    saved = {}  # run key -> the step of TRL's last checkpoint when its job was stopped (0: none)
    for job in stopped:
        last = last_checkpoint(RunDir(tmp_path / "shared" / job[:-2]))
        saved[job[:-2]] = int(last.name.split("-")[1]) if last else 0
    with Store(url) as store:
        before = store.records_frame("mine")
    restarted = subprocess.run(args, capture_output=True, text=True, timeout=500, env=env)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    with Store(url) as store:
        records, runs = store.records_frame("mine"), store.runs_frame("mine")
    assert list(runs["status"]) == ["done", "done"]
    assert not records.duplicated(["run_id", "step"]).any()
    names = dict(zip(runs["run_id"], runs["run"]))
    for run_id, mine in records.groupby("run_id"):
        name = names[run_id]
        assert sorted(mine["step"]) == list(range(int(mine["step"].max()) + 1))  # no step lost
        kept = before[before["run_id"] == run_id].set_index("step")["gpu_hours"]
        assert mine.set_index("step")["gpu_hours"].loc[kept.index].tolist() == kept.tolist()  # stored once
        # ended at the step nearest its planned compute (runner.engine.ComputeStop): within half a step of it,
        # whatever a step costs on this host's load
        spent = mine.sort_values("step")["gpu_hours"].to_numpy()
        assert abs(spent[-1] - planned[name]) <= max(0.03 * planned[name], spent[-1] - spent[-2])
        assert mine["gpu_hours"].is_monotonic_increasing and mine["val_reward"].notna().sum() >= 3
    assert len(stopped) >= 1
    for run_key, step in saved.items():  # a second job resumed each stopped run, from TRL's checkpoint if it had one
        lines = (tmp_path / "shared" / run_key / "logs" / f"{run_key}-2.jsonl").read_text().splitlines()
        assert yaml.safe_load(lines[0])["step"] == (step + 1 if step else 0)
    keys = {path.name for path in (tmp_path / "shared").iterdir()}
    jobs = [job.submission_id for job in JobSubmissionClient(cluster).list_jobs() if job.submission_id[:-2] in keys]
    assert len(jobs) == len(runs) + len(stopped)  # one more job per stopped one; a running one would be adopted
    # MLflow holds both runs under the study, each one run across its jobs, with the study's reward at its steps
    mlflow = MlflowClient(tracking)
    experiment = mlflow.get_experiment_by_name("mine")
    logged = {run.info.run_name: run for run in mlflow.search_runs([experiment.experiment_id])}
    assert len(logged) == 2
    assert {run.info.status for run in logged.values()} == {"FINISHED"}  # ended as the runs did (Engine.ended)
    for run_id, mine in records.groupby("run_id"):
        run_key = next(name for name in logged if name.startswith(f"mine-{run_id}-"))
        history = {}  # step -> values (a step redone after a resume is logged again)
        for metric in mlflow.get_metric_history(logged[run_key].info.run_id, "eval_reward"):
            history.setdefault(metric.step, []).append(metric.value)
        for step, value in mine.dropna(subset=["val_reward"]).set_index("step")["val_reward"].items():
            assert value == pytest.approx(history[step][0]) or value in history[step]
        assert len(mlflow.get_metric_history(logged[run_key].info.run_id, "reward")) >= mine["step"].max()
