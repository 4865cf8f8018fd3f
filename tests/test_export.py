"""`rlscale export`: each target's keys carry the recipe's meaning, deployment keys stand apart, the command lines are
shell-safe, and every study exports. The pinned frameworks' own parsers check the same exports in
tests/test_export_frameworks.py."""

from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import run_cli, script_argv
from rlscale.planner.frameworks import (
    Deployment,
    export_config,
    openrlhf_mapping,
    trl_mapping,
    verl_mapping,
    verl_overrides,
)
from rlscale.planner.recipe import Recipe

RECIPE = Recipe(
    prompts_per_batch=48,
    rollouts=16,
    steps=1200,
    lr=1e-6,
    kl_coef=0.001,
    entropy_coef=0.002,
    max_new_tokens=16384,
    seed=3,
)


def test_every_export_names_its_framework_and_version():
    for fmt, target in [("verl", "verl 0.9.1"), ("trl", "TRL 1.16.0"), ("openrlhf", "OpenRLHF 0.11.2")]:
        assert f"# target: {target}" in export_config(RECIPE, fmt)


def test_verl_mapping_is_callable_and_trains_one_update_per_batch():
    m = verl_mapping(RECIPE)
    r = m.recipe
    assert (r["data.train_batch_size"], r["actor_rollout_ref.rollout.n"], r["trainer.total_training_steps"]) == (
        48,
        16,
        1200,
    )
    # ppo_mini_batch_size counts prompts like train_batch_size: equal means one optimizer update per step
    assert r["actor_rollout_ref.actor.ppo_mini_batch_size"] == 48 and r["actor_rollout_ref.actor.ppo_epochs"] == 1
    assert r["actor_rollout_ref.actor.optim.lr_warmup_steps"] == 20
    assert r["actor_rollout_ref.actor.optim.lr_scheduler_type"] == "constant"
    assert not any("seed" in key and key.startswith("trainer.") for key in r)  # verl has no trainer.seed
    assert r["data.seed"] == r["actor_rollout_ref.rollout.seed"] == r["actor_rollout_ref.actor.data_loader_seed"] == 3
    assert r["actor_rollout_ref.actor.kl_loss_type"] == "low_var_kl" and r["algorithm.use_kl_in_reward"] is False
    off = Recipe(async_mode="ppo_off_policy", ppo_minibatches=4)
    assert verl_mapping(off).recipe["actor_rollout_ref.actor.ppo_mini_batch_size"] == 12  # 4 updates per batch
    assert "data.train_batch_size=48" in verl_overrides(RECIPE)


def test_verl_batch_and_no_normalisation_differ_and_dual_clip_is_off_and_announced():
    batch = verl_mapping(Recipe(adv_norm="batch")).recipe
    none = verl_mapping(Recipe(adv_norm="none")).recipe
    assert batch["algorithm.adv_estimator"] == "reinforce_plus_plus_baseline"
    assert (none["algorithm.adv_estimator"], none["algorithm.norm_adv_by_std_in_grpo"]) == ("grpo", False)
    for loss in ("dapo", "grpo"):
        m = verl_mapping(Recipe(loss=loss))
        assert m.recipe["actor_rollout_ref.actor.policy_loss.loss_mode"] == "vanilla"
        assert m.recipe["actor_rollout_ref.actor.clip_ratio_c"] > 4.9e8  # above verl's e^20 ratio clamp: never binds
        assert any("dual clip" in note for note in m.nearest)
    assert "dual clip" in export_config(Recipe(loss="dapo"), "verl")


def test_not_expressible_lists_only_what_the_pinned_version_lacks():
    recipe = Recipe(adv_norm="batch", loss_agg="token", async_mode="pipeline", fp32_head=True)
    verl_missing = " ".join(verl_mapping(recipe).missing)
    assert "fp32_head" in verl_missing and "no_positive_resampling" in verl_missing
    assert "adv_norm" not in verl_missing and "async" not in verl_missing  # both exist in verl 0.9.1
    orl = openrlhf_mapping(Recipe(loss="dapo", loss_agg="sample"))
    orl_missing = " ".join(orl.missing)
    assert "clip" not in orl_missing and "loss_agg" not in orl_missing and "kl" not in orl_missing
    assert "loss: cispo" in " ".join(openrlhf_mapping(Recipe(loss="cispo")).missing)
    trl_missing = trl_mapping(Recipe(loss_agg="token", fp32_head=True)).missing
    assert not any(item.startswith(("fp32_head", "loss", "CISPO", "adv_norm")) for item in trl_missing)


def test_cispo_truncates_at_five_in_every_target():
    cispo = Recipe(loss="cispo")  # clip_high 4: weight truncated at 1 + 4
    assert verl_mapping(cispo).recipe["actor_rollout_ref.actor.clip_ratio_high"] == 4.0  # verl: 1 + clip_ratio_high
    assert trl_mapping(cispo).recipe["epsilon_high"] == 5.0  # TRL: clamp(ratio, max=epsilon_high)
    low, high = openrlhf_mapping(cispo).recipe["--actor.eps_clip_low_high"]
    assert 1 + high == 5.0 and low == 1.0


def test_trl_generation_batch_is_one_optimizer_step():
    m = trl_mapping(RECIPE, Deployment(gpus_per_node=8, nodes=2))
    d = m.deployment
    assert d["per_device_train_batch_size"] * 16 * d["steps_per_generation"] == 48 * 16
    assert d["steps_per_generation"] == d["gradient_accumulation_steps"] and m.recipe["num_iterations"] == 1
    assert m.recipe["lr_scheduler_type"] == "constant_with_warmup" and m.recipe["warmup_steps"] == 20
    off = trl_mapping(Recipe(async_mode="ppo_off_policy", ppo_minibatches=4), Deployment(gpus_per_node=1))
    assert off.deployment["steps_per_generation"] == 4 * off.deployment["gradient_accumulation_steps"]
    assert off.recipe["max_steps"] == 4 * 400


def test_openrlhf_flags_count_prompts_and_completions_and_keep_the_estimator():
    r = openrlhf_mapping(RECIPE).recipe
    assert r["--rollout.batch_size"] == 48 and r["--train.batch_size"] == 48 * 16  # one update per batch
    assert r["--algo.advantage.estimator"] == "reinforce_baseline"  # never the default gae (a learned critic)
    assert r["--algo.kl.use_loss"] is True and r["--algo.kl.estimator"] == "k3" and r["--train.seed"] == 3
    assert openrlhf_mapping(Recipe(adv_norm="group")).recipe["--algo.advantage.estimator"] == "group_norm"
    assert openrlhf_mapping(Recipe(adv_norm="none")).recipe["--algo.advantage.estimator"] == "dr_grpo"
    assert openrlhf_mapping(RECIPE).deployment["--data.max_len"] == 1024 + 16384
    assert openrlhf_mapping(Recipe()).recipe["--algo.kl.init_coef"] == 0.0  # OpenRLHF's default is 0.01


def test_deployment_keys_come_from_gpus_and_nodes_and_stand_apart(tmp_path):
    dep = Deployment(gpus_per_node=4, nodes=2, tensor_parallel=2)
    m = verl_mapping(Recipe(async_mode="sync"), dep)
    assert (m.deployment["trainer.n_gpus_per_node"], m.deployment["trainer.nnodes"]) == (4, 2)
    assert m.deployment["actor_rollout_ref.rollout.tensor_model_parallel_size"] == 2
    assert m.deployment["actor_rollout_ref.actor.use_dynamic_bsz"] is True
    assert not set(m.recipe) & set(m.deployment)
    text = export_config(Recipe(async_mode="sync"), "verl", deployment=dep)
    recipe_part, deployment_part = text.split("# deployment choices")
    assert "trainer.n_gpus_per_node=4" in deployment_part and "n_gpus_per_node" not in recipe_part
    o = openrlhf_mapping(Recipe(async_mode="sync"), dep).deployment
    assert (o["--actor.num_gpus_per_node"], o["--actor.num_nodes"], o["--vllm.num_engines"]) == (4, 2, 4)
    trl_text = export_config(Recipe(), "trl", deployment=dep)
    lines = trl_text.splitlines()
    cut = next(i for i, line in enumerate(lines) if line.startswith("# deployment choices"))
    trl_recipe, trl_deployment = yaml.safe_load("\n".join(lines[:cut])), yaml.safe_load("\n".join(lines[cut:]))
    assert "per_device_train_batch_size" in trl_deployment and "num_generations" in trl_recipe
    assert not set(trl_recipe) & set(trl_deployment)


@pytest.mark.parametrize("fmt", ["openrlhf", "verl"])
def test_command_lines_keep_a_hostile_model_path_one_argument(fmt, tmp_path):
    hostile = "x; touch PWNED #"
    text = export_config(Recipe(model=hostile), fmt)
    argv = script_argv(text, tmp_path)
    assert not (tmp_path / "PWNED").exists()
    if fmt == "openrlhf":
        assert argv[argv.index("--actor.model_name_or_path") + 1] == hostile
    else:  # Hydra-quoted inside one shell word
        assert "actor_rollout_ref.model.path='x; touch PWNED #'" in argv


def test_yaml_export_round_trips_through_the_recipe_schema(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text(export_config(RECIPE, "yaml"))
    from rlscale.planner.loading import load_recipe

    assert load_recipe(path) == RECIPE


def _cli(args, capsys, monkeypatch):
    return run_cli(monkeypatch, capsys, *args)


def test_export_command_from_a_recipe_file(workdir, capsys, monkeypatch):
    (workdir / "r.yaml").write_text("prompts_per_batch: 8\nrollouts: 4\nsteps: 50\nloss: grpo\nasync: sync\n")
    code, out, err = _cli(
        ["export", "--format", "verl", "--recipe", "r.yaml", "--gpus", "4", "--out", "verl.sh"], capsys, monkeypatch
    )
    assert code == 0, err
    argv = script_argv((workdir / "verl.sh").read_text(), workdir)
    assert "data.train_batch_size=8" in argv and "actor_rollout_ref.rollout.n=4" in argv
    assert "trainer.n_gpus_per_node=4" in argv
    code, _, err = _cli(["export", "--format", "deepspeed", "--recipe", "r.yaml"], capsys, monkeypatch)
    assert code == 2 and "--format" in err
    code, _, err = _cli(["export", "--format", "verl", "--recipe", "r.yaml", "--gpus", "0"], capsys, monkeypatch)
    assert code == 2 and "--gpus" in err


def test_export_command_from_a_study_recommendation(workdir, capsys, monkeypatch):
    from helpers import bench, seed_isocompute

    url = f"sqlite:///{workdir / 'rl.db'}"
    truth, c_obs = bench.CASES["saturates_64"]
    seed_isocompute(url, "iso", truth, c_obs)
    code, out, err = _cli(
        [
            "export",
            "--format",
            "trl",
            "--study",
            "iso",
            "--budget",
            str(4 * c_obs),
            "--db",
            url,
            "--profile",
            "tiny-cpu",
            "--gpus",
            "1",
        ],
        capsys,
        monkeypatch,
    )
    assert code == 0, err
    config = yaml.safe_load(out)
    assert config["num_generations"] in (32, 64, 128)
    assert config["per_device_train_batch_size"] * config["steps_per_generation"] == 16 * config["num_generations"]
    assert "# rlscale export: the decision of study iso" in out


def _seed_study(url: str, study_file: str, asymptotes: dict) -> dict:
    """Store the study of `study_file` with one run per planned point and seed; each run's val_reward climbs a
    sigmoid to the asymptote its point name maps to. Returns {run name: asymptote}."""
    from rlscale.db.store import Store
    from rlscale.fitting.sigmoid import sigmoid
    from rlscale.planner.planning import planned_runs
    from rlscale.planner.study_file import load_study

    study = load_study(Path(__file__).parents[1] / "studies" / study_file)
    store = Store(url)
    store.upsert_study(study.name, study.to_spec())
    rng = np.random.default_rng(0)
    truth = {}
    for run in planned_runs(study):
        A = asymptotes(run.name) + 0.004 * run.seed
        truth[run.name] = A
        run_id = store.ensure_run(study.name, run.name, run.recipe.to_json(), run.seed)
        compute = np.concatenate([[0.0], np.geomspace(0.0002, 0.035, 30)])
        reward = rng.binomial(4000, sigmoid(compute, A, 1.5, 0.004, 0.05)) / 4000
        store.add_records(
            run_id,
            [
                {"step": i, "gpu_hours": float(c), "val_reward": float(r), "metrics": {"truncation_rate": 0.01}}
                for i, (c, r) in enumerate(zip(compute, reward))
            ],
        )
        store.set_run_status(run_id, "done")
    store.close()
    return truth


def test_export_a_loss_ablation_names_its_best_run(workdir, capsys, monkeypatch):
    url = f"sqlite:///{workdir / 'rl.db'}"
    _seed_study(url, "loss_ablation.yaml", lambda name: 0.8 if "cispo" in name else 0.6)
    code, out, err = _cli(
        ["export", "--format", "openrlhf", "--study", "loss_ablation", "--db", url], capsys, monkeypatch
    )
    assert code == 0, err
    assert "best run of study loss_ablation" in out and "cispo" in out.splitlines()[2]
    assert "the highest fitted reward at" in out  # the decision's: at the compute every run reached
    argv = script_argv(out, workdir)
    assert argv[argv.index("--rollout.batch_size") + 1] == "16"  # the run's own B_p (the study's recipe)
    assert "loss: cispo has no OpenRLHF policy_loss_type" in out


def test_export_scalerl_leave_one_out_by_predicted_reward(workdir, capsys, monkeypatch):
    url = f"sqlite:///{workdir / 'rl.db'}"
    truth = _seed_study(url, "scalerl_loo.yaml", lambda name: 0.7 if name == "baseline" else 0.55)
    assert "baseline" in truth
    code, out, err = _cli(
        ["export", "--format", "verl", "--study", "scalerl_loo", "--budget", "0.05", "--db", url, "--gpus", "2"],
        capsys,
        monkeypatch,
    )
    assert code == 0, err
    assert "best run of study scalerl_loo: baseline" in out and "highest predicted reward at 0.05" in out
    assert "reward at 0.05: " in out and "(90% prediction interval" in out
    assert "data.train_batch_size=32" in script_argv(out, workdir)


def test_a_path_in_any_script_is_written_as_it_is_not_escaped():
    from rlscale.planner.frameworks import export_config
    from rlscale.planner.recipe import Recipe

    text = export_config(Recipe(task="/data/données/sums.jsonl"), "yaml")
    assert "task: /data/données/sums.jsonl" in text.splitlines()
    assert yaml.safe_load(text)["task"] == "/data/données/sums.jsonl"
