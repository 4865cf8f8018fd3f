"""One rule for a user's lr schedule on every engine: it decays over each run's planned steps (or setup.lr_decay_steps),
not to a job's end, since jobs end at rungs or the compute stop and verl/TRL would fit the schedule to each job."""

import math


def decay_steps(recipe, study_steps: int | None = None) -> int:
    """The rlscale steps (not optimizer updates) a decaying schedule spans: setup.lr_decay_steps, else planned steps."""
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
