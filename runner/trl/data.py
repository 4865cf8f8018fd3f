"""A recipe's task as TRL's data: a standard (not conversational) prompt-only dataset whose `answer` column reaches
the reward function, and the held-out prompts the validation pass rate is taken on."""

from rlscale.runner.rl.tasks import Prompt, Task


def train_dataset(task: Task):
    """datasets.Dataset of {"prompt": text, "answer": reference answer}, one row per train prompt. TRL tokenizes the
    prompt text as the builtin engine does (the tokenizer's own special tokens, no chat template)."""
    from datasets import Dataset

    return Dataset.from_list([{"prompt": p.text, "answer": p.answer} for p in task.train])


def validation_prompts(task: Task, recipe) -> list[Prompt]:
    """The first eval_prompts held-out prompts: the same for every seed and engine."""
    return task.validation(recipe.eval_prompts)
