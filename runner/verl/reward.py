"""verl's custom reward function for rlscale's tasks (pkg://rlscale.runner.verl.reward, name=compute_score). It runs
in verl's reward workers on the cluster, so it imports only the stdlib-only task verifiers the engine ships there."""

from functools import cache

from rlscale.runner.rl.tasks import Verifier, exact_match, load_verifier, math_match

# verifier names the parquet's extra_info carries -> the task's own verifiers; anything else is 'module:function'
BUILTIN_VERIFIERS = {"exact_match": exact_match, "math_match": math_match}


@cache
def _verifier(spec: str) -> Verifier:
    return BUILTIN_VERIFIERS.get(spec) or load_verifier(spec)


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    """verl's signature: 1.0 if extra_info["verifier"] (default math_match) accepts `solution_str`, else 0.0."""
    spec = (extra_info or {}).get("verifier") or "math_match"
    return float(_verifier(spec)(str(ground_truth), solution_str))
