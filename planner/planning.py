"""A study's plan: its points (planner.study's axes expanded), each run's recipe, seed and estimated compute, from
the cost model (planner.cost) and the IsoCompute grid (planner.grid)."""

import itertools
import math
from dataclasses import dataclass

from pydantic import ValidationError
from rlscale.planner.cost import DEFAULT_PROFILE, TINY_CPU, Profile, run_gpu_hours, step_gpu_hours
from rlscale.planner.grid import allocate
from rlscale.planner.profiles import load_profile
from rlscale.planner.recipe import Recipe
from rlscale.planner.study import RECIPE_KEYS, SHORT_KEYS, Study

from rlscale.base.compute import step_rollouts, step_tokens
from rlscale.base.errors import UserError


@dataclass(frozen=True)
class PlannedRun:
    """One run of a study: its name (without the seed), full recipe, seed and estimated GPU-hours (times the
    study's `extend`; the recipe's steps are the plan's, so the run's identity does not change with it)."""

    name: str
    recipe: Recipe
    seed: int
    gpu_hours: float


@dataclass(frozen=True)
class StudyPlan:
    """A study's runs and the points dropped (name, reason); per-run budget in compute.unit."""

    runs: list[PlannedRun]
    dropped: list[tuple[str, str]]
    profile: Profile
    per_run_budget: float | None
    unit: str

    @property
    def gpu_hours(self) -> float:
        """Estimated GPU-hours of all runs."""
        return sum(run.gpu_hours for run in self.runs)


def extended(recipe: Recipe, extend: float) -> Recipe:
    """The recipe a planned run trains under the study's `extend`: its steps times extend, rounded up (the stored
    recipe keeps the plan's steps, so the run's identity does not change)."""
    return recipe if extend <= 1 else recipe.model_copy(update={"steps": math.ceil(recipe.steps * extend)})


def study_points(study: Study) -> list[tuple[str, dict]]:
    """(run name, recipe overrides) for each point of a grid, isocompute or loo study; [] for bayes."""
    if study.method == "bayes":
        return []  # the sweep driver samples `parameters` with Optuna, n_trials times
    if study.method == "loo":
        return [
            ("baseline", {}),
            *((r.name, {RECIPE_KEYS[k]: v for k, v in r.overrides.items()}) for r in study.leave_one_out),
        ]
    keys = list(study.parameters)
    points = []
    for combo in itertools.product(*(study.parameters[k].values for k in keys)):
        overrides = {RECIPE_KEYS[k]: v for k, v in zip(keys, combo)}
        points.append(
            (
                ",".join(f"{SHORT_KEYS.get(k, k)}{'' if k in SHORT_KEYS else '='}{v}" for k, v in overrides.items()),
                overrides,
            )
        )
    return points


def default_profile(study: Study) -> Profile:
    """The study's cost profile: compute.profile, else tiny-cpu for the tiny policy, else ScaleRL's 8B."""
    if study.compute is not None and study.compute.profile is not None:
        return load_profile(study.compute.profile, field="compute.profile")
    return TINY_CPU if study.recipe.model == "tiny" else load_profile(DEFAULT_PROFILE)


def model_profiles(study: Study) -> dict[str, Profile]:
    """HF directory -> the cost profile of its steps, for a study with a `model` axis ({} otherwise)."""
    return {
        name: load_profile(size.profile, field=f"models.{name}.profile", file=study.file)
        for name, size in study.models.items()
    }


def plan_study(study: Study, *, profile: Profile | str | None = None) -> StudyPlan:
    """Every run (points x seeds), steps set by the compute budget if any; a `model` axis prices each model's
    steps by its own profile, so equal compute buys fewer steps of a larger model."""
    if isinstance(profile, str):
        profile = load_profile(profile)
    profile = profile or default_profile(study)
    by_model = model_profiles(study)
    base = study.recipe.to_json()
    recipes, dropped = [], []
    for name, overrides in study_points(study):
        try:
            recipe = Recipe.model_validate({**base, **overrides})
        except ValidationError as err:
            raise UserError(f"run {name}: {err.errors()[0]['msg']}", file=study.file, field="parameters") from None
        if study.max_batch is not None and recipe.total_batch > study.max_batch:
            dropped.append((name, f"B_p * n = {recipe.total_batch} exceeds max_batch {study.max_batch}"))
        else:
            recipes.append((name, recipe))
    compute = study.compute
    per_run, steps = None, [r.steps for _, r in recipes]
    if compute is not None and recipes:
        costs = [_step_cost(r, compute.unit, by_model.get(r.model, profile)) for _, r in recipes]
        startup = profile.startup_gpu_hours if compute.unit == "gpu_hours" else 0.0
        per_run, steps = allocate(
            costs,
            compute.budget,
            per_run=compute.scope == "per_run",
            min_steps=compute.min_steps,
            startup=startup,
            replicas=len(study.seeds),
            field="compute.budget",
            file=study.file,
        )
    runs = []
    for (name, recipe), m in zip(recipes, steps):
        priced_by = by_model.get(recipe.model, profile)
        if m is None:
            why = (
                f"cannot reach {compute.min_steps} step(s) with {per_run:.4g} {compute.unit} per run, steps "
                f"priced by profile {priced_by.name} (compute.profile chooses another)"
            )
            dropped.append((name, why))
            continue
        hours = run_gpu_hours(priced_by, recipe.prompts_per_batch, recipe.rollouts, m) * study.extend
        for seed in study.seeds:
            final = Recipe.model_validate({**recipe.to_json(), "steps": m, "seed": seed})
            runs.append(PlannedRun(name, final, seed, hours))
    if not runs and study.method != "bayes":
        reasons = "; ".join(f"{name}: {why}" for name, why in dropped[:3])
        raise UserError(
            f"no run is left to plan ({reasons})", file=study.file, field="compute.budget" if recipes else "max_batch"
        )  # which one dropped the last point
    return StudyPlan(runs, dropped, profile, per_run, compute.unit if compute else "gpu_hours")


def planned_runs(study: Study, *, profile: Profile | str | None = None) -> list[PlannedRun]:
    """The study's runs (points x seeds); [] for bayes (Optuna samples `parameters` later)."""
    return plan_study(study, profile=profile).runs


def _step_cost(recipe: Recipe, unit: str, profile: Profile) -> float:
    if unit == "gpu_hours":
        return step_gpu_hours(profile, recipe.prompts_per_batch, recipe.rollouts)
    if unit == "rollouts":
        return float(step_rollouts(recipe.prompts_per_batch, recipe.rollouts))
    return step_tokens(recipe.prompts_per_batch, recipe.rollouts, recipe.max_new_tokens)  # an upper bound


def trial_recipe(study: Study, recipe_keys: dict) -> tuple[Recipe, float]:
    """A bayes trial's recipe (steps from the per-run compute budget, if any) and its estimated GPU-hours."""
    try:
        recipe = Recipe.model_validate(recipe_keys)
    except ValidationError as err:
        raise UserError(f"trial recipe: {err.errors()[0]['msg']}", field="parameters") from None
    profile = default_profile(study)
    compute = study.compute
    if compute is not None:
        startup = profile.startup_gpu_hours if compute.unit == "gpu_hours" else 0.0
        budget = compute.budget if compute.scope == "per_run" else compute.budget / (study.n_trials or 1)
        _, (steps,) = allocate(
            [_step_cost(recipe, compute.unit, profile)],
            budget,
            per_run=True,
            min_steps=compute.min_steps,
            startup=startup,
            field="compute.budget",
            file=study.file,
        )
        if steps is None:
            raise UserError(
                f"a trial with B_p={recipe.prompts_per_batch}, n={recipe.rollouts} cannot reach "
                f"{compute.min_steps} step(s) within {budget:.4g} {compute.unit}",
                file=study.file,
                field="compute.budget",
            )
        recipe = Recipe.model_validate({**recipe.to_json(), "steps": steps})
    return recipe, run_gpu_hours(profile, recipe.prompts_per_batch, recipe.rollouts, recipe.steps)
