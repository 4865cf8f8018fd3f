"""verl's own launch scripts from the wild as users' setups (tests/data/verl_launches/, bench/verl_corpus.py): each,
made the overrides_file of a study over B_p and n, either composes and validates through verl 0.9.1's Hydra (every
job), or the dry-run exits 2 naming the file and the key. None passes the dry-run without verl composing it."""

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("verl_corpus", ROOT / "bench" / "verl_corpus.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

GRAD_OFFLOAD = "actor_rollout_ref.actor.megatron.grad_offload"  # in verl 0.9.0's megatron config, not in 0.9.1's
REFUSED = {
    "dppo_trainer_run_qwen3_30b_a3b_megatron.args": GRAD_OFFLOAD,
    "grpo_trainer_run_qwen3_235b_a22b_megatron.args": GRAD_OFFLOAD,
    "grpo_trainer_run_qwen3_30b_a3b_megatron.args": GRAD_OFFLOAD,
    "gspo_trainer_run_qwen3_30b_a3b_megatron.args": GRAD_OFFLOAD,
    "recipe_dapo_test_dapo_7b_math_megatron.args": GRAD_OFFLOAD,
    "recipe_dapo_test_dapo_8b_megatron_fp16.args": GRAD_OFFLOAD,
    # `+key=value` for a key verl's FSDP config already has: Hydra refuses to append it
    "grpo_trainer_run_gpt_oss_20b_fsdp.args": "actor_rollout_ref.actor.fsdp_config.model_dtype",
    # the recipe's own trainer (recipe.dapo.main_dapo), not main_ppo
    "recipe_dapo_run_dapo_qwen2.5_32b.args": "-m",
}


def test_the_corpus_is_at_least_twenty_of_verls_scripts_each_naming_its_source():
    files = bench.corpus()
    assert len(files) >= 20
    for args in files:
        repository, path = bench.source_of(args).split(" ")
        name, _, commit = repository.partition("@")
        assert name in ("verl-project/verl", "verl-project/verl-recipe") and re.fullmatch("[0-9a-f]{40}", commit)
        assert path.endswith(".sh")


@pytest.mark.slow
@pytest.mark.parametrize("args", bench.corpus(), ids=lambda path: path.stem)
def test_each_script_composes_with_verl_or_exits_2_naming_its_file_and_key(cli, tmp_path, args):
    from helpers import python_of

    python_of(".venv-verl")
    study = bench.corpus_study(args, tmp_path)
    code, out, err = cli(
        "sweep", study, "--dry-run", "--json", "--db", f"sqlite:///{tmp_path / 'never.db'}",
        "--shared-dir", "/nfs/rl", "--ray-address", "http://head:8265",
    )  # fmt: skip
    found = bench.outcome(code, out, err)
    assert found["ok"], (code, err)
    if args.name in REFUSED:
        assert found["result"] == "refused", out[:300]
        assert [problem["file"] for problem in found["problems"]] == [str(args)]
        assert found["problems"][0]["key"] == REFUSED[args.name]
    else:
        assert found["result"] == "composed", err
        points = json.loads(out)
        assert len(points) == 4 and all(point["composed"]["version"] == "0.9.1" for point in points)
        assert not (tmp_path / "never.db").exists()
