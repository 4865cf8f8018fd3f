"""A verl study on the user's own setup, as a verl user brings it: verl's GSM8K GRPO example (launch-script overrides
and a YAML of their own), their parquet files and their reward function. The job runs their command with only the
study's axes and each run's own keys changed; verl 0.9.1 itself composes and validates it (tests/checkers/
verl_engine_check.py in .venv-verl); bad data or reward exits 2 before anything is stored; the stand-in job reads
their data, calls their reward and its records reach the store under the study's reward metric."""

import json
import math
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from rlscale.planner.frameworks.setup import setup_plan
from rlscale.planner.frameworks.verl import RUN_KEYS
from rlscale.planner.planning import planned_runs
from rlscale.planner.study_file import load_study
from rlscale.runner.engine import COMPUTE_STEP_CAP
from rlscale.runner.verl.engine import VerlEngine
from rlscale.runner.verl.setup import override_key, user_command

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
# verl's GSM8K GRPO example as its users run it (examples/grpo_trainer/run_qwen3_4b_fsdp.sh, defaults filled in, the
# actor's params offloaded), data in this test's folder, and an older script's reward under verl's legacy keys
GSM8K = """python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
    data.train_files={data}/train.parquet data.val_files={data}/test.parquet \\
    data.train_batch_size=16 data.max_prompt_length=1024 data.max_response_length=1024 \\
    data.filter_overlong_prompts=True data.truncation=error \\
    algorithm.use_kl_in_reward=False \\
    actor_rollout_ref.model.path=Qwen/Qwen3-4B \\
    actor_rollout_ref.model.use_remove_padding=True \\
    actor_rollout_ref.model.enable_gradient_checkpointing=True \\
    actor_rollout_ref.actor.optim.lr=1e-6 \\
    actor_rollout_ref.actor.ppo_mini_batch_size=8 \\
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \\
    actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef=0.001 \\
    actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.actor.entropy_coeff=0 \\
    actor_rollout_ref.actor.fsdp_config.param_offload=True \\
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \\
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=3000 actor_rollout_ref.actor.use_dynamic_bsz=True \\
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2 \\
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \\
    actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \\
    actor_rollout_ref.rollout.enable_chunked_prefill=False actor_rollout_ref.rollout.enforce_eager=False \\
    actor_rollout_ref.rollout.free_cache_engine=True \\
    actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True \\
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=4096 \\
    actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=4096 \\
    actor_rollout_ref.rollout.n=5 \\
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2 \\
    actor_rollout_ref.ref.fsdp_config.param_offload=True \\
    actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=8192 \\
    custom_reward_function.path={data}/rewards.py custom_reward_function.name=gsm8k_strict \\
    trainer.critic_warmup=0 \\
    trainer.logger='["console","wandb"]' \\
    trainer.project_name=verl_grpo_example_gsm8k trainer.experiment_name=qwen3_4b \\
    trainer.n_gpus_per_node=8 trainer.nnodes=1 \\
    trainer.save_freq=20 trainer.test_freq=5 trainer.total_epochs=15
"""
# the user's YAML: verl's pattern (defaults: ppo_trainer), without verl's search path; a cosine schedule
USER_YAML = {
    "defaults": ["ppo_trainer", "_self_"],
    "actor_rollout_ref": {"actor": {"optim": {"lr_scheduler_type": "cosine", "lr_warmup_steps_ratio": 0.05}}},
}
REWARDS = r'''import re


def gsm8k_strict(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """1.0 for a final answer `#### N` equal to the ground truth."""
    found = re.findall(r"#### (-?[0-9.,]+)", solution_str)
    return float(bool(found) and found[-1].replace(",", "") == ground_truth)
'''
TP = "actor_rollout_ref.rollout.tensor_model_parallel_size"
OFFLOAD = "actor_rollout_ref.actor.fsdp_config.param_offload"
CHECKPOINTING = "actor_rollout_ref.model.enable_gradient_checkpointing"


def gsm8k_rows(count: int, split: str, source: str = "openai/gsm8k") -> list[dict]:
    """Rows as verl's examples/data_preprocess/gsm8k.py writes them."""
    return [
        {
            "data_source": source,
            "prompt": [
                {
                    "role": "user",
                    "content": f"What is {i} + {i}? Let's think step by step and output the "
                    'final answer after "####".',
                }
            ],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"split": split, "index": i, "answer": f"#### {2 * i}", "question": f"{i} + {i}"},
        }
        for i in range(count)
    ]


def write_parquet(path: Path, rows: list[dict]) -> Path:
    import pandas as pd

    pd.DataFrame(rows).to_parquet(path, index=False)
    return path


def gsm8k_study(tmp_path: Path, *, args: str = GSM8K, rows=None, **setup) -> Path:
    """The user's files and a study over rollouts n on them; returns the study file."""
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    write_parquet(data / "train.parquet", rows if rows is not None else gsm8k_rows(32, "train"))
    write_parquet(data / "test.parquet", gsm8k_rows(6, "test"))
    (data / "rewards.py").write_text(REWARDS)
    (tmp_path / "gsm8k.args").write_text(args.format(data=data))
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(USER_YAML))
    study = {
        "name": "gsm8k_n",
        "method": "grid",
        "seeds": 1,
        "parameters": {"rollouts": {"values": [4, 8]}},
        "recipe": {"engine": "verl", "trainer_devices": 4, "steps": 100},
        "setup": {
            "config": "mine.yaml",
            "overrides_file": "gsm8k.args",
            "replace": ["actor_rollout_ref.rollout.n"],
            **setup,
        },
    }
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    return tmp_path / "study.yaml"


def without_yaml(study: Path) -> Path:
    """The study with no setup.config: the overrides file says the whole command."""
    data = yaml.safe_load(study.read_text())
    del data["setup"]["config"]
    study.write_text(yaml.safe_dump(data))
    return study


def dry_run(cli, study: Path, tmp_path: Path, *, plain: bool = False) -> tuple[int, list | str | None, str]:
    """`rlscale sweep STUDY --dry-run` (--json unless `plain`): its exit code, points (or plain text) and stderr.
    verl's environment composes every job: skipped without it (a failure in CI)."""
    checker_python()
    code, out, err = cli(
        "sweep",
        study,
        "--dry-run",
        *([] if plain else ["--json"]),
        "--db",
        f"sqlite:///{tmp_path / 'never.db'}",
        "--shared-dir",
        "/nfs/rl",
        "--ray-address",
        "http://head:8265",
    )
    return code, (out if plain else json.loads(out)) if code == 0 else None, err


def test_the_job_runs_the_users_command_changing_only_the_studys_and_the_runs_keys(cli, tmp_path):
    code, points, err = dry_run(cli, gsm8k_study(tmp_path), tmp_path)
    assert code == 0, err
    first = points[0]
    words = first["overrides"]
    # the user's YAML from its own folder, verl's configs on Hydra's search path; then their words
    assert words[:3] == [
        f"--config-path={tmp_path}",
        "--config-name=mine",
        "hydra.searchpath=['pkg://verl.trainer.config']",
    ]
    keys = [override_key(word) for word in words[3:]]
    assert len(keys) == len(set(keys))  # each key once
    given = dict(word.split("=", 1) for word in words[3:])
    # deployment stays as the user wrote it
    assert (given[TP], given[OFFLOAD], given[CHECKPOINTING]) == ("2", "True", "True")
    assert given["actor_rollout_ref.rollout.gpu_memory_utilization"] == "0.6"
    assert given["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] == "3000"
    assert given["data.train_files"] == str(tmp_path / "data" / "train.parquet")
    # every change the dry-run lists is in the command, and the command changes nothing else of the user's words
    changes = {change["key"]: change for change in first["changes"]}
    for key, change in changes.items():
        if change["after"] is not None:
            assert yaml.safe_load(given[key]) == change["after"], key
    user = dict(
        word.split("=", 1)
        for word in Path(tmp_path / "gsm8k.args").read_text().split()
        if "=" in word and not word.startswith("custom_reward")
    )
    assert {key for key in user if user[key] != given.get(key)} <= set(changes)
    # why, in the study's words: the axis, the compute stop, checkpoints, devices, seeds, loggers, names
    rollouts = changes["actor_rollout_ref.rollout.n"]
    assert (rollouts["before"], rollouts["after"], rollouts["why"]) == (5, 4, "axis rollouts")
    assert changes["trainer.n_gpus_per_node"]["after"] == 4
    assert changes["trainer.logger"]["after"] == ["console", "wandb", "file"]
    assert changes["trainer.project_name"]["after"] == "gsm8k_n"
    assert changes["trainer.experiment_name"]["after"] == "RUN_KEY"
    assert {change["key"] for change in first["changes"] if change["why"] == "seed"} >= {"data.seed"}
    moved = ("reward.", "custom_reward_function.", "actor_rollout_ref.actor.optim.")
    assert {key for key in changes if not key.startswith(moved)} - {"actor_rollout_ref.rollout.n"} <= RUN_KEYS
    # verl's legacy reward keys, which main_ppo ignores, moved to the live ones
    assert given["reward.custom_reward_function.path"] == str(tmp_path / "data" / "rewards.py")
    assert changes["custom_reward_function.path"]["after"] is None
    # the cosine decays over the run's 100 planned steps (its one job ends there: nothing to rescale); the warmup
    # ratio becomes steps of them (planner/frameworks/schedule.py)
    assert "actor_rollout_ref.actor.optim.lr_scheduler_type" not in changes
    assert changes["actor_rollout_ref.actor.optim.lr_warmup_steps"]["after"] == 5  # ceil(0.05 x 100)
    # the user's W&B run continues across segments; the study's reward is verl's validation reward of their source
    assert first["env_vars"]["WANDB_RUN_ID"] == "RUN_KEY" and first["env_vars"]["WANDB_RESUME"] == "allow"
    assert first["reward_metric"] == ["val-core/openai/gsm8k/reward/mean@1", "val-aux/openai/gsm8k/reward/mean@1"]
    assert first["setup_files"] == [str(tmp_path / "mine.yaml"), str(tmp_path / "gsm8k.args")]
    assert first["notes"] == ["reward: gsm8k_strict from " + str(tmp_path / "data" / "rewards.py")]
    assert not (tmp_path / "never.db").exists()


def test_a_key_the_study_varies_that_the_users_files_set_exits_2_through_the_sweep(cli, tmp_path):
    study = gsm8k_study(tmp_path, replace=[])
    code, _, err = dry_run(cli, study, tmp_path)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"{tmp_path / 'gsm8k.args'}: actor_rollout_ref.rollout.n" in err
    assert not (tmp_path / "never.db").exists()


def drop(rows: list[dict], column: str) -> list[dict]:
    return [{key: value for key, value in row.items() if key != column} for row in rows]


@pytest.mark.parametrize(
    "case, rows, args, where",
    [
        (
            "no data_source column",
            drop(gsm8k_rows(32, "train"), "data_source"),
            GSM8K,
            ("train.parquet", "data_source"),
        ),
        (
            "no ground truth",
            [{**row, "reward_model": {"style": "rule"}} for row in gsm8k_rows(32, "train")],
            GSM8K,
            ("train.parquet", "reward_model.ground_truth"),
        ),
        (
            "a row without a prompt",
            [*gsm8k_rows(31, "train"), {**gsm8k_rows(1, "train")[0], "prompt": []}],
            GSM8K,
            ("train.parquet", "prompt"),
        ),
        (
            "a reward file that does not exist",
            None,
            GSM8K.replace("rewards.py", "rewardz.py"),
            ("gsm8k.args", "reward.custom_reward_function.path"),
        ),
        (
            "a reward function the file does not define",
            None,
            GSM8K.replace("name=gsm8k_strict", "name=gsm8k_score"),
            ("rewards.py", "reward.custom_reward_function.name"),
        ),
        ("fewer rows than a batch", gsm8k_rows(8, "train"), GSM8K, ("gsm8k.args", "data.train_batch_size")),
    ],
)
def test_bad_data_or_reward_exits_2_naming_the_file_and_field_and_stores_nothing(
    cli, tmp_path, case, rows, args, where
):
    study = gsm8k_study(tmp_path, args=args, rows=rows)
    db = tmp_path / "store.db"
    code, out, err = cli(
        "sweep",
        study,
        "--db",
        f"sqlite:///{db}",
        "--shared-dir",
        str(tmp_path / "shared"),
        "--ray-address",
        "http://127.0.0.1:9",
    )
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    file, field = where
    assert f"{file}: {field}:" in err, err
    assert not db.exists() and not (tmp_path / "shared").exists()


def test_files_only_the_cluster_sees_are_noted_not_refused(cli, tmp_path):
    args = GSM8K.replace("{data}/train.parquet", "/cluster/gsm8k/train.parquet").replace(
        "{data}/rewards.py", "/cluster/rewards.py"
    )
    code, points, err = dry_run(cli, gsm8k_study(tmp_path, args=args), tmp_path)
    assert code == 0, err
    notes = points[0]["notes"]
    assert any(note.startswith("data.train_files: /cluster/gsm8k/train.parquet") for note in notes)
    assert any(note.startswith("reward.custom_reward_function.path: /cluster/rewards.py") for note in notes)


def test_legacy_and_live_reward_keys_both_set_exit_2(cli, tmp_path):
    args = GSM8K + "    reward.custom_reward_function.path=/elsewhere/r.py\n"
    code, _, err = dry_run(cli, gsm8k_study(tmp_path, args=args), tmp_path)
    assert code == 2 and "custom_reward_function.path" in err and "gsm8k.args" in err


def test_rollout_parallelism_must_divide_the_runs_gpus(cli, tmp_path):
    args = GSM8K.replace(f"{TP}=2", f"{TP}=8")
    code, _, err = dry_run(cli, gsm8k_study(tmp_path, args=args), tmp_path)
    assert code == 2 and f"gsm8k.args: {TP}:" in err and "trainer_devices" in err


# verl's megatron example as its users keep it (examples/grpo_trainer/run_qwen3_8b_megatron.sh, trimmed): the megatron
# engine by config group, a `+` key, the dapo reward manager, dynamic batches
MEGATRON = """python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo algorithm.use_kl_in_reward=False \\
    data.train_files={data}/train.parquet data.val_files={data}/test.parquet \\
    data.train_batch_size=16 data.max_prompt_length=1024 data.max_response_length=2048 \\
    actor_rollout_ref.model.path=Qwen/Qwen3-8B actor_rollout_ref.actor.optim.lr=1e-6 \\
    actor_rollout_ref.actor.ppo_mini_batch_size=8 actor_rollout_ref.actor.use_dynamic_bsz=True \\
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24576 \\
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 \\
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2 \\
    +actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method=uniform \\
    reward.reward_manager.name=dapo \\
    actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.tensor_model_parallel_size=2 \\
    actor_rollout_ref.rollout.n=5 actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True \\
    trainer.logger='["console"]' trainer.n_gpus_per_node=8 trainer.nnodes=1 \\
    model_engine=megatron
"""
MEGATRON_SEED = "actor_rollout_ref.actor.megatron.seed"


@pytest.mark.parametrize("form", ["model_engine=megatron", "--config-name=ppo_megatron_trainer"])
def test_megatron_gets_megatron_seeds_and_every_job_composes_with_verl(cli, tmp_path, form):
    args = MEGATRON if form == "model_engine=megatron" else MEGATRON.replace("model_engine=megatron", form)
    code, points, err = dry_run(cli, without_yaml(gsm8k_study(tmp_path, args=args)), tmp_path)
    assert code == 0, err
    for point in points:
        given = dict(word.split("=", 1) for word in point["overrides"] if "=" in word)
        assert given[MEGATRON_SEED] == "0" and not any("fsdp_config" in key for key in given)
        assert point["composed"]["version"] == "0.9.1"
        assert point["composed"]["config"] == ("ppo_trainer" if form.startswith("model") else "ppo_megatron_trainer")
    assert (
        "+actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method=uniform" in point["overrides"]
    )


def test_every_key_verl_would_refuse_exits_2_at_once_naming_the_file_and_key(cli, tmp_path):
    args = GSM8K.replace(f"{TP}=2", "actor_rollout_ref.rollout.tensor_model_paralel_size=2").replace(
        "trainer.critic_warmup=0", "trainer.critic_warmup=0 trainer.val_befor_train=False"
    )
    code, _, err = dry_run(cli, gsm8k_study(tmp_path, args=args), tmp_path)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 2, err
    for line, key in zip(lines, ["actor_rollout_ref.rollout.tensor_model_paralel_size", "trainer.val_befor_train"]):
        assert f"gsm8k.args: {key}: not a key of verl 0.9.1's" in line


def test_conflicts_come_at_once_each_with_its_file_key_and_the_axis_that_sets_it(cli, tmp_path):
    study = gsm8k_study(tmp_path, replace=[])
    data = yaml.safe_load(study.read_text())
    data["parameters"]["prompts_per_batch"] = {"values": [8, 16]}
    study.write_text(yaml.safe_dump(data))
    code, _, err = dry_run(cli, study, tmp_path)
    found = {line.split(": ")[1]: line for line in err.strip().removeprefix("error: ").splitlines()}
    assert code == 2 and set(found) == {
        "actor_rollout_ref.actor.ppo_mini_batch_size",
        "actor_rollout_ref.rollout.n",
        "data.train_batch_size",
    }, err
    assert "by the study's rollouts axis" in found["actor_rollout_ref.rollout.n"]  # n is set by the rollouts axis only
    assert "by the study's prompts_per_batch axis" in found["data.train_batch_size"]
    assert all(line.startswith(str(tmp_path / "gsm8k.args")) for line in found.values())


def test_keep_of_an_axis_key_is_refused_naming_the_axis_it_would_defeat(cli, tmp_path):
    code, _, err = dry_run(cli, gsm8k_study(tmp_path, replace=[], keep=["actor_rollout_ref.rollout.n"]), tmp_path)
    assert code == 2 and "study.yaml: setup.keep: keep actor_rollout_ref.rollout.n would defeat" in err
    assert "rollouts axis" in err and "your 5" in err


def test_hydra_flags_in_the_overrides_file_name_the_config_and_the_file(cli, tmp_path):
    flags = f"--config-path={tmp_path} --config-name=mine"
    study = without_yaml(gsm8k_study(tmp_path, args=GSM8K.replace("main_ppo", f"main_ppo {flags}")))
    code, points, err = dry_run(cli, study, tmp_path)
    assert code == 0, err
    assert points[0]["composed"]["config"] == "mine"
    assert points[0]["setup_files"] == [str(tmp_path / "mine.yaml"), str(tmp_path / "gsm8k.args")]
    flags = "--config-path=conf --config-name=mine"
    (tmp_path / "gsm8k.args").write_text(GSM8K.replace("main_ppo", f"main_ppo {flags}").format(data=tmp_path))
    code, _, err = dry_run(cli, study, tmp_path)
    assert code == 2 and f"{tmp_path / 'gsm8k.args'}: --config-path: relative" in err


def test_the_plain_dry_run_says_what_verl_composed_notes_cluster_paths_and_names_the_commands(cli, tmp_path):
    args = GSM8K.replace("{data}/train.parquet", "/cluster/gsm8k/train.parquet")
    code, out, err = dry_run(cli, gsm8k_study(tmp_path, args=args), tmp_path, plain=True)
    assert code == 0, err
    lines = out.splitlines()
    assert lines.count("  composed with verl 0.9.1 (mine): ok") == 2 and "composed with verl 0.9.1: 2 of 2" in lines
    text = " ".join(out.split())  # lines wrap at 80 columns
    assert all(len(line) <= 80 or " " not in line.strip() for line in lines)  # a long path alone may be longer
    assert "your setup: " + ", ".join([str(tmp_path / "mine.yaml"), str(tmp_path / "gsm8k.args")]) in text
    assert any(line.startswith("  note: data.train_files: /cluster/gsm8k/train.parquet") for line in lines)
    commands = Path(next(line for line in lines if line.startswith("each job's full command: ")).split(": ", 1)[1])
    script = commands.read_text()
    assert script.count("python3 -m verl.trainer.main_ppo") == 2 and "actor_rollout_ref.rollout.n=8" in script
    assert "VERL_FILE_LOGGER_PATH=/nfs/rl/RUN_KEY/logs/RUN_KEY-1.jsonl" in script


def test_the_study_names_its_reward_metric_and_records_carry_it_as_val_reward(tmp_path):
    study = load_study(gsm8k_study(tmp_path, reward_metric="val-core/openai/gsm8k/acc/mean@1"))
    engine = VerlEngine(shared_dir=tmp_path / "shared", setup=setup_plan(study))
    recipe = planned_runs(study)[0].recipe
    line = {"val-core/openai/gsm8k/acc/mean@1": 0.75, "val-aux/openai/gsm8k/reward/mean@1": 0.5}
    records = engine.record_maker(recipe).records(
        [{"step": 0, "data": line}], job="j", devices=4, base_device_seconds=0.0
    )
    assert records[0]["val_reward"] == 0.75


@pytest.mark.parametrize(
    "line, expected",
    [
        ({"val-core/a/acc/mean@4": 0.5, "val-aux/a/reward/mean@4": 0.5}, 0.5),  # a float score: verl's acc is core
        ({"val-core/a/reward/mean@4": 0.25, "val-aux/a/score/mean@4": 0.25}, 0.25),  # a dict {"score": ...}
        ({"val-core/a/acc/mean@4": 1.0, "val-aux/a/reward/mean@4": -1.0}, -1.0),  # acc and reward differ: the reward
        ({"val-aux/b/reward/mean@4": 0.6, "val-core/a/reward/mean@8": 0.6}, None),  # another source, another n
    ],
)
def test_the_default_reward_metric_is_verls_validation_reward_of_the_data_source(line, expected):
    from rlscale.runner.verl.logs import reward_metrics

    assert reward_metrics("a", 4).value(line) == expected


def test_several_data_sources_count_once_each():
    from rlscale.runner.verl.logs import ANY_SOURCE, reward_metrics

    line = {"val-aux/a/reward/mean@4": 0.2, "val-aux/b/reward/mean@4": 0.6, "val-aux/b/reward/mean@8": 0.9}
    assert reward_metrics(ANY_SOURCE, 4).value(line) == pytest.approx(0.4)


@pytest.mark.parametrize("with_setup", [True, False])
def test_a_compute_stopped_run_may_train_past_its_planned_steps_up_to_the_cap(tmp_path, with_setup):
    from rlscale.planner.recipe import Recipe

    if with_setup:
        study = load_study(gsm8k_study(tmp_path))
        engine, recipe = VerlEngine(shared_dir=tmp_path / "s", setup=setup_plan(study)), planned_runs(study)[0].recipe
    else:
        engine, recipe = VerlEngine(shared_dir=tmp_path / "s"), Recipe(engine="verl", model="/m", steps=100)
    job = engine.job(recipe, "r-1-a", 1, until_step=recipe.steps * COMPUTE_STEP_CAP)
    given = dict(word.split("=", 1) for word in shlex.split(job.entrypoint)[3:] if "=" in word)
    assert int(given["trainer.total_training_steps"]) == recipe.steps * COMPUTE_STEP_CAP
    assert int(given["trainer.total_epochs"]) >= recipe.steps * COMPUTE_STEP_CAP  # at least a step an epoch
    # the dry-run shows the same first job when told the run's planned compute
    shown = engine.dry_run(recipe, "r-1-a", gpu_hours=1.0)["overrides"]
    assert f"trainer.total_training_steps={recipe.steps * COMPUTE_STEP_CAP}" in shown


# verl 0.9.1 itself: the job's command composed and validated --------------------------------------------------


def checker_python() -> Path:
    from helpers import python_of

    return python_of(".venv-verl")


@pytest.fixture(scope="module")
def verl_composed(tmp_path_factory):
    """The checker's reading of run 0's first job and of the user's own command, with the engine's view of both."""
    from rlscale.runner.rl.policy import build_tokenizer

    python = checker_python()
    tmp = tmp_path_factory.mktemp("setup_verl")
    study = load_study(gsm8k_study(tmp))
    plan = setup_plan(study)
    engine = VerlEngine(shared_dir=tmp / "shared", setup=plan)
    recipe = planned_runs(study)[0].recipe
    first = engine.dry_run(recipe, "gsm8k_n-1-abc")
    build_tokenizer().save_pretrained(tmp / "tokenizer")
    cases = [
        {"data_source": "openai/gsm8k", "solution_str": text, "ground_truth": "4", "extra_info": {}}
        for text in ("so #### 4", "#### 5", "4")
    ]
    spec = {
        "setup": {
            "command": first["overrides"],
            "user_command": user_command(plan.setup),
            "tokenizer": str(tmp / "tokenizer"),
            "reward_cases": cases,
        }
    }
    out = tmp / "result.json"
    done = subprocess.run(
        [str(python), str(TESTS / "checkers" / "verl_engine_check.py"), str(out)],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp,
    )
    assert done.returncode == 0 and out.exists(), done.stderr[-3000:]
    result = json.loads(out.read_text())
    errors = {key: value for key, value in result.items() if key.endswith("_error")}
    assert not errors, errors
    return result, first["changes"], engine.val_reward(recipe), plan


def test_verl_composes_and_validates_the_jobs_command_keeping_the_users_deployment(verl_composed):
    result, changes, _, plan = verl_composed
    job, user = result["setup_config"]["job"], result["setup_config"]["user"]
    assert (job[TP], job[OFFLOAD], job[CHECKPOINTING]) == (2, True, True)
    assert job["actor_rollout_ref.rollout.n"] == 4 and job["trainer.n_gpus_per_node"] == 4  # the axis; the devices
    assert result["setup_config"]["reference_policy"]  # the user's KL loss keeps verl's reference policy
    # every key the user's own command composes to survives, except the ones the dry-run lists
    listed = {change["key"] for change in changes}
    changed = {key for key in job.keys() | user.keys() if job.get(key) != user.get(key)}
    assert changed <= listed, changed - listed
    for change in changes:
        assert job.get(change["key"]) == change["after"], change["key"]
    # rlscale's assumptions about verl's defaults, read from verl: the user's loggers, their validation samples
    assert job["trainer.logger"] == [*user["trainer.logger"], "file"]


def test_verl_reads_the_moved_reward_as_its_own_migration_would_and_loads_the_users_function(verl_composed):
    result = verl_composed[0]
    job = result["setup_config"]["job"]
    migrated = result["setup_config"]["user_reward_migrated"]
    assert {key: job[f"reward.{key}"] for key in migrated} == migrated
    assert result["setup_rewards"] == [1.0, 0.0, 0.0]  # the user's strict "#### N" scorer


def test_the_schedule_no_longer_depends_on_the_segments_total_steps(verl_composed):
    optim = verl_composed[0]["setup_config"]["optim"]
    assert optim["lr_scheduler_type"] == "cosine" and optim["lr_warmup_steps"] == 5


def test_verls_dataset_reads_the_users_parquet_and_the_reward_metric_names_its_source(verl_composed):
    result, _, metric, _ = verl_composed
    dataset = result["setup_dataset"]
    row = gsm8k_rows(1, "train")[0]
    assert dataset["train"]["len"] == 32 and dataset["val"]["len"] == 6
    assert dataset["train"]["raw_prompt"] == row["prompt"] and dataset["train"]["data_source"] == "openai/gsm8k"
    samples = result["setup_config"]["user"]["actor_rollout_ref.rollout.val_kwargs.n"]
    assert metric.names[0] == f"val-core/openai/gsm8k/reward/mean@{samples}"


# the stand-in job on a Ray cluster: the user's parquet, the user's reward function, the store ------------------

SCORES = """def exact(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0 if solution_str == f"#### {ground_truth}" else 0.0
"""


@pytest.mark.slow
def test_a_sweep_reads_the_users_parquet_scores_with_their_function_and_stores_the_studys_reward(cluster, tmp_path):
    from rlscale.db.store import Store
    from rlscale.runner.sweep.driver import SweepDriver

    checker_python()  # each job sets only the keys verl's Hydra composes from the user's command
    data = tmp_path / "data"
    data.mkdir()
    write_parquet(data / "train.parquet", gsm8k_rows(8, "train", source="my_math"))
    write_parquet(data / "val.parquet", gsm8k_rows(5, "test", source="my_math"))
    (data / "scores.py").write_text(SCORES)
    (tmp_path / "run.args").write_text(
        f"data.train_files={data}/train.parquet data.val_files={data}/val.parquet data.train_batch_size=4 "
        "actor_rollout_ref.model.path=/models/stand-in actor_rollout_ref.rollout.n=8 "
        f"actor_rollout_ref.rollout.val_kwargs.n=2 reward.custom_reward_function.path={data}/scores.py "
        "reward.custom_reward_function.name=exact trainer.logger=[console]"
    )
    (tmp_path / "study.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "mine",
                "method": "grid",
                "parameters": {"rollouts": {"values": [2, 4]}},
                "recipe": {"engine": "verl", "steps": 10, "eval_every": 5, "checkpoint_every": 5},
                "setup": {"overrides_file": "run.args", "replace": ["actor_rollout_ref.rollout.n"]},
            }
        )
    )
    study = load_study(tmp_path / "study.yaml")
    options = {
        "verl": {
            "shared_dir": tmp_path / "shared",
            "python": sys.executable,
            "module": "verl_standin",
            "poll_seconds": 0.2,
            "env_vars": {"PYTHONPATH": str(TESTS), "STANDIN_STEP_SECONDS": "0.05"},
        }
    }
    with Store(f"sqlite:///{tmp_path / 'store.db'}") as store:
        summary = SweepDriver(study, store, ray_address=cluster, engine_options=options, max_retries=0).run()
        records = store.records_frame("mine")
    assert summary.count("done") == 2, [(run.name, run.status, run.note) for run in summary.runs]
    evaluated = records.dropna(subset=["val_reward"])
    assert sorted(set(evaluated["step"])) == [0, 5, 10]
    # 5 prompts x 2 samples; the stand-in answers right for a growing share, the user's `exact` scores each answer
    for step, reward in zip(evaluated["step"], evaluated["val_reward"]):
        right = math.ceil((0.2 + 0.6 * (1 - math.exp(-step / 20))) * 10 - 1e-9)
        assert reward == pytest.approx(right / 10), step


def test_the_shipped_setup_study_validates_as_is(cli, tmp_path):
    study = ROOT / "studies" / "verl_gsm8k_setup.yaml"
    code, out, err = cli("plan", study, "--json")
    assert code == 0, err
    runs = json.loads(out)["runs"]
    code, points, err = dry_run(cli, study, tmp_path)
    assert code == 0, err
    assert len(points) == len(runs) == 3 and {point["gpus"] for point in points} == {8}
    first = points[0]
    assert f"{TP}=2" in first["overrides"] and "trainer.logger=[console,wandb,file]" in first["overrides"]
    assert [change["key"] for change in first["changes"] if change["why"].startswith("axis")] == [
        "actor_rollout_ref.rollout.n"
    ]
    # the placeholders the user sets are paths only the cluster would see: noted, not refused
    assert any("/path/to/gsm8k/train.parquet" in note for note in first["notes"])
    assert not (tmp_path / "never.db").exists()


def test_a_refusal_the_users_own_command_shares_names_the_users_file(cli, tmp_path):
    # Hydra merges an unknown key of the user's YAML; verl refuses it when it builds the rollout's dataclass
    study = gsm8k_study(tmp_path)
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump({**USER_YAML, "actor_rollout_ref": {"rollout": {"nn": 5}}}))
    code, _, err = dry_run(cli, study, tmp_path)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: {tmp_path / 'mine.yaml'}: verl 0.9.1 refuses your own command at its start")
    assert "unexpected keyword argument 'nn'" in err
