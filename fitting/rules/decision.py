"""A study's Decision, built once from its fit of record (StudyFits): what to run at the decision budget (or why not),
the runs within the noise band and what to run next; every view (CLI, report, export, dashboard) reads this one."""

from dataclasses import dataclass, replace

import pandas as pd
from rlscale.fitting.curves import (
    FIT_BOOTSTRAP,
    FIT_SEED,
    StudyFits,
    fitted,
    reach_of_finished,
    run_geometry,
    study_unit,
)
from rlscale.fitting.laws.optimal_n import MIN_DISTINCT_ROLLOUTS, RolloutsLaw
from rlscale.fitting.rules.allocation import NextAllocation, decision_budget, next_allocation
from rlscale.fitting.rules.best_run import best_run, run_recipe
from rlscale.fitting.rules.reasons import Reason, Refusal
from rlscale.fitting.rules.recommend import Recommendation, recommend
from rlscale.fitting.rules.standing import Standing, decision_runs, read_runs, standing_at

from rlscale.base.errors import first_line

EXPORT_FORMATS = {"trl": "trl", "verl": "verl"}  # a recipe's engine -> the export format its users run


def export_format(study) -> str:
    """The `rlscale export --format` of a study: its recipe's engine (trl, verl); verl for builtin or spec-less ones."""
    return EXPORT_FORMATS.get(_base_recipe(study).engine, "verl")


def _base_recipe(study):
    from rlscale.planner.recipe import Recipe

    return study.recipe if study is not None else Recipe()


def recommended_recipe(fits: StudyFits, rec: Recommendation):
    """The recipe the recommendation trains: the run it rests on (its own recipe, so the keys a study varies besides
    B_p and n, e.g. lr or the loss, are that run's) with the recommended B_p, n and M."""
    chosen = fits.curves[fits.curves["run"] == rec.predicted_from].iloc[0]
    own = run_recipe(_base_json(fits.spec), _run_config(fits.runs, chosen))
    return own.model_copy(
        update={"prompts_per_batch": rec.prompts_per_batch, "rollouts": rec.rollouts, "steps": rec.steps}
    )


def _base_json(study) -> dict:
    return study.recipe.to_json() if study is not None else {}


def _run_config(runs: pd.DataFrame, chosen: pd.Series) -> dict | None:
    if "run_id" not in runs.columns or "config" not in runs.columns:
        return None
    return runs.loc[runs["run_id"] == chosen["run_id"], "config"].iloc[0]


def steps_model(study, records: pd.DataFrame, runs: pd.DataFrame, *, profile: str | None = None):
    """(steps_for(budget, B_p, n) -> steps, how: a Reason) in the study's compute unit; GPU-hours by the named profile,
    else one calibrated on the study's records, else the study's profile (`study` None: imported without a spec)."""
    from rlscale.planner.cost import DEFAULT_PROFILE, R2_USABLE, calibrate, step_gpu_hours, steps_within
    from rlscale.planner.planning import default_profile
    from rlscale.planner.profiles import load_profile

    from rlscale.base.compute import step_rollouts, step_tokens

    unit = study_unit(study)
    if unit == "rollouts":
        return (lambda budget, bp, n: steps_within(budget, step_rollouts(bp, n))), Reason("steps_per_rollout")
    if unit == "tokens":
        both = (
            records.dropna(subset=["tokens", "rollouts"])
            if {"tokens", "rollouts"} <= set(records.columns)
            else records.iloc[:0]
        )
        both = both[both["rollouts"].astype(float) > 0]
        per_rollout = (
            float((both["tokens"].astype(float) / both["rollouts"].astype(float)).median())
            if len(both)
            else float(_base_recipe(study).max_new_tokens)
        )
        return (
            (lambda budget, bp, n: steps_within(budget, step_tokens(bp, n, per_rollout))),
            Reason("steps_per_token", {"tokens_per_rollout": per_rollout}),
        )
    chosen = how = None
    if profile is not None:
        chosen, how = load_profile(profile), Reason("steps_profile", {"profile": profile})
    else:
        try:
            calibrated, quality = calibrate(records, runs, name="measured")
            if quality.r2 >= R2_USABLE:
                chosen, how = calibrated, Reason("steps_calibrated", {"r2": float(quality.r2)})
        except Exception:  # any calibration failure falls back to the study's profile
            chosen = None
        if chosen is None:
            # a study imported from logs has no spec: they come from real models, not the tiny policy
            chosen = default_profile(study) if study is not None else load_profile(DEFAULT_PROFILE)
            how = Reason("steps_profile", {"profile": chosen.name})
    return (lambda budget, bp, n: steps_within(budget, step_gpu_hours(chosen, bp, n), chosen.startup_gpu_hours)), how


def rollouts_law(
    study: str, curves: pd.DataFrame, draws: dict, *, bootstrap: int = FIT_BOOTSTRAP, seed: int = FIT_SEED
) -> RolloutsLaw:
    """The optimal-n law of a study's fitted runs; Refusal when they do not vary rollouts or have no frontier."""
    from rlscale.fitting.laws.optimal_n import fit_optimal_rollouts

    usable = fitted(curves)
    if usable["rollouts"].nunique() < 2:
        raise Refusal(Reason("one_rollouts_value", {"study": study, "values": int(usable["rollouts"].nunique())}))
    try:
        return fit_optimal_rollouts(usable, draws=draws, bootstrap=bootstrap, seed=seed)
    except ValueError as err:  # e.g. every run stopped before its inflection: no frontier to fit a law to
        raise Refusal(Reason("no_frontier", {"error": str(err)})) from None


def recommend_for(fits: StudyFits, budget: float, law: RolloutsLaw, *, profile: str | None = None) -> Recommendation:
    """The Recommendation for `budget` from a study's fits and law; predicted reward: the chosen run's mean over the
    budget's last 10%, with a prediction interval where it has one. Refusal when the evidence is not enough."""
    from rlscale.fitting.laws.predict import predict_stored_run

    curves, records = fits.curves, fits.records
    model, cost_how = steps_model(fits.spec, records, fits.runs, profile=profile)

    def own(budget: float, bp: int, n: int, run: str) -> tuple[int, Reason] | None:
        """M from the run's own records where it trained this B_p and n (rollouts price steps exactly)."""
        if cost_how.code == "steps_per_rollout" or not _trained(curves, run, bp, n):
            return None
        measured = measured_steps(records, run, fits.compute_col, budget)
        if measured is not None:  # the run itself trained this B_p, n to here
            return measured, Reason("steps_measured", {"run": run, "steps": measured})
        onward = run_rate_steps(records, run, fits.compute_col, budget) if profile is None else None
        if onward is not None:  # past its data: on at its own compute per step
            return onward[0], Reason("steps_run_rate", {"run": run, "steps": onward[0], "per_step": onward[1]})
        return None

    def steps_for(budget: float, bp: int, n: int, run: str) -> int:
        mine = own(budget, bp, n, run)
        return mine[0] if mine is not None else model(budget, bp, n)

    rec = recommend(
        curves,
        law,
        budget=budget,
        steps_for=steps_for,
        draws=fits.draws,
        noise_band=fits.noise_band,
        allow_constant_n=True,
    )
    mine = own(rec.budget, rec.prompts_per_batch, rec.rollouts, rec.predicted_from)
    if mine is not None:
        cost_how = mine[1]
    chosen = curves[curves["run"] == rec.predicted_from]
    p = (
        None
        if chosen.empty
        else predict_stored_run(
            records, chosen.iloc[0], fits.compute_col, rec.budget, reward_col=fits.metric, bounded=fits.bounded
        )
    )
    notes = [Reason("cost_model", {"unit": fits.unit, "how": cost_how})]
    if p is not None:
        rec = replace(rec, predicted_reward=p.predicted, predicted_interval=(p.lo, p.hi), predicted_level=p.level)
        notes.insert(0, Reason("prediction_interval", {"level": p.level}))
    return replace(rec, reasons=(*rec.reasons, *notes))


def measured_steps(records: pd.DataFrame, run: str, compute_col: str, budget: float) -> int | None:
    """The step of `run`'s first record at >= 99% of `budget` compute (where it reached it); None when none does."""
    mine = records[records["run"] == run].dropna(subset=[compute_col]).sort_values("step")
    reached = mine[mine[compute_col].astype(float) >= budget * (1 - 0.01)]
    return int(reached["step"].iloc[0]) if len(reached) else None


def run_rate_steps(records: pd.DataFrame, run: str, compute_col: str, budget: float) -> tuple[int, float] | None:
    """(steps, compute per step) for a `budget` past `run`'s data: its last step, then the rest at its own compute per
    step over its second half (start-up aside); None when the budget is within its data or its records cannot say."""
    mine = records[records["run"] == run].dropna(subset=[compute_col, "step"]).sort_values("step")
    step, spent = mine["step"].to_numpy(float), mine[compute_col].to_numpy(float)
    if len(step) < 2 or budget <= spent[-1]:
        return None
    half = step >= step[-1] / 2
    first_step, first_spent = step[half][0], spent[half][0]
    if step[-1] <= first_step or spent[-1] <= first_spent:
        return None
    per_step = (spent[-1] - first_spent) / (step[-1] - first_step)
    return int(step[-1] + (budget - spent[-1]) // per_step), float(per_step)


def _trained(curves: pd.DataFrame, run: str, bp: int, n: int) -> bool:
    """Whether `run` trained B_p `bp` and n `n` (not an n the law found between the runs')."""
    row = curves[curves["run"] == run]
    return not row.empty and int(row["prompts_per_batch"].iloc[0]) == bp and int(row["rollouts"].iloc[0]) == n


def varies_rollouts(typed, runs: pd.DataFrame) -> bool:
    """Whether a study decides n: its spec has a rollouts axis, or (no spec) its runs use several rollouts values."""
    if typed is not None:
        return "rollouts" in typed.parameters
    return run_geometry(runs)["rollouts"].nunique() >= 2


@dataclass
class Decision:
    """What a study decided and should run next, compute in `unit`; kind: "allocation" (B_p, n, M over rollouts) or
    "best_run"; budget: the compute decided for; compute: what every finished run reached; standing: the runs at the
    budget, or at compute when the budget lies past the data; refusal: why not decided."""

    study: str
    kind: str
    unit: str
    budget: float
    compute: float
    export_format: str
    recommendation: Recommendation | None = None
    refusal: tuple = ()
    best: Reason | None = None
    standing: Standing | None = None
    law: RolloutsLaw | None = None
    next_allocation: NextAllocation | None = None
    recipe: dict | None = None
    prediction: object = None
    extend: float = 1.0  # the study's current extension of its planned compute (the next command multiplies it)
    planned: bool = True  # a sweep can extend its runs (not a study imported from logs, nor Optuna's trials)
    trials: bool = False  # its runs are Optuna's trials (method bayes)
    study_file: str | None = None  # the YAML its sweep read (absolute), when the store knows it
    from_frame: bool = False  # decided from a frame of evaluations (rlscale.decide), not a store

    @property
    def decided(self) -> bool:
        """Whether the study decided at its budget: an allocation, or a best run."""
        return self.recommendation is not None or self.best is not None

    @property
    def exportable(self) -> bool:
        """Whether `rlscale export --study` writes this decision: a recipe, from a store (a frame's recipe, from
        `rlscale.decide`, is the caller's: importing the frame keeps only B_p and n)."""
        return self.recipe is not None and not self.from_frame

    @property
    def best_run(self) -> str | None:
        """The run the decision rests on: the recommendation's, else the best run's."""
        if self.recommendation is not None:
            return self.recommendation.predicted_from
        return self.best["run"] if self.best is not None else None

    def to_dict(self) -> dict:
        """JSON-ready: every field, the refusal as {refused, reasons}."""
        return {
            "study": self.study,
            "kind": self.kind,
            "unit": self.unit,
            "budget": self.budget,
            "compute": self.compute,
            "export_format": self.export_format,
            "decided": self.decided,
            "best_run": self.best_run,
            "best": self.best.to_dict() if self.best else None,
            "recommendation": self.recommendation.to_dict() if self.recommendation else None,
            "refusal": Refusal(*self.refusal).to_dict() if self.refusal else None,
            "standing": self.standing.to_dict() if self.standing else None,
            "law": self.law.to_dict() if self.law else None,
            "next_allocation": self.next_allocation.to_dict() if self.next_allocation else None,
            "recipe": self.recipe,
            "exportable": self.exportable,
            "prediction": self.prediction.to_dict() if self.prediction is not None else None,
            "extend": self.extend,
            "planned": self.planned,
            "trials": self.trials,
            "study_file": self.study_file,
        }


def decide(
    fits: StudyFits,
    *,
    budget: float | None = None,
    profile: str | None = None,
    extend: float = 1.0,
    from_frame: bool = False,
) -> Decision:
    """The Decision of a study from its fit of record at `budget` (default: decision_budget over rollouts, else the
    compute every finished run reached). extend: the study's current extension factor (the next command scales it);
    from_frame: the fits come from a frame, not a store."""
    curves, runs, typed = fits.curves, fits.runs, fits.spec
    compute = reach_of_finished(curves)
    kind = "allocation" if varies_rollouts(typed, runs) else "best_run"
    if budget is None:
        budget = decision_budget(typed, runs, fits.records) if kind == "allocation" else compute
    budget = float(budget)
    read = decision_runs(curves) if kind == "allocation" else read_runs(curves)
    decision = Decision(
        study=fits.study,
        kind=kind,
        unit=fits.unit,
        budget=budget,
        compute=compute,
        export_format=export_format(typed),
        standing=standing_at(read, _read_at(budget, compute), noise_band=fits.noise_band) if compute > 0 else None,
        extend=extend,
        planned=typed is not None and typed.method != "bayes",
        trials=typed is not None and typed.method == "bayes",
        study_file=typed.file if typed is not None else None,
        from_frame=from_frame,
    )
    law_identified = None  # no law to fit: the study does not vary rollouts
    if kind == "allocation" and budget > 0:
        try:
            decision.law = rollouts_law(fits.study, curves, fits.draws)
            rec = recommend_for(fits, budget, decision.law, profile=profile)
        except Refusal as refusal:
            decision.refusal = refusal.reasons
            law_identified = _law_identified(refusal.codes)
        else:
            decision.recommendation = rec
            law_identified = rec.law_identified
            try:
                decision.recipe = recommended_recipe(fits, rec).to_json()
            except ValueError as err:  # runs imported from logs: the allocation stands, with no recipe to export
                decision.refusal = (Reason("no_recipe", {"run": rec.predicted_from, "error": first_line(err)}),)
    elif kind == "best_run" and budget > 0:
        _decide_best_run(decision, fits)
    if law_identified is False and curves["rollouts"].nunique() < MIN_DISTINCT_ROLLOUTS:
        law_identified = None  # the law needs more rollouts values than the study has: extending cannot identify it
    if decision.recommendation is None or not decision.recommendation.law_identified:
        # with no law, a decision holds at the sweep's compute only: say what would extend it
        decision.next_allocation = next_allocation(curves[curves["status"] == "done"], law_identified)
    return decision


def _read_at(budget: float, reach: float) -> float:
    """Where the runs stand: at the budget decided for, or at `reach` when the budget lies past the data."""
    return budget if 0 < budget <= reach * (1 + 1e-9) else reach


def _decide_best_run(decision: Decision, fits: StudyFits) -> None:
    from rlscale.fitting.laws.predict import predict_stored_run

    try:
        chosen, decision.best = best_run(fits.curves, decision.budget, noise_band=fits.noise_band)
    except Refusal as refusal:
        decision.refusal = refusal.reasons
        return
    try:
        decision.recipe = run_recipe(_base_json(fits.spec), _run_config(fits.runs, chosen)).to_json()
    except ValueError as err:  # an imported run whose config makes no recipe: the decision stands, with no recipe
        decision.refusal = (Reason("no_recipe", {"run": str(chosen["run"]), "error": str(err).splitlines()[0]}),)
    decision.prediction = predict_stored_run(
        fits.records, chosen, fits.compute_col, decision.budget, reward_col=fits.metric, bounded=fits.bounded
    )


def _law_identified(codes: list[str]) -> bool | None:
    if "one_rollouts_value" in codes or "no_evaluations" in codes:
        return None
    return not ({"no_frontier", "law_not_identified"} & set(codes))
