"""Finding cost profiles by name: the built-ins, or JSON files saved by `rlscale plan --calibrate`.
Built-in names cannot be shadowed, so `scalerl-8b` always means ScaleRL's published scale."""

import json
from pathlib import Path

from pydantic import ValidationError
from rlscale.planner.cost import BUILTIN_PROFILES, Profile

from rlscale.base import settings
from rlscale.base.errors import UserError
from rlscale.base.names import check_name, is_name


def profiles_dir() -> Path:
    return settings.cache_dir() / "profiles"


def known_profiles() -> list[str]:
    """Built-in names, then saved ones."""
    saved = sorted(p.stem for p in profiles_dir().glob("*.json")) if profiles_dir().is_dir() else []
    return [*BUILTIN_PROFILES, *(name for name in saved if name not in BUILTIN_PROFILES)]


def load_profile(name: str, *, field: str = "--profile", file: str | None = None) -> Profile:
    """The profile called `name`; UserError naming `field` and the known names if there is none."""
    if name in BUILTIN_PROFILES:
        return BUILTIN_PROFILES[name]
    path = profiles_dir() / f"{name}.json"
    if not is_name(name) or not path.is_file():  # a profile name is a file name: never a path
        raise UserError(
            f"unknown cost profile {name!r}; expected one of {', '.join(known_profiles())}", file=file, field=field
        )
    try:
        return Profile.model_validate(json.loads(path.read_text()))
    except (ValueError, ValidationError) as err:
        raise UserError(f"saved profile is not valid: {str(err).splitlines()[0]}", file=str(path)) from None


def save_profile(profile: Profile) -> Path:
    """Write `profile` as JSON where load_profile finds it; returns the path."""
    if profile.name in BUILTIN_PROFILES:
        raise UserError(f"{profile.name!r} is a built-in profile name; choose another", field="profile")
    check_name(profile.name, field="profile", what="profile name")
    path = profiles_dir() / f"{profile.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile.model_dump(), indent=2) + "\n")
    return path
