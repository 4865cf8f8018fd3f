"""The best run of a study that does not decide n (a loss ablation, ScaleRL leave-one-out, a single-geometry grid),
and a run's own recipe. Pure: curves in, a row and a Reason out."""

import numpy as np
import pandas as pd
from rlscale.fitting.curves import reach_of_finished, stable
from rlscale.fitting.rules.reasons import Reason, Refusal
from rlscale.fitting.rules.standing import read_runs, standing_at
from rlscale.fitting.sigmoid.curve import sigmoid

from rlscale.base.numbers import NOISE_BAND


def best_run(curves: pd.DataFrame, budget: float, *, noise_band: float = NOISE_BAND) -> tuple[pd.Series, Reason]:
    """(the chosen curve row, a Reason "best_within_data" or "best_predicted"); Refusal "no_trusted_run" when no run
    is fitted, identified and stable past the data. noise_band: the study's (its RewardScale's), in reward units."""
    usable = curves[curves[["A", "B", "C_mid", "R0"]].notna().all(axis=1)]  # any run, with or without a geometry
    if budget <= reach_of_finished(curves) * (1 + 1e-9):
        standing = standing_at(read_runs(usable), budget, noise_band=noise_band)
        if standing is not None:
            chosen = usable[usable["run"] == standing.best["run"]].iloc[0]
            return chosen, _why("best_within_data", chosen, budget, standing.best["reward"], len(standing.runs))
    trusted = usable[usable["identified"].astype(bool) & stable(usable)]
    if trusted.empty:
        runs = [
            {"run": str(row.run), "why": row.reason or "unstable (truncation or failed)"} for row in curves.itertuples()
        ]
        raise Refusal(Reason("no_trusted_run", {"runs": runs}))
    score = np.array([float(sigmoid(budget, r.A, r.B, r.C_mid, r.R0)) for r in trusted.itertuples()])
    chosen = trusted.iloc[int(np.argmax(score))]
    return chosen, _why("best_predicted", chosen, budget, float(score.max()), len(trusted))


def _why(code: str, chosen: pd.Series, budget: float, reward: float, competing: int) -> Reason:
    return Reason(
        code,
        {
            "compute": float(budget),
            "run": str(chosen["run"]),
            "reward": float(reward),
            "A": float(chosen["A"]),
            "A_lo": float(chosen["A_lo"]),
            "A_hi": float(chosen["A_hi"]),
            "runs": int(competing),
        },
    )


def run_recipe(base: dict, config: dict | None):
    """A run's own recipe: the study's base recipe (`base`, JSON) with the run's config over it (an imported run's
    config may carry other keys, or only some). ValueError when they do not make a valid recipe."""
    from rlscale.planner.recipe import Recipe

    known = set(Recipe.model_fields) | {"async"}
    keys = {key: value for key, value in (config or {}).items() if key in known and key != "async_mode"}
    # Recipe()'s defaults would be the tiny policy's, not what the run trained (a log gives at most its B_p and n)
    if not base and (not keys or (config or {}).get("source") == "import"):
        raise ValueError("it was imported from a log, which names no recipe")
    if not base and set(keys) <= {"prompts_per_batch", "rollouts"}:
        raise ValueError("its runs name only their B_p and n, not how they trained")
    return Recipe.model_validate({**base, **keys})
