"""The user's own reward function, as a TRL user writes one: TRL's signature (completions, plus the dataset's columns
by name), one float per completion."""


def exact_sum(completions, solution, **kwargs) -> list[float]:
    """1.0 when the completion (an assistant message) is the sum written in `solution` ($12$), else 0.0."""
    return [
        float(completion[0]["content"].strip() == answer.strip("$"))
        for completion, answer in zip(completions, solution)
    ]
