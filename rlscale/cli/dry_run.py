"""`rlscale sweep STUDY --dry-run`: each planned run's job as its engine would submit it, and the admission plan."""

from pathlib import Path


def print_dry_run(
    study, ray_address: str | None, shared_dir: Path | None, json_out: bool, max_concurrent: int | None = None
) -> None:
    """Each planned run's job as the engine would submit it (a setup study: the user's files and the diff rlscale
    applies to them), then the admission plan; submits and stores nothing."""
    import shlex

    from rlscale.cli.console import console, print_json, safe
    from rlscale.runner.sweep.dry_run import RUN_KEY, admission_plan, dry_run

    points = dry_run(study, ray_address=ray_address, shared_dir=shared_dir)
    plan = admission_plan(study, ray_address=ray_address, shared_dir=shared_dir, max_concurrent=max_concurrent)
    for point in points:
        point["devices_per_node"] = plan["devices"][point["run"]]
        point["starts_first"] = point["run"] in plan["first"]
    if json_out:
        print_json(points)
        return
    for point in points:
        console.print(
            f"[bold]{safe(point['run'])}[/bold] (seed {point['seed']}, engine {point['engine']})",
            highlight=False,
            soft_wrap=True,
        )
        if point.get("changes") is not None:
            for line in _setup_lines(point):
                console.print(f"  {safe(line)}", highlight=False, soft_wrap=True)
            continue
        if point["engine"] == "trl":
            for line in [
                f"job {point['submission_id']} at {point['ray_address']}, holding {point['devices']}",
                f"records: {point['log_file']}",
                f"entrypoint: {point['entrypoint']}",
                "GRPOConfig (as rlscale export --format trl writes it, with the run's keys):",
            ]:
                console.print(f"  {safe(line)}", highlight=False, soft_wrap=True)
            for line in point["config_text"].splitlines():
                console.print(f"    {safe(line)}", highlight=False, soft_wrap=True)
            continue
        if point["engine"] != "verl":
            for key, value in point["recipe"].items():
                console.print(f"  {key}: {safe(value)}", highlight=False, soft_wrap=True)
            continue
        lines = [
            f"job {point['submission_id']} at {point['ray_address']}, {point['gpus']} GPUs",
            f"train data: {point['train_file']}",
            f"validation data: {point['val_file']}",
            f"file logger: {point['log_file']}",
            *[f"env {key}={value}" for key, value in point["env_vars"].items()],
            f"entrypoint: {point['entrypoint']} with the overrides (shell-quoted, one a line):",
        ]
        for line in lines:
            console.print(f"  {safe(line)}", highlight=False, soft_wrap=True)
        for override in point["overrides"]:
            console.print(f"    {safe(shlex.quote(override))}", highlight=False, soft_wrap=True)
    for line in _admission_lines(plan, len(points)):
        console.print(safe(line), highlight=False, soft_wrap=True)
    console.print(
        f"{len(points)} runs; nothing submitted. {RUN_KEY}: the run's key, given when the sweep first stores the run.",
        highlight=False,
        soft_wrap=True,
    )


def _admission_lines(plan: dict, runs: int) -> list[str]:
    """The admission plan in words: the cluster's free devices, the runs that start first, the bound."""
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
    """A setup study's run: where its job goes, the user's files, and what rlscale changes in them (a diff)."""
    from rlscale.planner.frameworks.setup import Change

    changes = [Change(**change) for change in point["changes"]]
    holds = point.get("devices") or point.get("gpus")
    lines = [
        f"job {point['submission_id']} at {point['ray_address']}, holding {holds}",
        f"entrypoint: {point['entrypoint']}",
        f"your setup: {', '.join(point['setup_files']) or 'the study file'}",
        f"rlscale changes {len(changes)} key(s) in it; everything else is yours as written:",
    ]
    return lines + [f"  {change.line()}" for change in changes]
