"""The quickstart's reward function, as a TRL user writes one: TRL's signature (prompts, completions, plus the
dataset's columns by name), one float per completion."""


def correct(completions, answer, **kwargs) -> list[float]:
    """1.0 when the completion (an assistant message, the prompts being conversational) is the sum, else 0.0."""
    return [float(completion[0]["content"].strip() == sum_) for completion, sum_ in zip(completions, answer)]
