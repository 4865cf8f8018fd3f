"""Reading YAML schema files (studies, recipes) safely, with one-line errors naming file and field."""

import math
import re
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from rlscale.planner.recipe import Recipe

from rlscale.base.errors import UserError
from rlscale.base.names import verifier_problem

M = TypeVar("M", bound=BaseModel)


class StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2 core-schema scalars and duplicate keys refused: YAML 1.1 would read
    `1_000` as 1000, `010` as 8, `1:30` as 90, `yes` as true, and keep a repeated key's last value silently."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = {}
            for key_node, _value in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                except TypeError:  # an unhashable key: the base constructor reports it
                    continue
                if duplicate:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} appears twice (first on line {seen[key] + 1})", key_node.start_mark
                    )
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


_CORE = {"tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"}
StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in _CORE]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789")
)
StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def _core_int(loader, node) -> int:
    text = loader.construct_scalar(node)
    if text.startswith(("0o", "0x")):
        return int(text[2:], 8 if text[1] == "o" else 16)
    return int(text)  # decimal; a leading zero is not octal in YAML 1.2


def _core_float(loader, node) -> float:
    text = loader.construct_scalar(node).lower()
    if text.endswith(".inf"):
        return -math.inf if text.startswith("-") else math.inf
    return math.nan if text == ".nan" else float(text)


StrictLoader.add_constructor("tag:yaml.org,2002:int", _core_int)
StrictLoader.add_constructor("tag:yaml.org,2002:float", _core_float)


def load_yaml_mapping(path: str | Path) -> dict:
    """The top-level mapping of a YAML file (safe loader). UserError names the file and line on failure."""
    path = Path(path)
    if not path.is_file():
        raise UserError("a directory, expected a YAML file" if path.is_dir() else "file not found", file=str(path))
    try:
        data = yaml.load(path.read_text(), Loader=StrictLoader)  # noqa: S506 (a SafeLoader subclass)
    except UnicodeDecodeError as err:
        raise UserError(
            f"not UTF-8 text: byte {err.object[err.start]:#04x} at offset {err.start}", file=str(path)
        ) from None
    except RecursionError:
        raise UserError("invalid YAML: nested too deeply", file=str(path)) from None
    except ValueError:  # int() of more than 4300 digits
        raise UserError("invalid YAML: a number with more than 4300 digits", file=str(path)) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "YAML"
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise UserError(f"invalid YAML: {problem}", file=str(path), field=where) from None
    if not isinstance(data, dict):
        raise UserError(f"expected a mapping of keys at the top level, got {type(data).__name__}", file=str(path))
    return data


def validate(model: type[M], data: dict, *, file: str, prefix: str = "") -> M:
    """`model(**data)`, turning the first pydantic error into a UserError with a dotted field path."""
    try:
        return model.model_validate(data, strict=True)  # YAML's scalars as they are: "1_000" is not 1000
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
        shown = repr(first.get("input"))
        # a validator's own message may already quote the value, shortened
        if "input" in first and not isinstance(first["input"], (dict, list)) and ", got " not in message:
            message += f" (got {shown if len(shown) <= 60 else shown[:60] + f'... ({len(shown)} characters)'})"
    return UserError(message, file=file, field=path or None)


def load_recipe(path: str | Path):
    """A Recipe from a YAML mapping of recipe keys (a bare recipe file, or a study file's `recipe:` block)."""
    data = load_yaml_mapping(path)
    block = "recipe" in data and isinstance(data["recipe"], dict)
    varied = [key for key in ("parameters", "compute") if key in data]
    if block and varied:  # its runs are the recipe with the axes and the budget applied: none is the bare block
        raise UserError(
            "a study file: its runs differ from its base recipe by its axes and budget; export a decided study "
            "(--study NAME) or a recipe file",
            file=str(path),
            field=varied[0],
        )
    recipe = (
        validate(Recipe, data["recipe"], file=str(path), prefix="recipe")
        if block
        else validate(Recipe, data, file=str(path))
    )
    problem = None if recipe.verifier is None else verifier_problem(recipe.verifier)
    if problem:  # the same rule as in study files: a bare recipe file is exported and run too
        raise UserError(problem, file=str(path), field="recipe.verifier" if block else "verifier")
    return recipe
