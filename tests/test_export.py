"""`rlscale export`: production configs with the documented keys, and what each target cannot express."""

import dataclasses

import pytest

from conftest import run_cli
import yaml

from rlscale.fitting.export import export_config
from rlscale.planner.recipe import Recipe

# trl 1.16.0, trl/trainer/grpo_config.py: the fields GRPOConfig declares itself (read from the release's source)
GRPO_CONFIG_FIELDS = {
    "learning_rate", "model_init_kwargs", "trust_remote_code", "router_aux_loss_coef", "disable_dropout",
    "cast_lm_head_to_fp32", "remove_unused_columns", "num_generations", "num_generations_eval",
    "max_completion_length", "ds3_gather_for_generation", "shuffle_dataset", "pad_to_multiple_of",
    "generation_batch_size", "steps_per_generation", "temperature", "top_p", "top_k", "min_p", "generation_kwargs",
    "chat_template_kwargs", "repetition_penalty", "cache_implementation", "use_vllm", "vllm_mode", "beta",
    "num_iterations", "epsilon", "delta", "epsilon_high", "importance_sampling_level", "reward_weights",
    "scale_rewards", "loss_type", "mask_truncated_completions", "sync_ref_model", "top_entropy_quantile",
    "entropy_coef", "use_adaptive_entropy", "log_completions",
}
# transformers.TrainingArguments fields GRPOConfig inherits (documented in transformers' TrainingArguments)
TRAINING_ARGUMENTS_FIELDS = {"max_steps", "per_device_train_batch_size", "gradient_accumulation_steps",
                             "max_grad_norm", "weight_decay", "seed", "output_dir"}
TRL_LOSS_TYPES = {"grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"}


def _nested(config: dict, dotted: str):
    node = config
    for part in dotted.split("."):
        assert isinstance(node, dict) and part in node, f"missing key {dotted}"
        node = node[part]
    return node


RECIPE = Recipe(prompts_per_batch=32, rollouts=64, steps=1200, lr=1e-4, lr_reference_batch=768, kl_coef=0.001,
                entropy_coef=0.002, max_new_tokens=4096)


def test_verl_export_is_plain_yaml_with_the_documented_keys():
    text = export_config(RECIPE, "verl", header=["from a test"])
    config = yaml.safe_load(text)  # plain YAML: the comments are the only non-data lines
    expected = {
        "data.train_batch_size": 32,
        "actor_rollout_ref.rollout.n": 64,
        "trainer.total_training_steps": 1200,
        "actor_rollout_ref.actor.optim.lr": pytest.approx(RECIPE.scaled_lr),
        "actor_rollout_ref.actor.clip_ratio_low": RECIPE.clip_range[0],
        "actor_rollout_ref.actor.clip_ratio_high": RECIPE.clip_range[1],
        "actor_rollout_ref.actor.policy_loss.loss_mode": "cispo",
        "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
        "algorithm.norm_adv_by_std_in_grpo": False,
        "actor_rollout_ref.actor.use_kl_loss": True,
        "actor_rollout_ref.actor.kl_loss_coef": 0.001,
        "actor_rollout_ref.actor.entropy_coeff": 0.002,
        "data.max_response_length": 4096,
    }
    for key, value in expected.items():
        assert _nested(config, key) == value, key
    # lr scales with sqrt(total batch / reference batch): 32 x 64 = 2048 rollouts vs 768
    assert RECIPE.scaled_lr == pytest.approx(1e-4 * (2048 / 768) ** 0.5)
    notes = text.split("# not expressible:")[1]
    assert "fp32_head" in notes and "loss_agg: prompt" in notes and "adv_norm: batch" in notes


def test_verl_maps_losses_and_group_norm():
    config = yaml.safe_load(export_config(Recipe(loss="dapo", adv_norm="group", loss_agg="sample"), "verl"))
    actor = config["actor_rollout_ref"]["actor"]
    assert actor["policy_loss"]["loss_mode"] == "vanilla" and (actor["clip_ratio_low"], actor["clip_ratio_high"]) == (0.2, 0.28)
    assert actor["loss_agg_mode"] == "seq-mean-token-mean"
    assert config["algorithm"]["norm_adv_by_std_in_grpo"] is True


def test_trl_export_uses_documented_grpo_config_fields():
    text = export_config(RECIPE, "trl")
    config = yaml.safe_load(text)
    assert set(config) <= GRPO_CONFIG_FIELDS | TRAINING_ARGUMENTS_FIELDS
    assert config["num_generations"] == 64 and config["max_steps"] == 1200
    # prompts per step = per_device_train_batch_size x processes / num_generations (one process)
    assert config["per_device_train_batch_size"] // config["num_generations"] == 32
    assert config["loss_type"] in TRL_LOSS_TYPES and config["loss_type"] == "cispo"
    assert config["epsilon_high"] == RECIPE.clip_range[1] and config["scale_rewards"] == "batch"
    assert config["cast_lm_head_to_fp32"] is True and config["beta"] == 0.001
    gspo = yaml.safe_load(export_config(Recipe(loss="gspo"), "trl"))
    assert gspo["importance_sampling_level"] == "sequence"
    assert "not expressible" in text and "zero_variance_filter" in text


def test_trl_export_builds_a_real_grpo_config(tmp_path):
    import trl  # in the dev extra

    fields = yaml.safe_load(export_config(RECIPE, "trl"))
    # the export targets a GPU cluster; this CPU-only host can only build it with bf16 off
    config = trl.GRPOConfig(output_dir=str(tmp_path), **{**fields, "bf16": False, "use_cpu": True})
    assert config.num_generations == 64
    assert config.learning_rate == pytest.approx(fields["learning_rate"])


def test_trl_field_list_matches_installed_transformers():
    transformers = pytest.importorskip("transformers")
    names = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    assert TRAINING_ARGUMENTS_FIELDS <= names


def test_openrlhf_export_is_a_command_with_documented_flags():
    text = export_config(RECIPE, "openrlhf")
    command = " ".join(line.rstrip("\\") for line in text.splitlines() if not line.startswith("#"))
    for flag, value in [("--rollout.batch_size", "32"), ("--rollout.n_samples_per_prompt", "64"),
                        ("--rollout.max_new_tokens", "4096"), ("--actor.policy_loss_type", "ppo")]:
        assert f"{flag} {value}" in command
    assert "--actor.adam.lr" in command and "--train.num_episodes" in command
    assert "loss: cispo has no OpenRLHF policy_loss_type" in text and "steps: 1200 has no flag" in text


def test_yaml_export_round_trips_through_the_recipe_schema(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text(export_config(RECIPE, "yaml"))
    from rlscale.planner.loading import load_recipe

    assert load_recipe(path) == RECIPE


def _cli(args, capsys, monkeypatch):
    return run_cli(monkeypatch, capsys, *args)


def test_export_command_from_a_recipe_file(workdir, capsys, monkeypatch):
    (workdir / "r.yaml").write_text("prompts_per_batch: 8\nrollouts: 4\nsteps: 50\nloss: grpo\n")
    code, out, err = _cli(["export", "--format", "verl", "--recipe", "r.yaml", "--out", "verl.yaml"], capsys, monkeypatch)
    assert code == 0, err
    config = yaml.safe_load((workdir / "verl.yaml").read_text())
    assert config["data"]["train_batch_size"] == 8 and config["actor_rollout_ref"]["rollout"]["n"] == 4
    code, _, err = _cli(["export", "--format", "deepspeed", "--recipe", "r.yaml"], capsys, monkeypatch)
    assert code == 2 and "--format" in err


def test_export_command_from_a_study_recommendation(workdir, capsys, monkeypatch):
    from test_recommend import bench, seed_isocompute

    url = f"sqlite:///{workdir / 'rl.db'}"
    truth, c_obs = bench.CASES["saturates_64"]
    seed_isocompute(url, "iso", truth, c_obs)
    code, out, err = _cli(["export", "--format", "trl", "--study", "iso", "--budget", str(4 * c_obs), "--db", url,
                           "--profile", "tiny-cpu"], capsys, monkeypatch)
    assert code == 0, err
    config = yaml.safe_load(out)
    assert config["num_generations"] in (32, 64, 128)
    assert config["per_device_train_batch_size"] == 16 * config["num_generations"]
    assert "# rlscale export: recommendation from study iso" in out
