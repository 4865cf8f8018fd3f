"""Reading a study from a YAML file (with the verl or TRL setup it names) or a stored spec into a checked Study;
a setup study is planned here only to check its varied keys against the user's files."""

from pathlib import Path

from pydantic import ValidationError
from rlscale.planner.frameworks.setup import check_study_setup, recipe_from_setup, setup_key, study_setup
from rlscale.planner.loading import load_yaml_mapping, user_error_from_validation
from rlscale.planner.planning import planned_runs
from rlscale.planner.profiles import load_profile
from rlscale.planner.recipe import Recipe
from rlscale.planner.study import FieldProblem, Study

from rlscale.base.errors import UserError

FILE_KEY = "study_file"  # in a stored spec: the YAML the sweep read, so printed commands can extend it
LAUNCH_DIR_KEY = "launch_dir"  # in a stored spec: where the sweep ran, so an export finds what its jobs found


def load_study(path: str | Path) -> Study:
    """The study in a YAML file; UserError naming the file and dotted field path on any problem."""
    data = load_yaml_mapping(path)
    data.setdefault("name", Path(path).stem)
    if isinstance(data.get("recipe"), dict) and "seed" in data["recipe"]:  # a file's; a stored `run` spec may have it
        raise UserError("seeds are set by the study's `seeds`, not in the recipe", file=str(path), field="recipe.seed")
    study = parse_study(data, file=str(path))
    study._file, study._launch_dir = str(path), str(Path.cwd())
    if study.setup is not None:
        study = _with_setup(study, Path(path).parent)
    if study.compute is not None and study.compute.profile is not None:
        load_profile(study.compute.profile, field="compute.profile", file=str(path))
    for name, size in study.models.items():
        load_profile(size.profile, field=f"models.{name}.profile", file=str(path))
    return study


def _with_setup(study: Study, folder: Path) -> Study:
    block = study.setup
    paths = {
        key: str((folder / value).resolve())
        for key in ("config", "overrides_file")
        if (value := getattr(block, key)) is not None
    }
    shown = study.file
    study = study.model_copy(update={"setup": block.model_copy(update=paths)})
    study._file = shown
    setup = study_setup(study)
    derived = recipe_from_setup(setup)
    explicit = study.recipe.model_dump(by_alias=True, exclude_unset=True)
    if study.compute is None and "steps" not in explicit and derived.get("max_steps"):
        derived["steps"] = derived["max_steps"]
    derived.pop("max_steps", None)
    try:
        Recipe.model_validate(derived)
    except ValidationError as err:  # a value in the user's file that is not what the key takes: name that file
        first = err.errors()[0]
        key = setup_key(setup.framework, str(first["loc"][0]))
        raise UserError(
            f"{first['msg']} (got {first.get('input')!r})", file=setup.source.get(key, shown), field=key
        ) from None
    for field, value in explicit.items():  # the job runs the user's value: a different one here would never train
        key = setup_key(setup.framework, field)
        if field in derived and key != field and repr(derived[field]) != repr(value) and field not in study.parameters:
            raise UserError(
                f"{value!r} here, but {key} is {derived[field]!r} in {setup.source[key]}, which the runs train with; "
                "set it in one place (your file, or an axis of the study)",
                file=shown,
                field=f"recipe.{field}",
            )
    try:
        recipe = Recipe.model_validate({**derived, **explicit})
    except ValidationError as err:
        raise user_error_from_validation(err, file=shown, prefix="recipe") from None
    study = study.model_copy(update={"recipe": recipe})
    study._file = shown
    check_study_setup(study, [run.recipe for run in planned_runs(study)])
    return study


def parse_study(data: dict, *, file: str) -> Study:
    """Validate a study mapping; UserError with the field path of the first problem."""
    try:
        return Study.model_validate(data, strict=True)  # YAML's scalars as they are: "1_000" is not 1000
    except ValidationError as err:
        first = err.errors()[0]
        problem = first.get("ctx", {}).get("error")
        if isinstance(problem, FieldProblem):
            where = ".".join(str(part) for part in (*first["loc"], *problem.path))
            raise UserError(problem.message, file=file, field=where or None) from None
        raise user_error_from_validation(err, file=file) from None


def study_from_spec(spec: dict, *, name: str) -> Study | None:
    """The Study a stored spec describes, or None for an empty one (an imported study's); the one parser of stored
    specs that status, report, recommend and export share."""
    if not spec:
        return None
    spec = dict(spec)
    file, launch_dir = spec.pop(FILE_KEY, None), spec.pop(LAUNCH_DIR_KEY, None)
    study = parse_study({"name": name, **spec}, file=f"study {name} in the store")
    study._file, study._launch_dir = file, launch_dir
    return study


def stored_spec(study: Study) -> dict:
    """The spec a sweep stores: the study's own keys, the absolute path of the file it was read from and the directory
    it was loaded in."""
    spec = study.to_spec()
    if study.file is not None:
        spec[FILE_KEY] = str(Path(study.file).resolve())
    if study.launch_dir is not None:
        spec[LAUNCH_DIR_KEY] = study.launch_dir
    return spec


def stored_study(store, name: str) -> Study | None:
    """The study stored as `name` in `store` (rlscale.db.store.Store, or anything with its `study_spec`), typed;
    None for a study imported without a spec. UserError naming the known studies if there is none."""
    return study_from_spec(store.study_spec(name), name=name)
