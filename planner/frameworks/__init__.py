"""A recipe as a production configuration: verl 0.9.1, TRL 1.16.0, OpenRLHF 0.11.2 or an rlscale recipe file.
The runner's verl and TRL engines read the same mappings, so what is exported is what they train."""

import yaml
from rlscale.planner.recipe import Recipe

from . import openrlhf, trl, verl
from .common import Deployment, Mapping
from .openrlhf import openrlhf_argv, openrlhf_mapping
from .trl import trl_mapping
from .verl import verl_mapping, verl_overrides

FORMATS = ("verl", "trl", "openrlhf", "yaml")
# format -> (framework, pinned version); scripts/checker_envs.sh installs these versions
TARGETS = {
    "verl": (verl.FRAMEWORK, verl.VERSION),
    "trl": (trl.FRAMEWORK, trl.VERSION),
    "openrlhf": (openrlhf.FRAMEWORK, openrlhf.VERSION),
}
_RENDER = {"verl": verl.render, "trl": trl.render, "openrlhf": openrlhf.render}

__all__ = [
    "FORMATS",
    "TARGETS",
    "Deployment",
    "Mapping",
    "export_config",
    "openrlhf_argv",
    "openrlhf_mapping",
    "trl_mapping",
    "verl_mapping",
    "verl_overrides",
]


def export_config(
    recipe: Recipe, fmt: str, *, header: list[str] | None = None, deployment: Deployment | None = None
) -> str:
    """The text of `recipe` in format `fmt`; `header` lines (provenance) go on top as comments."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if fmt == "yaml":  # every key explicit; `load_recipe` reads it back
        lines = [f"# {line}" for line in header or []]
        return (
            "\n".join(lines)
            + ("\n" if lines else "")
            + yaml.safe_dump(recipe.to_json(), sort_keys=False, allow_unicode=True)
        )
    return _RENDER[fmt](recipe, deployment or Deployment(), list(header or []))
