"""Reading YAML schema files (studies, recipes) safely, with one-line errors naming file and field."""

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from rlscale.base.errors import UserError

M = TypeVar("M", bound=BaseModel)


def load_yaml_mapping(path: str | Path) -> dict:
    """The top-level mapping of a YAML file (safe loader). UserError names the file and line on failure."""
    path = Path(path)
    if not path.is_file():
        raise UserError("file not found", file=str(path))
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "YAML"
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise UserError(f"invalid YAML: {problem}", file=str(path), field=where) from None
    except UnicodeDecodeError:
        raise UserError("not a text file", file=str(path)) from None
    if not isinstance(data, dict):
        raise UserError(f"expected a mapping of keys at the top level, got {type(data).__name__}", file=str(path))
    return data


def validate(model: type[M], data: dict, *, file: str, prefix: str = "") -> M:
    """`model(**data)`, turning the first pydantic error into a UserError with a dotted field path."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise user_error_from_validation(err, file=file, prefix=prefix) from None


def user_error_from_validation(err: ValidationError, *, file: str, prefix: str = "") -> UserError:
    """One line for the first error: `file: field.path: message (got value)`."""
    first = err.errors()[0]
    path = ".".join(str(part) for part in (prefix, *first["loc"]) if part != "")
    kind = first["type"]
    if kind == "extra_forbidden":
        message = "unknown key (typo?)"
    elif kind == "missing":
        message = "required key is missing"
    else:
        message = first["msg"].removeprefix("Value error, ")
        if "input" in first and not isinstance(first["input"], (dict, list)):
            message += f" (got {first['input']!r})"
    return UserError(message, file=file, field=path or None)


def load_recipe(path: str | Path):
    """A Recipe from a YAML mapping of recipe keys (a bare recipe file, or a study file's `recipe:` block)."""
    from rlscale.planner.recipe import Recipe

    data = load_yaml_mapping(path)
    if "recipe" in data and isinstance(data["recipe"], dict):
        return validate(Recipe, data["recipe"], file=str(path), prefix="recipe")
    return validate(Recipe, data, file=str(path))
