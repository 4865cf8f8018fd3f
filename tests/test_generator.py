"""The vLLM generator actor: n rollouts with log-probs, weight pushes that match the trainer, base-weight reloads."""

import math
import os

import pytest
from rlscale.runner.ray_head import connect, disconnect

pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray")
pytest.importorskip("vllm")


@pytest.fixture(scope="module")
def actors():
    """One local Ray cluster with one generator and one trainer actor for the whole module (engine start ~30-90 s)."""
    from rlscale.planner.recipe import Recipe
    from rlscale.runner.builtin.generator import create_generator
    from rlscale.runner.builtin.local import resolve_model_dir
    from rlscale.runner.builtin.trainer import trainer_actor

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    recipe = Recipe(
        prompts_per_batch=8, rollouts=4, lr=3e-4, lr_reference_batch=32, max_new_tokens=8, **{"async": "sync"}
    )
    model_dir = resolve_model_dir(recipe)
    head = connect(None, cpus=2)  # rlscale's one local head, as a sweep starts it
    try:
        generator = create_generator(recipe, model_dir)
        trainer = trainer_actor(model_dir, recipe)
        ray.get(generator.ready.remote())
        yield recipe, generator, trainer
    finally:
        disconnect(head)


def _sample(generator, recipe, prompts, seed=1):
    return ray.get(
        generator.generate.remote(
            prompts, n=recipe.rollouts, temperature=recipe.temperature, max_new_tokens=recipe.max_new_tokens, seed=seed
        )
    )


def test_samples_n_rollouts_per_prompt_with_logprobs(actors):
    recipe, generator, _ = actors
    generation = _sample(generator, recipe, ["12+34=", "56+07="])
    assert [len(group) for group in generation.rollouts] == [recipe.rollouts] * 2
    for rollout in (r for group in generation.rollouts for r in group):
        assert 1 <= len(rollout.token_ids) <= recipe.max_new_tokens
        assert len(rollout.logprobs) == len(rollout.token_ids)
        assert all(lp <= 0 and math.isfinite(lp) for lp in rollout.logprobs)
    assert generation.tokens == sum(len(r.token_ids) for group in generation.rollouts for r in group)
    # a seed makes a batch reproducible, so a resumed job regenerates the same rollouts
    again = _sample(generator, recipe, ["12+34=", "56+07="])
    assert [[r.token_ids for r in g] for g in again.rollouts] == [[r.token_ids for r in g] for g in generation.rollouts]


def test_logprobs_match_trainer_after_weight_update(actors):
    """After a real train step and a weight push, vLLM's log-probs equal the trainer's within 1e-4 (fp32)."""
    from rlscale.runner.rl.tasks import make_task

    recipe, generator, trainer = actors
    task = make_task(recipe)
    prompts = task.train[: recipe.prompts_per_batch]
    prompt_ids = [ray.get(generator.encode.remote(p.text)) for p in prompts]
    fixed_prompt, fixed_completion = prompt_ids[0], ray.get(generator.encode.remote("146"))[1:]  # without BOS
    before = ray.get(generator.score.remote(fixed_prompt, fixed_completion))

    generation = _sample(generator, recipe, [p.text for p in prompts])
    rewards = [[task.verify(p, r.text) for r in group] for p, group in zip(prompts, generation.rollouts)]
    rewards[0][0] = 1.0 - rewards[0][0]  # guarantee one prompt with mixed rewards, so the step changes the weights
    ray.get(trainer.train.remote(prompt_ids, generation, rewards))
    ray.get(generator.update_weights.remote(trainer.weights.remote(), 1))

    after = ray.get(generator.score.remote(fixed_prompt, fixed_completion))
    trained = ray.get(trainer.score.remote(fixed_prompt, fixed_completion))
    assert max(abs(a - b) for a, b in zip(before, after)) > 1e-4, "the push did not change the generator"
    assert max(abs(a - b) for a, b in zip(after, trained)) < 1e-4

    # and the behaviour log-probs of freshly sampled tokens (what the loss uses as the old policy)
    fresh = _sample(generator, recipe, [prompts[1].text], seed=7)
    for rollout in fresh.rollouts[0]:
        expected = ray.get(trainer.score.remote(prompt_ids[1], rollout.token_ids))
        assert max(abs(a - b) for a, b in zip(rollout.logprobs, expected)) < 1e-4


def test_a_reset_trainer_trains_exactly_like_a_fresh_one(actors):
    """A sweep reuses one trainer actor across jobs: after reset(recipe) it must train as a new trainer would."""
    from rlscale.runner.builtin.local import resolve_model_dir
    from rlscale.runner.builtin.trainer import Trainer
    from rlscale.runner.rl.tasks import make_task
    from safetensors.torch import load

    recipe, generator, trainer = actors
    other = recipe.model_copy(update={"lr": 2e-4, "seed": 5})
    task = make_task(other)
    prompts = task.train[: other.prompts_per_batch]
    prompt_ids = [ray.get(generator.encode.remote(p.text)) for p in prompts]
    generation = _sample(generator, other, [p.text for p in prompts], seed=11)
    rewards = [[task.verify(p, r.text) for r in group] for p, group in zip(prompts, generation.rollouts)]
    rewards[0][0] = 1.0 - rewards[0][0]  # at least one prompt with mixed rewards: the step moves the weights

    ray.get(trainer.train.remote(prompt_ids, generation, rewards))  # a previous job's step, then the next job
    ray.get(trainer.reset.remote(other))
    ray.get(trainer.train.remote(prompt_ids, generation, rewards))
    reused = load(ray.get(trainer.weights.remote()))
    fresh_trainer = Trainer(resolve_model_dir(other), other)
    fresh_trainer.train(prompt_ids, generation, rewards)
    fresh = load(fresh_trainer.weights())
    base = load(Trainer(resolve_model_dir(other), other).weights())
    assert any((fresh[k] != base[k]).any() for k in fresh), "the step did not change the weights"
    assert max(float((reused[k] - fresh[k]).abs().max()) for k in fresh) < 1e-6
    ray.get(trainer.reset.remote(recipe))


def test_load_base_restores_the_base_policy(actors):
    """A generator reused by the next job serves the base weights again after other weights (no engine restart)."""
    import torch
    from rlscale.runner.builtin.local import resolve_model_dir
    from safetensors.torch import load, save

    recipe, generator, _ = actors
    ids = ray.get(generator.encode.remote("11+22="))
    completion = ray.get(generator.encode.remote("33"))[1:]
    ray.get(generator.load_base.remote())
    base = ray.get(generator.score.remote(ids, completion))
    state = load((resolve_model_dir(recipe) / "model.safetensors").read_bytes())
    noisy = {k: v + 0.05 * torch.randn_like(v) for k, v in state.items()}
    ray.get(generator.update_weights.remote(save(noisy), 5))
    assert max(abs(a - b) for a, b in zip(ray.get(generator.score.remote(ids, completion)), base)) > 1e-3
    ray.get(generator.load_base.remote())
    assert ray.get(generator.stats.remote())["weights_version"] == 0
    assert max(abs(a - b) for a, b in zip(ray.get(generator.score.remote(ids, completion)), base)) < 1e-6


def test_interrupt_forces_the_marker_and_lets_the_model_answer(actors):
    """length_control=interrupt: truncated rollouts get the end-of-thinking marker (no gradient) and a short answer."""
    from rlscale.runner.builtin.generator import INTERRUPT_ANSWER_TOKENS

    recipe, generator, _ = actors
    marker = "="
    marker_ids = ray.get(generator.encode.remote(marker))[1:]  # without BOS
    generation = ray.get(
        generator.generate.remote(
            ["12+34="] * 4,
            n=4,
            temperature=1.0,
            max_new_tokens=1,
            length_control="interrupt",
            end_of_thinking=marker,
            seed=3,
        )
    )
    truncated = [r for group in generation.rollouts for r in group if r.truncated]
    assert truncated, "max_new_tokens=1 must truncate some rollouts"
    for rollout in truncated:
        assert rollout.token_ids[1 : 1 + len(marker_ids)] == marker_ids
        assert rollout.sampled[1 : 1 + len(marker_ids)] == [False] * len(marker_ids)
        assert len(rollout.token_ids) <= 1 + len(marker_ids) + INTERRUPT_ANSWER_TOKENS
        assert len(rollout.logprobs) == len(rollout.token_ids) == len(rollout.sampled)
    assert 0 < generation.truncation_rate <= 1
