"""Which recipe `rlscale export --study NAME` writes.

A study that varies rollouts and a --budget: the recommendation (the study's recipe with the recommended B_p, n, M).
Any other study (a loss ablation, ScaleRL leave-one-out, a single-geometry grid) or no budget: its best run's own
recipe, by predicted reward at the budget when one is given, else by fitted asymptote A; ties go to the earlier run.
"""

import numpy as np
import pandas as pd
from rlscale.planner.recipe import Recipe

from rlscale.base.errors import UserError


def best_run(curves: pd.DataFrame, budget: float | None) -> tuple[pd.Series, str, int]:
    """(the chosen curve row, why in words, how many runs competed): at a budget every finished run reached, the best
    run there as the study's decision reads it (fitting.rules.standing: every stable run's fitted reward, identified or
    not, since the curve is pinned by its data); else among identified, stable fits."""
    from rlscale.fitting.curves import fitted, reach_of_finished, stable
    from rlscale.fitting.rules.standing import read_runs, standing_at
    from rlscale.fitting.sigmoid import sigmoid

    usable = fitted(curves)
    if budget is not None and budget <= reach_of_finished(curves) * (1 + 1e-9):
        standing = standing_at(read_runs(usable), budget)
        if standing is not None:
            chosen = usable[usable["run"] == standing.best["run"]].iloc[0]
            why = (
                f"highest predicted reward at a budget of {budget:g}: {standing.best['reward']:.3f} (fitted, "
                f"inside every run's data; fitted asymptote A {chosen['A']:.3f})"
            )
            return chosen, why, len(standing.runs)
    usable = usable[usable["identified"].astype(bool) & stable(usable)]
    if usable.empty:
        reasons = "; ".join(
            f"{row.run}: {row.reason or 'unstable (truncation or failed)'}" for row in curves.itertuples()
        )
        raise UserError(
            f"no run has an identified sigmoid fit and trained stably ({reasons or 'no runs'})", field="--study"
        )
    if budget is not None:
        score = np.array([float(sigmoid(budget, r.A, r.B, r.C_mid, r.R0)) for r in usable.itertuples()])
        chosen = usable.iloc[int(np.argmax(score))]
        why = (
            f"highest predicted reward at a budget of {budget:g}: {score.max():.3f} "
            f"(fitted asymptote A {chosen['A']:.3f})"
        )
    else:
        chosen = usable.iloc[int(np.argmax(usable["A"].to_numpy(float)))]
        why = f"highest fitted asymptote A {chosen['A']:.3f} [{chosen['A_lo']:.3f}, {chosen['A_hi']:.3f}]"
    return chosen, why, len(usable)


def best_run_recipe(store, study: str, budget: float | None = None) -> tuple[Recipe, list[str]]:
    """(the best run's recipe, header lines saying which run and why)."""
    from rlscale.fitting.curves import compute_column, run_curves, study_unit
    from rlscale.fitting.sigmoid.points import fits_record_breaking
    from rlscale.planner.study import stored_study

    typed = stored_study(store, study)
    runs = store.runs_frame(study)
    records = store.records_frame(study)
    if records["val_reward"].notna().sum() == 0:
        raise UserError(f"study {study!r} has no evaluated records yet", field="--study")
    unit = study_unit(typed)
    curves, _ = run_curves(
        records, runs, compute_col=compute_column(typed), record_breaking=fits_record_breaking(typed), bootstrap=20
    )
    chosen, why, competing = best_run(curves, budget)
    config = runs.loc[runs["run_id"] == chosen["run_id"], "config"].iloc[0] if "run_id" in runs.columns else None
    base = typed.recipe.to_json() if typed is not None else {}
    known = set(Recipe.model_fields) | {"async"}  # an imported run's config may carry other keys, or only some
    keys = {key: value for key, value in (config or {}).items() if key in known and key != "async_mode"}
    try:
        recipe = Recipe.model_validate({**base, **keys})
    except ValueError as err:
        raise UserError(f"run {chosen['run']}: its config is not a valid recipe ({err})", field="--study") from None
    header = [
        f"rlscale export: best run of study {study}: {chosen['run']} ({why}; "
        f"{competing} fitted run(s) compared, compute in {unit})",
        "the run's own recipe: B_p, n and M as it ran",
    ]
    if budget is not None:
        header.append(_reward_at_budget(records, chosen, compute_column(typed), budget))
    return recipe, header


def _reward_at_budget(records: pd.DataFrame, chosen: pd.Series, compute_col: str, budget: float) -> str:
    """The chosen run's predicted reward at the budget with its prediction interval (laws/predict.py), in words."""
    from rlscale.fitting.laws.predict import predict_stored_run

    p = predict_stored_run(records, chosen, compute_col, budget)
    if p is None:
        return f"reward at {budget:g}: no prediction interval (too few evaluations)"
    return (
        f"reward at {budget:g}: {p.predicted:.3f} [{p.lo:.3f}, {p.hi:.3f}] ({p.level:.0%} prediction interval "
        "of the mean over the last 10% of compute)"
    )
