"""The study schema (studies/*.yaml): a base recipe, the axes to vary, the compute each run gets, cross-field checks.
Unknown keys are errors at every level and every axis value is checked against the Recipe, so typos fail at load."""

import json
import math
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)
from rlscale.planner.recipe import Recipe

from rlscale.base.names import MAX_RUNS, MAX_SEEDS, NAME_PATTERN, NAME_RULE, VERIFIER_PATTERN, is_name, verifier_problem

MODULE_FUNCTION_PATTERN = VERIFIER_PATTERN  # the old name
# study-file key -> canonical key (the alias where there is one, as Recipe.to_json writes it)
RECIPE_KEYS: dict[str, str] = {
    key: (info.alias or name) for name, info in Recipe.model_fields.items() for key in {name, info.alias or name}
}
# short names for run labels: "bp16,n8" reads better than "prompts_per_batch=16,rollouts=8"
SHORT_KEYS = {"prompts_per_batch": "bp", "rollouts": "n", "steps": "m"}


class FieldProblem(ValueError):
    """A cross-field check that failed at `path` (relative to the model that raised it)."""

    def __init__(self, path: tuple, message: str):
        super().__init__(message)
        self.path = path
        self.message = message


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Compute(_Strict):
    """What each run may spend: `budget` in `unit`, for one run (per_run) or the whole study (total)."""

    unit: Literal["gpu_hours", "rollouts", "tokens"] = "gpu_hours"
    budget: float = Field(gt=0, allow_inf_nan=False)
    scope: Literal["per_run", "total"] = "per_run"
    profile: str | None = Field(None, pattern=NAME_PATTERN, description="cost profile; None = by the recipe's model")
    min_steps: int = Field(1, ge=1, description="points that cannot reach this many steps are dropped")

    @field_validator("budget", mode="before")
    @classmethod
    def _not_bool(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("expected a positive number")
        return value


class Axis(_Strict):
    """One swept key: `values` (grid, isocompute, bayes categorical) or `min`/`max`/`distribution` (bayes)."""

    values: list[Any] | None = Field(None, min_length=1)
    min: float | None = Field(None, allow_inf_nan=False)
    max: float | None = Field(None, allow_inf_nan=False)
    distribution: Literal["uniform", "log_uniform", "int_uniform"] | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> "Axis":
        ranged = [k for k in ("min", "max", "distribution") if getattr(self, k) is not None]
        if self.values is not None and ranged:
            raise FieldProblem((ranged[0],), "give either `values` or `min`/`max`/`distribution`, not both")
        if self.values is None:
            for key in ("min", "max"):
                if getattr(self, key) is None:
                    raise FieldProblem((key,), "required key is missing (expected `values: [...]` or `min` and `max`)")
            if self.min >= self.max:
                raise FieldProblem(("max",), f"expected max > min ({self.min}), got {self.max}")
            if self.distribution == "log_uniform" and self.min <= 0:
                raise FieldProblem(("min",), f"log_uniform needs min > 0, got {self.min}")
            if self.distribution == "int_uniform" and not (self.min.is_integer() and self.max.is_integer()):
                raise FieldProblem(("min",), "int_uniform needs integer min and max")
        return self

    @property
    def sampling(self) -> str:
        """The distribution Optuna samples a min/max axis from (uniform unless set)."""
        return self.distribution or "uniform"

    @property
    def is_range(self) -> bool:
        return self.values is None


class Revert(_Strict):
    """One leave-one-out run: the base recipe with `overrides` applied (e.g. ScaleRL's loss cispo -> dapo)."""

    name: str
    overrides: dict[str, Any] = Field(min_length=1)

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, value: Any) -> Any:
        return _check_name(value)


class EarlyTerminate(_Strict):
    """When the sweep may stop a run before its last step."""

    type: Literal["asymptote", "hyperband", "none"] = "none"
    min_fraction: float = Field(
        0.25, gt=0, le=1, description="fraction of its steps a run always gets (bench/early_termination.py)"
    )
    margin: float | None = Field(
        None,
        ge=0,
        description="asymptote: stop if A's upper bound < best A - margin (reward units); default the study's noise "
        "band (0.02 of its reward scale)",
    )
    eta: int = Field(3, ge=2, description="hyperband: keep 1/eta of the runs at each rung")

    @property
    def rungs(self) -> tuple[float, ...]:
        """asymptote: fractions of planned compute where the sweep pauses to judge runs, min_fraction doubling to 1."""
        fractions = [self.min_fraction]
        while fractions[-1] * 2 < 1:
            fractions.append(fractions[-1] * 2)
        return (*fractions, 1.0) if fractions[-1] < 1 else tuple(fractions)


class ModelSize(_Strict):
    """One value of a `model` axis: its parameter count (Tan et al.'s N) and the cost profile pricing its steps."""

    parameters: float = Field(gt=0, allow_inf_nan=False, description="parameter count, e.g. 1.7e9")
    profile: str = Field(pattern=NAME_PATTERN, description="cost profile of one step of this model")


class Fit(_Strict):
    """How each run's sigmoid is fitted."""

    points: Literal["record_breaking", "all"] | None = Field(
        None,
        description="record_breaking: each run's running frontier (IsoCompute); all: every evaluation (ScaleRL); "
        "unset: record_breaking for isocompute studies, all otherwise",
    )


class Setup(_Strict):
    """The user's own verl or TRL setup the study starts from (planner/frameworks/setup.py); paths are relative to
    the study file. rlscale changes in it only the study's axes and what each run must own."""

    config: str | None = Field(None, description="verl: a verl YAML config; trl: the YAML `trl grpo --config` reads")
    overrides: list[str] = Field(default_factory=list, description="verl: Hydra overrides, as on verl's command line")
    overrides_file: str | None = Field(None, description="verl: a file of Hydra overrides (e.g. a launch script's)")
    keep: list[str] = Field(default_factory=list, description="keys the study changes where the user's value wins")
    replace: list[str] = Field(default_factory=list, description="keys the user's files set that the study changes")
    reward_metric: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description=(
            "the logged metric that is the study's reward; default verl: val-core/<data_source>/reward/mean@<n>, "
            "trl: eval_reward (the reward on the held-out split)"
        ),
    )
    lr_decay_steps: int | None = Field(
        None, ge=1, description="steps a decaying learning-rate schedule decays over; default each run's planned steps"
    )


class Tracking(_Strict):
    """Mirror each evaluation (step, compute, reward) to a tracker (runner/tracking.py); for builtin runs, whose
    jobs have no tracker of their own (verl and TRL jobs log to the user's trainer.logger / report_to)."""

    backend: Literal["mlflow", "trackio", "wandb"]
    uri: str | None = Field(None, max_length=2000, description="mlflow: the tracking URI (a server or sqlite:///path)")
    project: str | None = Field(None, pattern=NAME_PATTERN, description="the experiment/project; default the study")


class Study(_Strict):
    """A study file. `recipe` is the base every run starts from; `parameters` are the axes."""

    name: str
    description: str = ""
    method: Literal["grid", "isocompute", "loo", "bayes"]
    metric: str = Field("val_reward", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    compute: Compute | None = None
    seeds: list[StrictInt] = Field(default_factory=lambda: [0], min_length=1)
    recipe: Recipe = Field(default_factory=Recipe)
    parameters: dict[str, Axis] = Field(default_factory=dict)
    max_batch: int | None = Field(None, ge=1, description="grid/isocompute: leave out points with B_p * n above this")
    leave_one_out: list[Revert] = Field(default_factory=list)
    n_trials: int | None = Field(None, ge=1)
    early_terminate: EarlyTerminate = Field(default_factory=EarlyTerminate)
    fit: Fit = Field(default_factory=Fit)
    models: dict[str, ModelSize] = Field(
        default_factory=dict,
        description=(
            "a `model` axis: each HF directory's parameter count and cost profile (the power law across sizes)"
        ),
    )
    max_concurrent: int | None = Field(
        None,
        ge=1,
        description=(
            "runs in flight at once (rlscale sweep --max-concurrent overrides it); None: as many as the cluster's free "
            "devices admit"
        ),
    )
    setup: Setup | None = Field(None, description="start from the user's own verl or TRL setup (engine verl or trl)")
    tracking: Tracking | None = Field(None, description="mirror each evaluation to MLflow, trackio or W&B")
    _file: str | None = PrivateAttr(None)  # the YAML file it was read from, for messages
    _launch_dir: str | None = PrivateAttr(None)  # where it was loaded: TRL reads a setup's relative paths from there
    extend: float = Field(
        1.0,
        ge=1,
        le=1000,
        allow_inf_nan=False,
        description=(
            "multiply each run's planned compute (and steps) by this; the runs keep their identities, so finished ones "
            "resume from their checkpoints (rlscale sweep --extend)"
        ),
    )

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, value: Any) -> Any:
        return _check_name(value)

    @field_validator("seeds", mode="before")
    @classmethod
    def _seed_count(cls, value: Any) -> Any:
        # `seeds: 3` means seeds 0, 1, 2
        if isinstance(value, bool):
            raise ValueError("expected a count or a list of integers")
        if isinstance(value, int):
            if value < 1:
                raise ValueError(f"expected a count >= 1, got {value}")
            if value > MAX_SEEDS:  # checked before the list is made: `seeds: 100000000` must not take gigabytes
                raise ValueError(f"expected at most {MAX_SEEDS:,} seeds")
            return list(range(value))
        if isinstance(value, list) and len(value) > MAX_SEEDS:
            raise ValueError(f"expected at most {MAX_SEEDS:,} seeds, got {len(value):,}")
        return value

    @field_validator("seeds")
    @classmethod
    def _unique_seeds(cls, value: list[int]) -> list[int]:
        if len(set(value)) != len(value):
            raise ValueError("seeds must be distinct")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "Study":
        for path, message in _problems(self):
            raise FieldProblem(path, message)
        return self

    @property
    def file(self) -> str | None:
        """The YAML file the study was read from (None for a study built in code or read from the store)."""
        return self._file

    @property
    def launch_dir(self) -> str | None:
        """The directory the study was loaded (and swept) in: a TRL setup's relative paths are read from there."""
        return self._launch_dir

    @property
    def fits_record_breaking(self) -> bool:
        """Whether runs are fitted on their record-breaking points (`fit.points`, by default for isocompute)."""
        return self.fit.points == "record_breaking" or (self.fit.points is None and self.method == "isocompute")

    def to_spec(self) -> dict:
        """The stored spec: JSON in study-file keys, unset ones out so it re-validates (e.g. steps beside compute)."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


def _check_name(value: Any) -> Any:
    if isinstance(value, str) and not is_name(value):
        shown = repr(value) if len(value) <= 40 else f"{value[:40]!r}... ({len(value)} characters)"
        raise ValueError(f"expected a name of {NAME_RULE}, got {shown}")
    return value


def run_count(study: Study) -> int:
    """How many runs the study expands to (points x seeds; bayes: trials x seeds), counted without expanding it."""
    if study.method == "bayes":
        points = study.n_trials or 0
    elif study.method == "loo":
        points = 1 + len(study.leave_one_out)
    else:
        points = math.prod(len(axis.values) for axis in study.parameters.values() if axis.values is not None)
    return points * len(study.seeds)


def _problems(study: Study):
    method = study.method
    runs = run_count(study)
    if runs > MAX_RUNS:
        field = "n_trials" if method == "bayes" else "leave_one_out" if method == "loo" else "parameters"
        yield (
            (field,),
            (
                f"the study expands to {runs:,} runs (points x {len(study.seeds)} seed(s)); "
                f"at most {MAX_RUNS:,} are planned at once: split it into several studies"
            ),
        )
        return  # the checks below look at every value
    if method in ("grid", "isocompute", "bayes") and not study.parameters:
        yield ("parameters",), f"method {method} needs at least one axis"
    if method != "loo" and study.leave_one_out:
        yield ("leave_one_out",), f"only for method loo, not {method}"
    if method == "loo":
        if not study.leave_one_out:
            yield ("leave_one_out",), "method loo needs at least one {name, overrides} entry"
        if study.parameters:
            yield ("parameters",), "method loo takes its runs from leave_one_out; remove parameters"
    if method == "bayes" and study.n_trials is None:
        yield ("n_trials",), "method bayes needs n_trials (a positive integer)"
    if method != "bayes" and study.n_trials is not None:
        yield ("n_trials",), f"only for method bayes, not {method}"
    if method == "isocompute":
        if study.compute is None:
            yield ("compute",), "method isocompute needs compute {unit, budget, scope}"
        if not {"prompts_per_batch", "rollouts"} & set(study.parameters):
            yield ("parameters",), "method isocompute needs a prompts_per_batch or rollouts axis"
    if study.max_batch is not None and method not in ("grid", "isocompute"):
        yield ("max_batch",), f"only for methods grid and isocompute, not {method}"
    yield from _model_axis_problems(study)
    yield from _setup_problems(study)
    if study.compute is not None and "steps" in study.recipe.model_fields_set:
        yield ("recipe", "steps"), "steps are set by compute.budget; remove one of the two"
    yield from _recipe_problems(study.recipe.verifier, ("recipe", "verifier"))
    base = study.recipe.to_json()
    for key, axis in study.parameters.items():
        yield from _key_problems(key, ("parameters", key), study)
        if key not in RECIPE_KEYS:
            continue
        if axis.is_range:
            if method != "bayes":
                yield ("parameters", key), f"min/max axes are for method bayes; {method} needs `values: [...]`"
            for bound in ("min", "max"):
                value = getattr(axis, bound)
                if axis.distribution == "int_uniform" or isinstance(base[RECIPE_KEYS[key]], int):
                    value = int(value) if float(value).is_integer() else value
                yield from _value_problems(base, key, value, ("parameters", key, bound))
            continue
        seen = set()
        for i, value in enumerate(axis.values):
            marker = _hashable(value)
            if marker in seen:
                yield ("parameters", key, "values", i), f"duplicate value {value!r}"
            seen.add(marker)
            yield from _value_problems(base, key, value, ("parameters", key, "values", i))
    names = set()
    for i, revert in enumerate(study.leave_one_out):
        if revert.name in names or revert.name == "baseline":
            yield ("leave_one_out", i, "name"), f"run name {revert.name!r} is already taken"
        names.add(revert.name)
        for key, value in revert.overrides.items():
            path = ("leave_one_out", i, "overrides", key)
            yield from _key_problems(key, path, study)
            if key in RECIPE_KEYS:
                yield from _value_problems(base, key, value, path)
                if value == base[RECIPE_KEYS[key]]:
                    yield path, f"{value!r} is already the base recipe's value; this run would change nothing"


def _setup_problems(study: Study):
    setup, engine = study.setup, study.recipe.engine
    if setup is None:
        return
    if engine not in ("verl", "trl"):
        yield ("setup",), f"a setup is a verl or TRL one: expected recipe.engine verl or trl, got {engine}"
    elif engine == "trl" and setup.config is None:
        yield ("setup", "config"), "required for engine trl: the YAML `trl grpo --config FILE` reads"
    elif engine == "trl" and (setup.overrides or setup.overrides_file):
        yield ("setup", "overrides"), "engine trl takes its keys from setup.config only"
    elif engine == "verl" and not (setup.config or setup.overrides or setup.overrides_file):
        yield ("setup",), "engine verl needs setup.config, setup.overrides or setup.overrides_file"
    if "engine" in study.parameters:
        yield ("parameters", "engine"), "a study with a setup runs one engine"
    both = set(setup.keep) & set(setup.replace)
    if both:
        yield ("setup", "keep"), f"{sorted(both)[0]} is in both keep and replace"


def _model_axis_problems(study: Study):
    axis = study.parameters.get("model")
    if axis is None:
        if study.models:
            yield ("models",), "only for a study with a `model` axis (parameters.model.values)"
        return
    if axis.values is None:
        yield ("parameters", "model"), "a model axis needs `values: [...]` (HF directories)"
        return
    for i, value in enumerate(axis.values):
        if isinstance(value, str) and value not in study.models:
            yield (
                ("parameters", "model", "values", i),
                (f"{value!r} has no entry in `models` (expected {{parameters: COUNT, profile: NAME}})"),
            )
    for name in study.models:
        if name not in axis.values:
            yield ("models", name), "not a value of the `model` axis"


def _key_problems(key: str, path: tuple, study: Study):
    if key not in RECIPE_KEYS:
        yield path, "not a recipe key (typo?)"
    elif RECIPE_KEYS[key] == "seed":
        yield path, "seeds are set by the study's `seeds`, not per run"
    elif RECIPE_KEYS[key] == "steps" and study.compute is not None:
        yield path, "steps are set by compute.budget; remove compute or this axis"


def _value_problems(base: dict, key: str, value: Any, path: tuple):
    try:
        recipe = Recipe.model_validate({**base, RECIPE_KEYS[key]: value}, strict=True)  # `1_000` is no int
    except ValidationError as err:
        first = err.errors()[0]
        message = first["msg"]
        if not isinstance(value, (dict, list)):
            message += f" (got {value!r})"
        yield path, message
        return
    if RECIPE_KEYS[key] == "verifier":
        yield from _recipe_problems(recipe.verifier, path)


def _hashable(value: Any) -> Any:
    # duplicates are found in one pass; 1 and 1.0 count as the same value, as == says
    try:
        hash(value)
        return value
    except TypeError:
        return json.dumps(value, sort_keys=True, default=str)


def _recipe_problems(verifier: str | None, path: tuple):
    problem = None if verifier is None else verifier_problem(verifier)
    if problem:
        yield path, problem
