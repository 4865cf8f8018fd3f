"""One rule for a user's learning-rate schedule, on every engine: a schedule that decays over the run's length
decays over each run's planned steps (or the study's setup.lr_decay_steps), whatever step a job ends at. A run's
jobs end at rungs or at its compute stop (which still ends the run), and verl and TRL would otherwise fit the
schedule to each job's own end. Each engine says the rule in its own terms (runner/verl/setup.py: verl's keys;
runner/trl/setup.py: the trainer's schedule length) and lists it among the dry-run's changes with reason()."""

import math


def decay_steps(recipe, study_steps: int | None = None) -> int:
    """The rlscale steps a decaying schedule decays over: the study's setup.lr_decay_steps, else the run's
    planned steps."""
    return int(study_steps or recipe.steps)


def reason(name: str, steps: int, *, study_steps: int | None = None) -> str:
    """Why a schedule's keys change, the same words on every engine."""
    over = _over(steps, study_steps)
    return f"lr schedule: {name} decays over {over}, not to a job's end (the compute stop ends the run)"


def warmup_reason(ratio: float, steps: int, *, study_steps: int | None = None) -> str:
    """Why a warmup given as a fraction becomes steps, the same words on every engine."""
    return f"lr warmup: {ratio:g} of {_over(steps, study_steps)}, not of a job's end"


def _over(steps: int, study_steps: int | None) -> str:
    return f"the study's {steps:,} lr_decay_steps" if study_steps else f"the run's {steps:,} planned steps"


def warmup_steps(ratio: float, steps: int) -> int:
    """A warmup given as a fraction of the schedule, in steps of the `steps` it decays over (at least one)."""
    return max(1, math.ceil(ratio * steps))


def cosine_cycles(num_cycles: float, *, job_steps: int, steps: int, warmup: int) -> float:
    """The num_cycles that makes a cosine fitted to `job_steps` trace the cosine of `num_cycles` over `steps`: both
    verl's and transformers' cosines take the phase 2 pi num_cycles (step - warmup) / (total - warmup)."""
    return num_cycles * max(1, job_steps - warmup) / max(1, steps - warmup)
