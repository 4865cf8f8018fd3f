"""The exports, read by the pinned frameworks themselves: verl 0.9.1 composes its Hydra config with the overrides and
validates it, OpenRLHF 0.11.2's parser parses the command, TRL 1.16.0 builds its GRPOConfig, for every
loss x aggregation x normalisation. Each framework runs in its own venv (scripts/checker_envs.sh, built by
`make setup`); in CI a missing venv fails these tests.

The scripts are run by bash with a stand-in `python3` that prints its argv, so what the checkers read is what a
shell would pass to the framework.
"""

import itertools
import json
import math
import os
import subprocess
from pathlib import Path

import pytest
from helpers import script_argv
from rlscale.planner.frameworks import TARGETS, Deployment, export_config
from rlscale.planner.recipe import Recipe

ROOT = Path(__file__).resolve().parents[1]
CHECKERS = Path(__file__).resolve().parent / "checkers"
LOSSES, AGGS, NORMS = ("cispo", "gspo", "dapo", "grpo"), ("prompt", "token", "sample"), ("batch", "group", "none")
ASYNC = ("sync", "pipeline", "ppo_off_policy")
COMBOS = list(itertools.product(LOSSES, AGGS, NORMS))
DEPLOY = Deployment(gpus_per_node=1, nodes=1, max_prompt_tokens=512)  # TRL's config sees one CPU process here


def combo_recipe(i: int, loss: str, agg: str, norm: str) -> Recipe:
    """A recipe per combination; async modes, KL and seeds vary across them so every path is exercised."""
    return Recipe(
        loss=loss,
        loss_agg=agg,
        adv_norm=norm,
        prompts_per_batch=48,
        rollouts=16,
        steps=400 + i,
        max_new_tokens=4096,
        lr=1e-6,
        lr_warmup_steps=20,
        kl_coef=0.001 if i % 2 else 0.0,
        async_mode=ASYNC[i % 3],
        max_staleness=1 + i % 4,
        ppo_minibatches=4,
        seed=7 + i,
        zero_variance_filter=bool(i % 2),
        entropy_coef=0.001 * (i % 3 == 0),
        model="/models/qwen 7b",
    )


HOSTILE = Recipe(model="x; touch PWNED # it's \\ here", async_mode="sync")  # must reach the framework as one value
CASES = {f"{loss}-{agg}-{norm}": combo_recipe(i, loss, agg, norm) for i, (loss, agg, norm) in enumerate(COMBOS)}


def updates(recipe: Recipe) -> int:
    return recipe.ppo_minibatches if recipe.async_mode == "ppo_off_policy" else 1


def run_checker(name: str, cases: list[dict], tmp_path: Path) -> dict:
    """{case name: result} from tests/checkers/{name}_check.py inside .venv-{name}."""
    python = ROOT / f".venv-{name}" / "bin" / "python"
    if not python.exists():
        message = f".venv-{name} is missing: run scripts/checker_envs.sh (make setup builds it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    out = tmp_path / f"{name}.json"
    done = subprocess.run(
        [str(python), str(CHECKERS / f"{name}_check.py"), str(out)],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert done.returncode == 0 and out.exists(), done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["version"] == TARGETS[name][1], (
        f"{name} {report['version']} installed, the export targets {TARGETS[name][1]}"
    )
    return {case["name"]: case for case in report["cases"]}


def _ok(results: dict, name: str) -> dict:
    result = results[name]
    assert result["ok"], result["error"]
    return result["values"]


@pytest.fixture(scope="module")
def verl_results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("verl")
    cases = [
        {"name": name, "overrides": script_argv(export_config(recipe, "verl", deployment=DEPLOY), tmp)}
        for name, recipe in CASES.items()
    ]
    cases.append(
        {"name": "default-deployment", "overrides": script_argv(export_config(Recipe(async_mode="sync"), "verl"), tmp)}
    )
    cases.append(
        {"name": "hostile-model", "overrides": script_argv(export_config(HOSTILE, "verl", deployment=DEPLOY), tmp)}
    )
    # a key verl 0.9.1 does not have (as trainer.seed was) must be refused, so a renamed key fails this suite
    cases.append({"name": "unknown-key", "overrides": cases[0]["overrides"] + ["trainer.seed=0"]})
    return run_checker("verl", cases, tmp)


@pytest.fixture(scope="module")
def openrlhf_results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("openrlhf")
    cases = [
        {"name": name, "argv": script_argv(export_config(recipe, "openrlhf", deployment=DEPLOY), tmp)}
        for name, recipe in CASES.items()
    ]
    cases.append({"name": "default-deployment", "argv": script_argv(export_config(Recipe(), "openrlhf"), tmp)})
    cases.append(
        {"name": "hostile-model", "argv": script_argv(export_config(HOSTILE, "openrlhf", deployment=DEPLOY), tmp)}
    )
    cases.append({"name": "unknown-flag", "argv": cases[0]["argv"] + ["--seed", "0"]})
    return run_checker("openrlhf", cases, tmp)


@pytest.fixture(scope="module")
def trl_results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trl")
    cases = [{"name": name, "yaml": export_config(recipe, "trl", deployment=DEPLOY)} for name, recipe in CASES.items()]
    cases.append({"name": "eight-gpus", "yaml": export_config(CASES["cispo-prompt-batch"], "trl")})
    cases.append({"name": "unknown-field", "yaml": cases[0]["yaml"] + "num_rollouts: 16\n"})
    return run_checker("trl", cases, tmp)


def _rlscale_advantages(norm: str) -> list[float]:
    torch = pytest.importorskip("torch")
    from rlscale.runner.rl.advantages import compute_advantages

    return compute_advantages(torch.tensor([[1.0, 0, 0, 0], [1, 1, 0, 0]]), norm).reshape(-1).tolist()


@pytest.mark.slow
@pytest.mark.parametrize("name", CASES)
def test_verl_composes_validates_and_trains_the_recipe(verl_results, name):
    recipe, v = CASES[name], _ok(verl_results, name)
    low, high = recipe.clip_range
    # prompts per step, rollouts, steps; one optimizer update per generated batch unless ppo_off_policy asks for k
    assert (v["train_batch_size"], v["n"], v["total_training_steps"]) == (48, 16, recipe.steps)
    assert v["train_batch_size"] // v["ppo_mini_batch_size"] * v["ppo_epochs"] == updates(recipe)
    assert v["max_response_length"] == 4096 and v["use_dynamic_bsz"]
    assert v["lr"] == pytest.approx(recipe.scaled_lr) and v["lr_warmup_steps"] == 20
    assert v["lr_scheduler_type"] == "constant"
    assert v["clip_ratio_high"] == high
    if recipe.loss == "cispo":  # verl's own CISPO loss gives a token with ratio e^6 the weight 1 + clip_high = 5
        assert v["loss_mode"] == "cispo" and v["weight_at_ratio_e6"] == pytest.approx(1 + high)
    else:  # clipped: no gradient; and no dual clip caps the loss of a negative-advantage token at clip_ratio_c
        assert v["clip_ratio_low"] == low and v["weight_at_ratio_e6"] == 0
    if recipe.loss in ("dapo", "grpo"):
        assert v["loss_mode"] == "vanilla" and v["loss_negative_advantage_ratio_e15"] == pytest.approx(
            math.exp(15), rel=1e-4
        )
    assert (
        v["loss_agg_mode"]
        == {"token": "token-mean", "sample": "seq-mean-token-mean", "prompt": "token-mean"}[recipe.loss_agg]
    )
    if recipe.adv_norm in ("group", "none"):  # verl's estimator computes rlscale's advantages
        assert v["advantages"] == pytest.approx(_rlscale_advantages(recipe.adv_norm), abs=1e-5)
    else:  # group mean, batch scale: centred per group, one scale for the batch
        assert v["adv_estimator"] == "reinforce_plus_plus_baseline"
        assert v["advantages"][0] > 0 > v["advantages"][1] and v["advantages"][4] > 0 > v["advantages"][6]
    assert v["use_kl_loss"] == (recipe.kl_coef > 0) and not v["use_kl_in_reward"] and v["kl_is_k3"]
    assert v["seeds"] == [recipe.seed] * 3 and v["filter_groups"] == recipe.zero_variance_filter
    if recipe.async_mode == "pipeline":  # separate_async needs train batch == sync step x mini-batch
        assert v["trainer_mode"] == "separate_async"
        assert v["train_batch_size"] == v["parameter_sync_step"] * v["ppo_mini_batch_size"]
        assert v["max_off_policy_threshold"] == recipe.max_staleness + 1
    else:
        assert v["trainer_mode"] == "sync"
    assert v["model_path"] == "/models/qwen 7b"


@pytest.mark.slow
def test_verl_refuses_a_key_it_does_not_have_and_takes_the_default_deployment(verl_results):
    assert not verl_results["unknown-key"]["ok"] and "trainer.seed" in verl_results["unknown-key"]["error"]
    _ok(verl_results, "default-deployment")
    assert _ok(verl_results, "hostile-model")["model_path"] == HOSTILE.model


@pytest.mark.slow
@pytest.mark.parametrize("name", CASES)
def test_openrlhf_parser_reads_the_intended_recipe(openrlhf_results, name):
    recipe, v = CASES[name], _ok(openrlhf_results, name)
    low, high = recipe.clip_range
    k = updates(recipe)
    assert v["estimator"] == {"group": "group_norm", "none": "dr_grpo", "batch": "reinforce_baseline"}[recipe.adv_norm]
    assert v["critic"] is None  # no learned value model: the group baseline, as in rlscale
    assert (v["rollout_batch_size"], v["n_samples_per_prompt"]) == (48, 16)
    assert v["train_batch_size"] * k == 48 * 16 and v["max_epochs"] == 1  # completions per optimizer update
    # OpenRLHF's optimizer steps over one episode of max_samples prompts: M steps x k updates
    assert v["max_samples"] // v["rollout_batch_size"] == recipe.steps and v["num_episodes"] == 1
    updates_total = v["max_samples"] * v["n_samples_per_prompt"] // v["train_batch_size"] * v["max_epochs"]
    assert updates_total == recipe.steps * k
    assert math.ceil(updates_total * v["lr_warmup_ratio"]) == recipe.lr_warmup_steps
    assert v["lr_scheduler"] == "constant_with_warmup" and v["betas"] == [0.9, 0.999]
    assert v["max_new_tokens"] == 4096 and v["max_len"] == 512 + 4096  # responses are never cut before 4096
    assert v["eps_clip_low_high"] == [min(low, 1.0), high] and v["dual_clip"] is None
    if recipe.loss == "cispo":
        assert 1 + v["eps_clip_low_high"][1] == 5
    assert v["policy_loss_type"] == ("gspo" if recipe.loss == "gspo" else "ppo")
    assert (
        v["loss_agg_mode"]
        == {"token": "token-mean", "sample": "seq-mean-token-mean", "prompt": "token-mean"}[recipe.loss_agg]
    )
    assert v["kl_init_coef"] == recipe.kl_coef
    if recipe.kl_coef > 0:
        assert v["kl_use_loss"] and v["kl_estimator"] == "k3"
    assert v["seed"] == recipe.seed and v["lr"] == pytest.approx(recipe.scaled_lr)
    assert v["entropy_coef"] == (recipe.entropy_coef or None)
    assert v["dynamic_filtering"] == recipe.zero_variance_filter
    assert v["async_enable"] == (recipe.async_mode == "pipeline")
    assert v["model"] == "/models/qwen 7b"


@pytest.mark.slow
def test_openrlhf_parser_refuses_an_unknown_flag(openrlhf_results):
    assert not openrlhf_results["unknown-flag"]["ok"] and "--seed" in openrlhf_results["unknown-flag"]["error"]
    _ok(openrlhf_results, "default-deployment")
    assert _ok(openrlhf_results, "hostile-model")["model"] == HOSTILE.model


@pytest.mark.slow
@pytest.mark.parametrize("name", CASES)
def test_trl_grpo_config_builds_and_derives_the_recipe(trl_results, name):
    recipe, v = CASES[name], _ok(trl_results, name)
    k = updates(recipe)
    assert v["world_size"] == 1 and v["num_generations"] == 16
    assert v["generation_batch_size"] == 48 * 16  # B_p x n completions per generation
    # optimizer steps per generation batch: steps_per_generation micro-batches, gradient_accumulation_steps per step
    assert v["steps_per_generation"] // v["gradient_accumulation_steps"] == k and v["num_iterations"] == 1
    assert v["max_steps"] == recipe.steps * k
    if recipe.loss == "cispo":  # TRL's CISPO weight is clamp(ratio, max=epsilon_high)
        assert v["loss_type"] == "cispo" and v["epsilon_high"] == 5
    else:
        assert (v["epsilon"], v["epsilon_high"]) == recipe.clip_range
    assert v["importance_sampling_level"] == ("sequence" if recipe.loss == "gspo" else "token")
    assert v["scale_rewards"] == recipe.adv_norm and v["beta"] == recipe.kl_coef
    assert v["lr_scheduler_type"] == "constant_with_warmup" and v["warmup_steps"] == 20
    assert v["max_completion_length"] == 4096 and v["seed"] == recipe.seed


@pytest.mark.slow
def test_trl_eight_gpu_export_builds_and_refuses_unknown_fields(trl_results):
    v = _ok(trl_results, "eight-gpus")
    assert v["per_device_train_batch_size"] * 8 * v["steps_per_generation"] == 48 * 16
    assert not trl_results["unknown-field"]["ok"] and "num_rollouts" in trl_results["unknown-field"]["error"]
