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
    """verl's calling convention: 1.0 if `solution_str` answers correctly (the task's verifier on
    (ground_truth, solution_str), named by extra_info["verifier"]), else 0.0."""
    spec = (extra_info or {}).get("verifier") or "math_match"
    return float(_verifier(spec)(str(ground_truth), solution_str))
