"""`rlscale plan`: a compute budget -> an IsoCompute grid; a study file -> its runs; `--calibrate` the cost model."""

import datetime
import os
import platform
from pathlib import Path
from typing import Annotated

import typer

from rlscale.base.errors import UserError
from rlscale.base.names import check_name
from rlscale.base.numbers import format_number
from rlscale.cli.console import console, print_json, safe, say, table


def _fmt(value: float) -> str:
    return format_number(value, "compact")  # 12,345 from 1,000 up, else 4 significant digits


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan(
        study: Annotated[
            str | None, typer.Argument(help="a study file (studies/*.yaml): show its runs and compute")
        ] = None,
        budget: Annotated[
            float | None, typer.Option(help="GPU-hours for the whole sweep (one run's with --per-run)")
        ] = None,
        per_run: Annotated[bool, typer.Option("--per-run", help="--budget is one point's GPU-hours")] = False,
        prompts: Annotated[str | None, typer.Option(help="B_p axis, e.g. 32,64,128 or 32,64,...,1024")] = None,
        rollouts: Annotated[str | None, typer.Option(help="n axis, e.g. 8,16,32 or 8,16,...,2048")] = None,
        max_batch: Annotated[int | None, typer.Option(help="leave out points with B_p * n above this")] = None,
        min_steps: Annotated[int, typer.Option(help="drop points that cannot reach this many steps")] = 1,
        profile: Annotated[
            str | None, typer.Option(help="cost profile: scalerl-8b, tiny-cpu or a calibrated one")
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
        save: Annotated[str | None, typer.Option(help="store the plan under this name")] = None,
        calibrate: Annotated[str | None, typer.Option(help="fit a cost profile to STUDY's measured records")] = None,
        db: Annotated[str | None, typer.Option(help="store URL (default: RLSCALE_DB or ./rlscale.db)")] = None,
    ) -> None:
        """Plan an IsoCompute grid over prompts per batch x rollouts at one compute level (GPU-hours)."""
        if calibrate is not None:
            if study is not None or budget is not None:
                raise UserError(
                    "--calibrate takes a study name only; drop the study file and --budget", field="--calibrate"
                )
            _calibrate(calibrate, db=db, as_json=as_json)
            return
        if study is not None:
            grid_options = {"--budget": budget, "--prompts": prompts, "--rollouts": rollouts, "--max-batch": max_batch}
            given = [name for name, value in grid_options.items() if value is not None]
            if given or per_run or min_steps != 1:
                raise UserError(
                    "set the compute and axes in the study file (compute:, parameters:, max_batch:)",
                    field=(given or ["--per-run/--min-steps"])[0],
                )
            _plan_study(study, profile=profile, as_json=as_json, save=save, db=db)
            return
        _plan_grid(
            budget,
            per_run=per_run,
            prompts=prompts,
            rollouts=rollouts,
            max_batch=max_batch,
            min_steps=min_steps,
            profile=profile,
            as_json=as_json,
            save=save,
            db=db,
        )


def _plan_grid(budget, *, per_run, prompts, rollouts, max_batch, min_steps, profile, as_json, save, db) -> None:
    from rlscale.planner.cost import DEFAULT_PROFILE
    from rlscale.planner.grid import DEFAULT_PROMPTS, DEFAULT_ROLLOUTS, isocompute_plan, parse_axis
    from rlscale.planner.profiles import load_profile

    if budget is None:
        raise UserError("required: the sweep's GPU-hours (e.g. --budget 16000), or a study file", field="--budget")
    plan = isocompute_plan(
        budget,
        parse_axis(prompts, option="--prompts") if prompts is not None else DEFAULT_PROMPTS,
        parse_axis(rollouts, option="--rollouts") if rollouts is not None else DEFAULT_ROLLOUTS,
        profile=load_profile(profile or DEFAULT_PROFILE),
        max_batch=max_batch,
        per_run=per_run,
        min_steps=min_steps,
    )
    payload = plan.to_json()
    if _save_and_print_json(payload, save, db, as_json):
        return
    rows = (
        (
            str(p.prompts_per_batch),
            str(p.rollouts),
            str(p.prompts_per_batch * p.rollouts),
            str(p.steps),
            f"{_fmt(p.gpu_hours)}",
            f"{p.total_rollouts:,}",
        )
        for p in plan.points
    )
    console.print(
        table(
            f"IsoCompute plan: {len(plan.points)} runs at {_fmt(plan.per_run_gpu_hours)} GPU-hours each "
            f"(profile {plan.profile})",
            ("B_p", "n", "B_p x n", "steps", "GPU-hours", "total rollouts"),
            rows,
            right=True,
            title_justify="center",
        )
    )
    console.print(f"total {_fmt(plan.total_gpu_hours)} of {_fmt(plan.budget_gpu_hours)} GPU-hours")
    _print_dropped([(f"B_p={d.prompts_per_batch}, n={d.rollouts}", d.reason) for d in plan.dropped])
    if save is not None:
        console.print(f"saved plan {save!r}")


def _plan_study(path: str, *, profile, as_json, save, db) -> None:
    from rlscale.planner.planning import plan_study
    from rlscale.planner.study_file import load_study

    study = load_study(path)
    plan = plan_study(study, profile=profile)
    payload = {
        "study": study.name,
        "method": study.method,
        "profile": plan.profile.name,
        "unit": plan.unit,
        "per_run_budget": plan.per_run_budget,
        "gpu_hours": plan.gpu_hours,
        "runs": [
            {
                "name": r.name,
                "seed": r.seed,
                "prompts_per_batch": r.recipe.prompts_per_batch,
                "rollouts": r.recipe.rollouts,
                "steps": r.recipe.steps,
                "gpu_hours": r.gpu_hours,
                "total_rollouts": r.recipe.total_batch * r.recipe.steps,
            }
            for r in plan.runs
        ],
        "dropped": [{"name": name, "reason": reason} for name, reason in plan.dropped],
    }
    if study.method == "bayes":
        payload["n_trials"] = study.n_trials
        payload["parameters"] = {k: v.model_dump(exclude_none=True) for k, v in study.parameters.items()}
    if _save_and_print_json(payload, save, db, as_json):
        return
    if study.method == "bayes":
        each = "" if study.compute is None else f", {_fmt(study.compute.budget)} {study.compute.unit} each"
        console.print(f"study {safe(study.name)} (bayes): {study.n_trials} trials sampled by Optuna{each}")
        for key, axis in study.parameters.items():
            say(f"{key}: {axis.model_dump(exclude_none=True)}", first="  ", rest="    ")
        if save is not None:
            console.print(f"saved plan {save!r}")
        return
    budget = "" if plan.per_run_budget is None else f", {_fmt(plan.per_run_budget)} {plan.unit} per run"
    numbers = ("seed", "B_p", "n", "steps", "GPU-hours", "total rollouts")
    rows = (
        (
            safe(r.name),
            str(r.seed),
            str(r.recipe.prompts_per_batch),
            str(r.recipe.rollouts),
            str(r.recipe.steps),
            f"{_fmt(r.gpu_hours)}",
            f"{r.recipe.total_batch * r.recipe.steps:,}",
        )
        for r in plan.runs
    )
    # numbers stay whole; a long run name folds onto a second line
    console.print(
        table(
            f"study {safe(study.name)} ({study.method}): {len(plan.runs)} runs{budget}, "
            f"profile {safe(plan.profile.name)}",
            ("run", *numbers),
            rows,
            right=numbers,
            wrap=("run",),
            fold=True,
            title_justify="center",
        )
    )
    console.print(f"total {_fmt(plan.gpu_hours)} GPU-hours (estimated)")
    _print_dropped(plan.dropped)
    if save is not None:
        console.print(f"saved plan {save!r}")


def _print_dropped(dropped: list[tuple[str, str]]) -> None:
    # combinations above the max batch are outside the grid by design: one line, not a row each
    over = [name for name, reason in dropped if "exceeds" in reason and "max" in reason]
    if over:
        console.print(f"{len(over)} combination(s) above the max batch left out (B_p * n too large); see --json")
    dropped = [(name, reason) for name, reason in dropped if name not in over]
    if not dropped:
        return
    rows = ((safe(name), safe(reason)) for name, reason in dropped)
    console.print(table(f"dropped ({len(dropped)})", ("point", "reason"), rows, fold=("point",), title_style="yellow"))


def _save_and_print_json(payload: dict, save: str | None, db: str | None, as_json: bool) -> bool:
    """Store the plan under `save` (if given), print it as JSON with --json; True when printed."""
    if save is not None:
        from rlscale.db.engine import lasting_url
        from rlscale.db.store import Store

        check_name(save, field="--save", what="plan name")
        payload["saved_as"] = save
        with Store(lasting_url(db)) as store:
            store.save_plan(save, payload)
    if as_json:
        print_json(payload)
    return as_json


def _calibration_source(study: str) -> str:
    """Where a profile's costs come from: the study's records, this host and today (records carry no host)."""
    gpus = ""
    try:
        import torch

        if torch.cuda.is_available():
            gpus = f", {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    except ImportError:
        pass
    return (
        f"study {study}'s measured records, calibrated {datetime.date.today().isoformat()} on a host with "
        f"{len(os.sched_getaffinity(0))} cores ({platform.machine()}{gpus})"
    )


def _calibrate(study: str, *, db: str | None, as_json: bool) -> None:
    from rlscale.db.store import Store
    from rlscale.planner.cost import calibrate
    from rlscale.planner.profiles import save_profile

    if study.endswith((".yaml", ".yml")) and Path(study).is_file():
        from rlscale.planner.study_file import load_study

        study = load_study(study).name
    with Store(db, create=False) as store:
        records, runs = store.records_frame(study), store.runs_frame(study)
    fitted, quality = calibrate(records, runs, name=study, calibrated_on=_calibration_source(study))
    path = save_profile(fitted)
    if as_json:
        print_json({"profile": fitted.model_dump(), "quality": quality.model_dump(), "path": str(path)})
        return
    seconds = 3600  # profiles are in GPU-hours; per-step numbers read better in GPU-seconds
    console.print(f"profile [bold]{fitted.name}[/] from {quality.n_runs} runs, {quality.n_intervals} intervals")
    costs = {
        "per rollout": fitted.gpu_hours_per_rollout,
        "per step": fitted.step_overhead_gpu_hours,
        "startup": fitted.startup_gpu_hours,
    }
    for label, hours in costs.items():
        console.print(f"  {label:<15}{hours:.6g} GPU-hours ({hours * seconds:.4g} GPU-s)")
    console.print(f"  R^2 {quality.r2:.4f}, relative residual {quality.relative_residual:.2%}")
    if "poor_fit" in quality.warnings:
        console.print("[yellow]warning:[/] per-step cost is not well explained by B_p x n; check the runs' records")
    if "negative_cost_clipped" in quality.warnings:
        console.print("[yellow]warning:[/] a cost fitted below 0 was set to 0; the runs' records may be too noisy")
    console.print(f"saved to {path}; use it with --profile {fitted.name}")
