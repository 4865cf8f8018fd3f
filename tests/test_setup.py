"""A study that starts from the user's own verl or TRL setup: the keys their files set, the recipe those keys say,
the keys the study's axes change, and the one-line refusal when both set the same key (planner/frameworks/setup.py).
The frameworks' own parsers check the composed configs in test_setup_verl.py and test_setup_trl.py."""

import json

import pytest
import yaml
from rlscale.planner.frameworks.setup import parse_override, read_setup, setup_plan
from rlscale.planner.planning import planned_runs

# verl's GSM8K GRPO example as its users launch it (examples/grpo_trainer/run_qwen3_4b_fsdp.sh, trimmed)
from rlscale.planner.study_file import load_study, stored_spec

VERL_ARGS = """# our GSM8K run
python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
    data.train_files=/data/gsm8k/train.parquet data.val_files=/data/gsm8k/test.parquet \\
    data.train_batch_size=512 \\
    data.max_response_length=1024 \\
    actor_rollout_ref.model.path=Qwen/Qwen3-4B \\
    actor_rollout_ref.model.enable_gradient_checkpointing=True \\
    actor_rollout_ref.actor.optim.lr=1e-6 \\
    actor_rollout_ref.actor.ppo_mini_batch_size=256 \\
    actor_rollout_ref.actor.fsdp_config.param_offload=True \\
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \\
    actor_rollout_ref.rollout.n=5 \\
    trainer.logger='["console","wandb"]' \\
    trainer.n_gpus_per_node=8 trainer.nnodes=1
"""

TRL_CONFIG = {
    "model_name_or_path": "/models/Qwen3-0.6B",
    "dataset_name": "/data/gsm8k",
    "learning_rate": 1e-6,
    "num_generations": 8,
    "per_device_train_batch_size": 16,
    "gradient_accumulation_steps": 4,
    "max_completion_length": 512,
    "reward_funcs": ["my_rewards.correct"],
    "report_to": ["mlflow"],
    "bf16": False,
    "use_cpu": True,
    "env": {"MY_FLAG": "1"},
}


def verl_study(tmp_path, parameters: dict, **setup) -> object:
    (tmp_path / "gsm8k.args").write_text(VERL_ARGS)
    study = {
        "name": "mine",
        "method": "isocompute",
        "seeds": 1,
        "compute": {"unit": "gpu_hours", "budget": 200, "profile": "scalerl-8b"},
        "parameters": {key: {"values": values} for key, values in parameters.items()},
        "recipe": {"engine": "verl", "trainer_devices": 8},
        "setup": {"overrides_file": "gsm8k.args", **setup},
    }
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    return tmp_path / "study.yaml"


def test_a_launch_script_is_read_as_the_overrides_verl_would_receive(tmp_path):
    (tmp_path / "gsm8k.args").write_text(VERL_ARGS)
    setup = read_setup(
        "verl",
        config=None,
        overrides=["trainer.nnodes=2"],
        overrides_file=str(tmp_path / "gsm8k.args"),
        study_file="study.yaml",
    )
    assert setup.keys["data.train_batch_size"] == 512 and setup.keys["actor_rollout_ref.rollout.n"] == 5
    assert setup.keys["trainer.logger"] == ["console", "wandb"]  # the shell's quotes gone, Hydra's list read
    assert setup.keys["actor_rollout_ref.actor.optim.lr"] == 1e-6
    assert setup.keys["trainer.nnodes"] == 2 and setup.source["trainer.nnodes"] == "study.yaml"  # the study's last
    assert setup.overrides[0] == "algorithm.adv_estimator=grpo" and len(setup.overrides) == 16


def test_overrides_in_hydras_forms():
    assert parse_override("+trainer.extra=3", file="f") == ("trainer.extra", 3)
    assert parse_override("trainer.project_name=my run", file="f") == ("trainer.project_name", "my run")
    assert parse_override("data.train_files=['/a.parquet','/b.parquet']", file="f")[1] == ["/a.parquet", "/b.parquet"]
    assert parse_override("~trainer.logger", file="f")[0] == "trainer.logger"


def test_the_recipe_takes_the_users_batch_and_the_study_its_axes(tmp_path):
    study = load_study(verl_study(tmp_path, {"rollouts": [4, 8]}, replace=["actor_rollout_ref.rollout.n"]))
    assert study.recipe.prompts_per_batch == 512 and study.recipe.model == "Qwen/Qwen3-4B"
    assert study.recipe.lr == 1e-6 and study.recipe.lr_scaling == "none" and study.recipe.max_new_tokens == 1024
    plan = setup_plan(study)
    assert plan.changed == {"actor_rollout_ref.rollout.n": "rollouts"}  # nothing else of the user's changes
    runs = planned_runs(study)
    assert [plan.values(run.recipe) for run in runs] == [
        {"actor_rollout_ref.rollout.n": 4},
        {"actor_rollout_ref.rollout.n": 8},
    ]
    assert [change.line() for change in plan.changes(runs[0].recipe)] == [
        "~ actor_rollout_ref.rollout.n: 5 -> 4  (axis rollouts)"
    ]


def test_the_jobs_trackers_group_runs_where_the_studys_mirror_does(tmp_path):
    path = verl_study(tmp_path, {"rollouts": [4, 8]}, replace=["actor_rollout_ref.rollout.n"])
    assert setup_plan(load_study(path)).study == "mine"  # no tracking block: the study
    spec = yaml.safe_load(path.read_text())
    spec["tracking"] = {"backend": "mlflow", "project": "team-rl"}
    path.write_text(yaml.safe_dump(spec))
    assert setup_plan(load_study(path)).study == "team-rl"  # as make_tracker's mirror groups them


def test_a_key_the_study_varies_and_the_users_files_set_exits_2_naming_both(tmp_path, cli):
    study = verl_study(tmp_path, {"prompts_per_batch": [256, 512]})
    code, out, err = cli("plan", study)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 2  # both keys at once, each with its file and the axis that sets it
    for line, key in zip(lines, ["actor_rollout_ref.actor.ppo_mini_batch_size", "data.train_batch_size"]):
        assert f"gsm8k.args: {key}:" in line and "prompts_per_batch axis" in line and "setup.keep" in line
    # both batch keys named: the users' mini-batch (one update per batch of 256 prompts at most) wins; the batch moves
    study = verl_study(
        tmp_path,
        {"prompts_per_batch": [256, 512]},
        keep=["actor_rollout_ref.actor.ppo_mini_batch_size"],
        replace=["data.train_batch_size"],
    )
    code, out, err = cli("plan", study, "--json")
    assert code == 0, err
    plan = setup_plan(load_study(study))
    assert [plan.values(run.recipe) for run in planned_runs(load_study(study))] == [
        {"data.train_batch_size": 256},
        {"data.train_batch_size": 512},
    ]


def test_keep_or_replace_naming_a_key_the_study_does_not_change_is_a_typo(tmp_path, cli):
    study = verl_study(
        tmp_path, {"rollouts": [4, 8]}, replace=["actor_rollout_ref.rollout.n", "actor_rollout_ref.rollout.nn"]
    )
    code, out, err = cli("plan", study)
    assert code == 2 and "setup.replace" in err and "actor_rollout_ref.rollout.nn" in err


def test_a_trl_config_gives_the_batch_trl_would_generate(tmp_path):
    (tmp_path / "grpo.yaml").write_text(yaml.safe_dump(TRL_CONFIG))
    study = {
        "name": "t",
        "method": "grid",
        "parameters": {"rollouts": {"values": [4, 8]}},
        "recipe": {"engine": "trl"},
        "setup": {"config": "grpo.yaml", "replace": ["num_generations"]},
    }
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(study))
    loaded = load_study(tmp_path / "t.yaml")
    # 16 completions per device x 4 accumulation steps = 64 per generation batch, 8 per prompt
    assert loaded.recipe.prompts_per_batch == 8 and loaded.recipe.model == "/models/Qwen3-0.6B"
    plan = setup_plan(loaded)
    assert plan.setup.env == {"MY_FLAG": "1"} and "env" not in plan.setup.keys  # the job's, not the driver's
    # the study sets the generation batch, so TRL's other way to give it goes
    assert set(plan.changed) == {"num_generations", "generation_batch_size", "steps_per_generation"}
    run = planned_runs(loaded)[1]
    assert plan.values(run.recipe) == {"num_generations": 8, "generation_batch_size": 64, "steps_per_generation": None}


@pytest.mark.parametrize(
    "block, message",
    [
        ({"config": "missing.yaml"}, "file not found"),
        ({}, "setup.config"),
    ],
)
def test_a_trl_setup_without_its_file_exits_2(tmp_path, cli, block, message):
    study = {
        "name": "t",
        "method": "grid",
        "parameters": {"rollouts": {"values": [4]}},
        "recipe": {"engine": "trl"},
        "setup": block,
    }
    (tmp_path / "t.yaml").write_text(json.dumps(study))
    code, out, err = cli("plan", tmp_path / "t.yaml")
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_a_setup_needs_a_framework_engine(tmp_path, cli):
    (tmp_path / "t.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "t",
                "method": "grid",
                "parameters": {"rollouts": {"values": [4]}},
                "setup": {"overrides": ["data.train_batch_size=8"]},
            }
        )
    )
    code, out, err = cli("plan", tmp_path / "t.yaml")
    assert code == 2 and "setup" in err and "engine" in err


def test_the_decision_exports_as_the_users_own_launch_with_only_the_decided_keys_changed(tmp_path):
    from rlscale.planner.frameworks.setup import export_setup, parse_override

    study = load_study(verl_study(tmp_path, {"rollouts": [4, 8]}, replace=["actor_rollout_ref.rollout.n"]))
    decided = planned_runs(study)[1].recipe.model_copy(update={"steps": 300})
    script = export_setup(setup_plan(study), decided, ["decided: B_p 512, n 8, M 300"])
    words = [line.strip().rstrip("\\").strip() for line in script.splitlines() if not line.startswith("#")]
    assert words[0] == "python3 -m verl.trainer.main_ppo"
    keys = dict(parse_override(word.strip("'"), file="") for word in words[1:] if word)
    mine = read_setup(
        "verl", config=None, overrides=[], overrides_file=str(tmp_path / "gsm8k.args"), study_file=None
    ).keys
    assert keys == {**mine, "actor_rollout_ref.rollout.n": 8, "trainer.total_training_steps": 300}


def test_the_decision_exports_as_the_users_own_trl_yaml(tmp_path):
    from rlscale.planner.frameworks.setup import export_setup

    (tmp_path / "grpo.yaml").write_text(yaml.safe_dump(TRL_CONFIG))
    study = {
        "name": "t",
        "method": "grid",
        "parameters": {"rollouts": {"values": [4, 8]}},
        "recipe": {"engine": "trl"},
        "setup": {"config": "grpo.yaml", "replace": ["num_generations"]},
    }
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(study))
    loaded = load_study(tmp_path / "t.yaml")
    exported = yaml.safe_load(export_setup(setup_plan(loaded), planned_runs(loaded)[0].recipe, ["decided"]))
    # 32 completions (8 prompts x 4) on 16 per device: 2 micro-batches, so one update each as the user's 4 of 4 gave
    expected = {
        **TRL_CONFIG,
        "num_generations": 4,
        "generation_batch_size": 32,
        "max_steps": loaded.recipe.steps,
        "gradient_accumulation_steps": 2,
    }
    assert exported == expected  # the user's keys (and env block) kept, the decision's set


def seed_decided(study, url: str) -> None:
    """Two done runs of `study`'s plan in the store at `url`, the second (the larger n) the better."""
    from rlscale.db.store import Store
    from rlscale.runner.sweep.state import run_name

    with Store(url) as store:
        store.upsert_study(study.name, stored_spec(study))  # as the sweep driver stores it
        for point, asymptote in zip(planned_runs(study), (0.6, 0.8)):
            run_id = store.ensure_run(study.name, run_name(point, False), point.recipe.to_json(), point.seed)
            store.add_records(
                run_id,
                [
                    {
                        "step": step,
                        "gpu_hours": 2.0 * step,
                        "rollouts": step,
                        "tokens": 0,
                        "val_reward": 0.2 + (asymptote - 0.2) / (1 + (40 / (2.0 * step)) ** 1.5) if step else 0.2,
                    }
                    for step in range(0, 101, 5)
                ],
            )
            store.set_run_status(run_id, "done")


def test_export_of_a_setup_study_is_the_users_launch_with_the_best_runs_keys(tmp_path, cli):
    study = load_study(verl_study(tmp_path, {"rollouts": [4, 8]}, replace=["actor_rollout_ref.rollout.n"]))
    url = f"sqlite:///{tmp_path / 'store.db'}"
    seed_decided(study, url)
    code, out, err = cli("export", "--format", "verl", "--study", "mine", "--db", url)
    assert code == 0, err
    assert "actor_rollout_ref.rollout.n=8" in out and "actor_rollout_ref.rollout.n=5" not in out
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size=2" in out  # the user's own keys, as they wrote them
    assert "# your setup:" in out and "~ actor_rollout_ref.rollout.n: 5 -> 8" in out


@pytest.mark.parametrize("config_dir", [".", "configs"])  # beside the config, or where the sweep ran above it
def test_a_trl_export_names_the_users_local_files_as_the_jobs_did_from_any_directory(
    tmp_path, cli, monkeypatch, config_dir
):
    # the sweep's jobs read `data/train.jsonl` as `trl grpo` would, from where they ran or beside the config; the
    # exported YAML must name the same file when the export runs from elsewhere
    folder = tmp_path / "setup"
    (folder / "data").mkdir(parents=True)
    (folder / config_dir).mkdir(exist_ok=True)
    (folder / "data" / "train.jsonl").write_text('{"prompt": "1+1=", "solution": "2"}\n')
    (folder / config_dir / "grpo.yaml").write_text(yaml.safe_dump({**TRL_CONFIG, "dataset_name": "data/train.jsonl"}))
    (folder / "my_rewards.py").write_text(
        "def correct(completions, **kwargs):\n    return [1.0 for _ in completions]\n"
    )
    spec = {
        "name": "mine",
        "method": "grid",
        "parameters": {"rollouts": {"values": [4, 8]}},
        "recipe": {"engine": "trl"},
        "setup": {"config": f"{config_dir}/grpo.yaml", "replace": ["num_generations"]},
    }
    (folder / "t.yaml").write_text(yaml.safe_dump(spec))
    monkeypatch.chdir(folder)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    seed_decided(load_study(folder / "t.yaml"), url)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    code, out, err = cli("export", "--format", "trl", "--study", "mine", "--db", url)
    assert code == 0, err
    exported = yaml.safe_load(out)
    assert exported["dataset_name"] == str(folder / "data" / "train.jsonl")
    assert exported["num_generations"] == 8 and exported["model_name_or_path"] == "/models/Qwen3-0.6B"
    assert f"run with PYTHONPATH={folder}\n" in out  # where the jobs imported my_rewards.correct from


def test_a_bad_value_in_the_users_file_names_that_file_and_key(tmp_path, cli):
    study = verl_study(tmp_path, {"rollouts": [4, 8]}, replace=["actor_rollout_ref.rollout.n"])
    (tmp_path / "gsm8k.args").write_text(VERL_ARGS.replace("optim.lr=1e-6", "optim.lr=fast"))
    code, out, err = cli("plan", study)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "gsm8k.args: actor_rollout_ref.actor.optim.lr:" in err and "'fast'" in err


def test_a_recipe_value_the_users_file_contradicts_is_refused(tmp_path, cli):
    spec = yaml.safe_load(
        verl_study(tmp_path, {"rollouts": [4, 8]}, replace=["actor_rollout_ref.rollout.n"]).read_text()
    )
    spec["recipe"]["lr"] = 3e-6  # the file says 1e-6, and the job would train with the file's
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(spec))
    code, out, err = cli("plan", tmp_path / "study.yaml")
    assert code == 2 and "recipe.lr" in err and "actor_rollout_ref.actor.optim.lr" in err and "gsm8k.args" in err
