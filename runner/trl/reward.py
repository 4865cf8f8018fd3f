"""The task's verifier as a TRL reward function (GRPOTrainer's reward_funcs)."""

from rlscale.runner.rl.tasks import Prompt, Task


def task_reward(task: Task):
    """reward(prompts, completions, answer, **columns) -> [0/1 per completion]: the task's verifier on each
    (answer, completion). TRL logs it as rewards/verifier/mean."""

    def verifier(prompts, completions, answer, **columns) -> list[float]:
        return [
            task.verify(Prompt(id=0, text=prompt, answer=reference), completion)
            for prompt, completion, reference in zip(prompts, completions, answer)
        ]

    return verifier
