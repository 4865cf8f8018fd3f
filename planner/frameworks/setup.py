"""The user's own verl or TRL setup (a study's `setup:` block): the keys its files set and the keys the study changes.
A key set by both is a conflict unless `keep` (user's value wins) or `replace` (study's wins) names it."""

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rlscale.planner.frameworks import trl, verl
from rlscale.planner.frameworks.trl import accumulation_keeping_updates
from rlscale.planner.frameworks.verl import hydra_value
from rlscale.planner.loading import StrictLoader, load_yaml_mapping
from rlscale.planner.planning import planned_runs

from rlscale.base.errors import UserError

# verl YAML keys that are Hydra's own, not the trainer's config
HYDRA_KEYS = ("defaults", "hydra")


@dataclass(frozen=True)
class UserSetup:
    """What the user's files set: `keys` in the framework's own names, each with the file that sets it (`source`).
    A TRL file's `env:` block is kept apart in `env` (the job's environment, not the driver's)."""

    framework: str
    keys: dict[str, Any]
    source: dict[str, str]
    config_file: str | None = None
    overrides: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    config_name: str | None = None  # verl: one of verl's own configs (`--config-name=ppo_megatron_trainer`)
    config_origin: str | None = None  # the file whose --config-name/--config-path chose the config

    def sets(self, key: str) -> bool:
        return key in self.keys

    def files(self) -> list[str]:
        """The user's files this setup reads, in order."""
        found = [self.config_file, self.config_origin, *self.source.values()]
        return [path for path in dict.fromkeys(found) if path and Path(path).is_file()]


@dataclass(frozen=True)
class Change:
    """One key rlscale sets in the user's config for a run: `before` the user's value (None: unset), `after`
    rlscale's (None: removed), `why` the study's reason."""

    key: str
    before: Any
    after: Any
    why: str

    def line(self) -> str:
        """`~ key: before -> after  (why)`; `+` added, `-` removed, `=` kept as written."""
        if self.after is None:
            return f"- {self.key}: {_shown(self.before)}  ({self.why})"
        if repr(self.before) == repr(self.after):
            return f"= {self.key}: {_shown(self.after)}  ({self.why})"
        if self.before is None:
            return f"+ {self.key}: {_shown(self.after)}  ({self.why})"
        return f"~ {self.key}: {_shown(self.before)} -> {_shown(self.after)}  ({self.why})"

    def to_dict(self) -> dict:
        return {"key": self.key, "before": self.before, "after": self.after, "why": self.why}


def _shown(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text.removesuffix("\n...").removesuffix(" ...")


def read_setup(
    framework: str, *, config: str | None, overrides: list[str], overrides_file: str | None, study_file: str | None
) -> UserSetup:
    """The keys the user's files set; verl: config leaves, then the overrides file, then the study's overrides
    (later wins, as on verl's command line). UserError naming the file for a bad file."""
    keys: dict[str, Any] = {}
    source: dict[str, str] = {}
    env: dict[str, str] = {}
    words: list[tuple[str, str]] = []
    if overrides_file is not None:
        words += [(word, overrides_file) for word in override_words(overrides_file)]
    words += [(word, study_file or "the study") for word in overrides]
    flags = {word.split("=", 1)[0]: (word, origin) for word, origin in words if word.startswith("--")}
    words = [(word, origin) for word, origin in words if not word.startswith("--")]
    config_name, config_origin = None, None
    if flags:
        config, config_name, config_origin = hydra_config(flags, config=config, study_file=study_file)
    if config is not None:
        data = load_yaml_mapping(config)
        if framework == "trl":
            env = {str(k): str(v) for k, v in (data.pop("env", None) or {}).items()}
            leaves = {str(key): value for key, value in data.items()}
        else:
            leaves = dict(_flatten({k: v for k, v in data.items() if k not in HYDRA_KEYS}))
        keys.update(leaves)
        source.update(dict.fromkeys(leaves, config))
    for word, origin in words:
        key, value = parse_override(word, file=origin)
        if value is _DELETE:
            keys.pop(key, None)
            source.pop(key, None)
        else:
            keys[key], source[key] = value, origin
    return UserSetup(
        framework,
        keys,
        source,
        config_file=config,
        overrides=tuple(word for word, _ in words),
        env=env,
        config_name=config_name,
        config_origin=config_origin,
    )


# verl's main_ppo reads its configs from verl/trainer/config: Hydra takes a relative --config-path from there
VERL_CONFIG_PATHS = ("config", "./config")


def hydra_config(flags: dict, *, config: str | None, study_file: str | None) -> tuple[str | None, str | None, str]:
    """(YAML config file, verl config name, the file that says so) from Hydra's --config-path/--config-name flags;
    a name alone (or with verl's `config` folder) is one of verl's own configs."""
    for name, (word, origin) in flags.items():
        if name not in ("--config-path", "--config-name") or "=" not in word:
            raise UserError(f"Hydra flag {word[:80]!r}: only --config-path=DIR and --config-name=NAME", file=origin)
    name_word, origin = flags.get("--config-name", (None, None))
    path_word, path_origin = flags.get("--config-path", (None, None))
    origin = origin or path_origin
    if name_word is None:
        raise UserError("--config-path without --config-name: name the config", file=origin, field="--config-path")
    name = name_word.split("=", 1)[1].strip("'\"").removesuffix(".yaml")
    if config is not None:
        raise UserError(
            f"--config-name here and setup.config ({config}) in {study_file or 'the study'}: give the config once",
            file=origin,
            field="--config-name",
        )
    folder = path_word.split("=", 1)[1].strip("'\"") if path_word else None
    if folder is None or folder.rstrip("/") in VERL_CONFIG_PATHS:
        return None, name, origin
    if not Path(folder).is_absolute():
        raise UserError(
            f"relative --config-path {folder!r}: Hydra reads it from verl's own folder; give an absolute path",
            file=origin,
            field="--config-path",
        )
    path = Path(folder) / f"{name}.yaml"
    if not path.is_file():
        raise UserError(f"no config {path}", file=origin, field="--config-name")
    return str(path), None, origin


def override_words(path: str) -> list[str]:
    """The Hydra overrides in a file as the shell would split them, a leading launch line skipped; UserError when
    that line runs a module other than main_ppo (the jobs run main_ppo)."""
    file = Path(path)
    if not file.is_file():
        raise UserError("file not found", file=path)
    try:
        words = shlex.split(file.read_text().replace("\\\n", " "), comments=True)
    except (ValueError, UnicodeDecodeError) as err:
        raise UserError(f"not a list of Hydra overrides ({err})", file=path) from None
    launch = []
    while words and "=" not in words[0] and not words[0].startswith("~"):
        launch.append(words.pop(0))
    module = launch[launch.index("-m") + 1] if "-m" in launch[:-1] else VERL_MAIN
    if module != VERL_MAIN:
        raise UserError(
            f"launches {module}; rlscale's jobs run {VERL_MAIN} with your overrides, so a recipe's own trainer "
            "is not supported",
            file=path,
            field="-m",
        )
    return words


VERL_MAIN = "verl.trainer.main_ppo"  # the module every verl job runs (rlscale.runner.verl.job.ENTRYPOINT)


_DELETE = object()


def parse_override(word: str, *, file: str) -> tuple[str, Any]:
    """(key, value) of one Hydra override (`~key`: value _DELETE); the value read as YAML 1.2, as Hydra reads it."""
    if word.startswith("~"):
        return word[1:].split("=", 1)[0], _DELETE
    key, sep, text = word.lstrip("+").partition("=")
    if not sep or not key or any(c.isspace() for c in key):
        raise UserError(f"expected a Hydra override key=value, got {word[:80]!r}", file=file)
    try:
        value = yaml.load(text, Loader=StrictLoader) if text.strip() else ""  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError:
        value = text  # Hydra reads what YAML cannot (e.g. a bare interpolation) as a string
    return key, value


def _flatten(data: dict, prefix: str = ""):
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from _flatten(value, dotted + ".")
        else:
            yield dotted, value


def axis_keys(recipes: list, mapping, *, owned: set[str]) -> dict[str, str]:
    """Framework keys the study's runs set differently -> the recipe fields setting them (comma-joined); `owned` out."""
    values = [mapping(recipe) for recipe in recipes]
    keys = [
        key
        for key in sorted(set().union(*values))
        if key not in owned and len({repr(entry.get(key)) for entry in values}) > 1
    ]
    setters = _setters(recipes, mapping, keys)
    every = ", ".join(setters) or "the study"
    return {key: ", ".join(name for name, found in setters.items() if key in found) or every for key in keys}


def _setters(recipes: list, mapping, keys: list[str]) -> dict[str, set[str]]:
    base, first = recipes[0], mapping(recipes[0])
    dumps = [recipe.to_json() for recipe in recipes]
    out: dict[str, set[str]] = {}
    varied = [key for key in dumps[0] if key not in ("steps", "seed") and len({repr(d[key]) for d in dumps}) > 1]
    for name in varied:
        out[name] = set()
        for value in {repr(d[name]): d[name] for d in dumps}.values():
            try:
                other = mapping(type(base).model_validate({**dumps[0], name: value}))
            except ValueError:  # a value valid only beside another field's: count the field for every key
                out[name] = set(keys)
                break
            out[name] |= {key for key in keys if repr(other.get(key)) != repr(first.get(key))}
    return out


def check_conflicts(
    setup: UserSetup,
    changed: dict[str, str],
    *,
    keep: list[str],
    replace: list[str],
    study_file: str | None,
    axes: dict[str, str] | None = None,
) -> None:
    """Raise every conflict at once: a changed key the user also sets (unless kept/replaced), a keep/replace typo,
    or a `keep` of an axis's own key (it would train every run at the user's value)."""
    problems = []
    for name, entries in (("keep", keep), ("replace", replace)):
        for key in entries:
            if key not in changed:
                problems.append(
                    UserError(
                        f"{key} is not a key the study changes (it changes: {', '.join(changed) or 'none'})",
                        file=study_file,
                        field=f"setup.{name}",
                    )
                )
    for key in keep:
        if key in (axes or {}) and key in changed:
            problems.append(
                UserError(
                    f"keep {key} would defeat the study's {axes[key]} axis: every run would train at your "
                    f"{_shown(setup.keys.get(key))}; name it in setup.replace, or drop the axis",
                    file=study_file,
                    field="setup.keep",
                )
            )
    for key, why in changed.items():
        if setup.sets(key) and key not in keep and key not in replace:
            problems.append(
                UserError(
                    f"set here and varied by {by_axes(why)}; remove it, or name it in the study's "
                    "setup.keep (your value wins) or setup.replace (the study's wins)",
                    file=setup.source[key],
                    field=key,
                )
            )
    if problems:
        raise one_error(problems)


def by_axes(why: str) -> str:
    """'the study's rollouts axis' (or '... B and C axes') for a key's setters from axis_keys."""
    fields = why.split(", ")
    if why == "the study":
        return why
    return f"the study's {' and '.join(fields)} " + ("axis" if len(fields) == 1 else "axes")


def one_error(problems: list[UserError]) -> UserError:
    """Several problems as one UserError, a line each; one problem as itself."""
    if len(problems) == 1:
        return problems[0]
    lines = list(dict.fromkeys(str(problem) for problem in problems))
    return UserError("\n".join(lines)) if len(lines) > 1 else problems[0]


def _framework(name: str):
    return {"verl": verl, "trl": trl}[name]


def study_setup(study) -> UserSetup:
    block = study.setup
    return read_setup(
        study.recipe.engine,
        config=block.config,
        overrides=list(block.overrides),
        overrides_file=block.overrides_file,
        study_file=study.file,
    )


def recipe_from_setup(setup: UserSetup) -> dict:
    """The recipe fields the user's keys say, so plans price the user's own batch."""
    try:
        return _framework(setup.framework).recipe_from_keys(setup.keys)
    except UserError as err:  # a value rlscale cannot count with: name the file that sets the key
        raise UserError(err.detail, file=err.file or setup.source.get(err.field), field=err.field) from None


def setup_key(framework: str, field: str) -> str:
    """The framework key a recipe field is read from in a user's setup (the field's own name when none is)."""
    return _framework(framework).RECIPE_FROM_KEYS.get(field, field)


def changed_keys(study, recipes: list) -> dict[str, str]:
    """The framework keys the study's runs set differently -> the recipe fields behind them."""
    module = _framework(study.recipe.engine)
    changed = axis_keys(recipes, module.axis_values, owned=set(module.RUN_KEYS))
    if study.recipe.engine == "trl" and "generation_batch_size" in changed:  # TRL takes one of the two
        changed["steps_per_generation"] = changed["generation_batch_size"]
    return changed


def check_study_setup(study, recipes: list) -> dict[str, str]:
    """The keys the study changes, after checking them against the user's files (check_conflicts)."""
    changed = changed_keys(study, recipes)
    framework = study.recipe.engine
    check_conflicts(
        study_setup(study),
        changed,
        keep=list(study.setup.keep),
        replace=list(study.setup.replace),
        study_file=study.file,
        axes={setup_key(framework, axis): axis for axis in study.parameters},
    )
    return changed


@dataclass(frozen=True)
class SetupPlan:
    """What every job of a setup study applies (engines get it as their `setup` option); `reward_metric` None: the
    engine's default; `study` names the trackers' run group: the study's `tracking.project`, else the study."""

    setup: UserSetup
    changed: dict[str, str]
    keep: tuple[str, ...]
    reward_metric: str | None
    study: str
    lr_decay_steps: int | None = None  # the study's length for a decaying lr schedule (frameworks/schedule.py)

    def values(self, recipe) -> dict[str, Any]:
        """The study's values for its changed, not kept, keys in `recipe`'s run (None: the key goes)."""
        values = _framework(self.setup.framework).axis_values(recipe)
        return {
            key: (None if key == "steps_per_generation" else values.get(key))
            for key in self.changed
            if key not in self.keep
        }

    def changes(self, recipe) -> list[Change]:
        """The study's changes to the user's keys in `recipe`'s run, for the dry-run's diff."""
        values = self.values(recipe)
        return [
            Change(key, self.setup.keys.get(key), values[key], f"axis {self.changed[key]}")
            for key in values
            if repr(values[key]) != repr(self.setup.keys.get(key))
        ]


def setup_plan(study) -> SetupPlan | None:
    if study.setup is None:
        return None
    changed = changed_keys(study, [run.recipe for run in planned_runs(study)])
    block = study.setup
    # the jobs' own trackers group their runs where the study's mirror does (runner/tracking.py)
    group = study.tracking.project if study.tracking is not None and study.tracking.project else study.name
    return SetupPlan(study_setup(study), changed, tuple(block.keep), block.reward_metric, group, block.lr_decay_steps)


def export_setup(plan: SetupPlan, recipe, header: list[str], *, paths: dict | None = None) -> str:
    """The user's own config (verl: launch script; TRL: YAML) with only the changed keys and steps set to `recipe`'s;
    TRL: `paths` (its local paths made absolute, as the sweep's jobs ran) replace the config's."""
    values = plan.values(recipe)
    setup = plan.setup
    lines = [f"# {line}" for line in header]
    lines += [f"# your setup: {', '.join(setup_files(setup)) or 'the study file'}; the decision changes:"]
    steps_key = "trainer.total_training_steps" if setup.framework == "verl" else "max_steps"
    values[steps_key] = recipe.steps
    lines += [
        f"#   {Change(key, setup.keys.get(key), value, 'decided').line()}"
        for key, value in values.items()
        if repr(value) != repr(setup.keys.get(key))
    ]
    if setup.framework == "trl":
        accumulation = accumulation_keeping_updates(setup.keys, values)
        if accumulation is not None:  # as the sweep's jobs ran
            values["gradient_accumulation_steps"] = accumulation
            before = setup.keys.get("gradient_accumulation_steps")
            change = Change("gradient_accumulation_steps", before, accumulation, "your updates per generated batch")
            lines.append(f"#   {change.line()}")
        lines += [
            f"#   {Change(key, setup.keys.get(key), value, 'path: made absolute, as the jobs ran').line()}"
            for key, value in (paths or {}).items()
            if key not in values
        ]
        config = load_yaml_mapping(setup.config_file)
        for key, value in {**(paths or {}), **values}.items():
            if value is None:
                config.pop(key, None)
            else:
                config[key] = value
        return (
            "\n".join(["# target: TRL 1.16.0 (`trl grpo --config FILE`)", *lines])
            + "\n"
            + yaml.safe_dump(config, sort_keys=False, allow_unicode=True)
        )
    words = []
    if setup.config_file:
        path = Path(setup.config_file)
        words += [f"--config-path={path.parent}", f"--config-name={path.stem}"]
    elif setup.config_name:
        words += [f"--config-name={setup.config_name}"]
    words += [word for word in setup.overrides if parse_override(word, file="")[0] not in values]
    words += [f"{key}={hydra_value(value)}" for key, value in values.items() if value is not None]
    body = " \\\n    ".join(["python3 -m verl.trainer.main_ppo", *map(shlex.quote, words)])
    return (
        "\n".join(["#!/usr/bin/env bash", "# target: verl 0.9.1, your launch with the decision applied", *lines, body])
        + "\n"
    )


def setup_files(setup: UserSetup) -> list[str]:
    """The user's setup as the dry-run and the export name it: verl's own config by name, then the user's files."""
    named = [f"verl's {setup.config_name}"] if setup.config_name else []
    return named + setup.files()
