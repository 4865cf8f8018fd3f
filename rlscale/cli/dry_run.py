"""`rlscale sweep STUDY --dry-run`: each planned run's job as its engine would submit it, and the admission plan."""

import json
import shlex
from pathlib import Path

from rlscale.base.settings import cache_dir
from rlscale.cli.console import console, print_json, safe, say


def print_dry_run(
    study, ray_address: str | None, shared_dir: Path | None, json_out: bool, max_concurrent: int | None = None
) -> None:
    """Each planned run's job as the engine would submit it, then the admission plan; submits and stores nothing."""
    from rlscale.runner.sweep.dry_run import RUN_KEY, admission_plan, dry_run

    points = dry_run(study, ray_address=ray_address, shared_dir=shared_dir)
    plan = admission_plan(study, ray_address=ray_address, shared_dir=shared_dir, max_concurrent=max_concurrent)
    for point in points:
        point["devices_per_node"] = plan["devices"][point["run"]]
        point["starts_first"] = point["run"] in plan["first"]
        if point.get("entrypoint"):
            point["command"] = command_text(point)
    if json_out:
        print_json(points)
        return
    commands = write_commands(study.name, points)
    for point in points:
        console.print(
            f"[bold]{safe(point['run'])}[/bold] (seed {point['seed']}, engine {point['engine']})",
            highlight=False,
            soft_wrap=True,
        )
        words, whole = _job_lines(point)
        for line in [*_composed_lines(point), *words]:
            say(line, first="  ", rest="      ")
        for line in whole:  # a YAML or overrides to copy: whole lines
            console.print(f"    {safe(line)}", highlight=False, soft_wrap=True)
    for line in [*_admission_lines(plan, len(points)), *_summary_lines(points, commands)]:
        say(line, rest="    ")
    say(f"{len(points)} runs; nothing submitted. {RUN_KEY}: the run's key, given when the sweep first stores the run.")


def _job_lines(point: dict) -> tuple[list[str], list[str]]:
    """A point's job in lines to wrap, and lines to print whole (TRL's GRPOConfig, verl's overrides shell-quoted)."""
    if point.get("changes") is not None:
        return _setup_lines(point), []
    if point["engine"] == "trl":
        lines = [
            f"job {point['submission_id']} at {point['ray_address']}, holding {point['devices']}",
            f"records: {point['log_file']}",
            f"entrypoint: {point['entrypoint']}",
            "GRPOConfig (as rlscale export --format trl writes it, with the run's keys):",
        ]
        return lines, point["config_text"].splitlines()
    if point["engine"] != "verl":
        recipe = [
            f"{key}: {value if isinstance(value, str) else json.dumps(value)}" for key, value in point["recipe"].items()
        ]
        return recipe + [f"note: {note}" for note in point.get("notes", [])], []
    lines = [
        f"job {point['submission_id']} at {point['ray_address']}, {point['gpus']} GPUs",
        f"train data: {point['train_file']}",
        f"validation data: {point['val_file']}",
        f"file logger: {point['log_file']}",
        *[f"env {key}={value}" for key, value in point["env_vars"].items()],
        f"entrypoint: {point['entrypoint']} with the overrides (shell-quoted, one a line):",
    ]
    return lines, [shlex.quote(override) for override in point["overrides"]]


def _admission_lines(plan: dict, runs: int) -> list[str]:
    from rlscale.runner.sweep.pool import devices_text

    bound = f"at most {plan['max_concurrent']} at once" if plan["max_concurrent"] else "no --max-concurrent bound"
    if not plan["nodes"]:
        return [f"admission: the cluster could not be read; runs start as their devices free up ({bound})"]
    free = ", ".join(devices_text([node]) for node in plan["nodes"])
    first = plan["first"]
    lines = [
        f"admission: free now {free}; {bound}",
        f"  starts first ({len(first)} of {runs}): {', '.join(first) or 'none fits yet'}",
    ]
    if len(first) < runs:
        lines.append("  the others start as runs finish, whole jobs only, in plan order")
    return lines


def _setup_lines(point: dict) -> list[str]:
    from rlscale.planner.frameworks.setup import Change

    changes = [Change(**change) for change in point["changes"]]
    holds = point.get("devices") or point.get("gpus")
    lines = [
        f"job {point['submission_id']} at {point['ray_address']}, holding {holds}",
        f"entrypoint: {point['entrypoint']}",
        f"your setup: {', '.join(point['setup_files']) or 'the study file'}",
        f"rlscale changes {len(changes)} key(s) in it; everything else is yours as written:",
    ]
    lines += [f"  {change.line()}" for change in changes]
    return lines + [f"note: {note}" for note in point.get("notes", [])]


def _composed_lines(point: dict) -> list[str]:
    composed = point.get("composed")
    if not composed:
        return []
    return [f"composed with {composed['framework']} {composed['version']} ({composed['config']}): ok"]


def _summary_lines(points: list[dict], commands: Path | None) -> list[str]:
    lines = []
    for engine in dict.fromkeys(point["engine"] for point in points if point["engine"] != "builtin"):
        mine = [point for point in points if point["engine"] == engine]
        composed = [point["composed"] for point in mine if point.get("composed")]
        if composed:
            lines.append(f"composed with {engine} {composed[0]['version']}: {len(composed)} of {len(mine)}")
    if commands is not None:
        lines.append(f"each job's full command: {commands}")
    return lines


def command_text(point: dict) -> str:
    """A point's first job as one shell command: its environment, entrypoint and overrides, shell-quoted."""
    env = [f"{key}={shlex.quote(str(value))}" for key, value in (point.get("env_vars") or {}).items()]
    words = [*map(shlex.quote, point.get("overrides") or [])]
    return " \\\n    ".join([*env, point["entrypoint"], *words]) if words or env else point["entrypoint"]


def write_commands(study: str, points: list[dict]) -> Path | None:
    """<cache>/dry-run/<study>.sh, each point's first job as the sweep launches it; None if no point has a command."""
    from rlscale.base.files import write_whole
    from rlscale.runner.sweep.dry_run import RUN_KEY

    shown = [point for point in points if point.get("command")]
    if not shown:
        return None
    lines = [
        "#!/usr/bin/env bash",
        f"# rlscale sweep --dry-run {study}: each run's first job ({RUN_KEY}: the run's key)",
    ]
    for point in shown:
        lines += ["", f"# run {point['run']} (seed {point['seed']}), job {point['submission_id']}", point["command"]]
    return write_whole(cache_dir() / "dry-run" / f"{study}.sh", "\n".join(lines) + "\n")
