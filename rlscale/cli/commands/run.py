"""`rlscale run RECIPE.yaml`: one RL job from a recipe file, on Ray (vLLM generator + torch trainer) into the
store, resumable; `--local` runs it in one process (torch sampling) and prints (step, compute, val_reward) rows."""

import time
from pathlib import Path

import typer

from rlscale.base.errors import UserError
from rlscale.base.numbers import format_number
from rlscale.cli.console import console, print_json, safe, table
from rlscale.cli.options import DbUrl

RECORD_COLUMNS = ("step", "gpu_hours", "rollouts", "tokens", "val_reward", "train_reward")
RECORD_FORMATS = {"gpu_hours": "{:.4g}", "val_reward": "{:.3f}", "train_reward": "{:.3f}"}  # others: integers


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run(
        recipe_file: Path = typer.Argument(..., help="Recipe YAML (recipe keys, or a study file's `recipe:` block)."),
        local: bool = typer.Option(
            False, "--local", help="Single process on this machine: torch sampling, no Ray/vLLM."
        ),
        steps: int | None = typer.Option(None, "--steps", min=1, help="Override the recipe's steps."),
        threads: int = typer.Option(
            1, "--threads", min=1, help="--local: torch CPU threads (results are reproducible per thread count)."
        ),
        device: str = typer.Option(
            None, "--device", help="--local: cpu or cuda (default: cuda when torch sees a GPU)."
        ),
        as_json: bool = typer.Option(False, "--json", help="Print {recipe, records, ...} as JSON instead of tables."),
        study: str = typer.Option("runs", "--study", help="Ray runner: the study the run is stored in."),
        db: DbUrl = None,
        ray_address: str = typer.Option(
            None, "--ray-address", help="Ray runner: join an existing cluster (default: start a local one)."
        ),
    ) -> None:
        """Run one RL job; every eval_every steps record (step, device-hours, rollouts, tokens, validation pass
        rate)."""
        from rlscale.planner.loading import load_recipe

        recipe = load_recipe(recipe_file)
        if steps is not None:
            recipe = recipe.model_validate({**recipe.to_json(), "steps": steps})
        if not local:
            records, seconds = _run_on_ray(recipe, recipe_file.stem, study, db, ray_address, quiet=as_json)
            if as_json:
                print_json(
                    {
                        "recipe": recipe.to_json(),
                        "runner": "ray",
                        "study": study,
                        "wall_seconds": seconds,
                        "records": records,
                    }
                )
            else:
                _print_summary(
                    records, seconds, title="validation pass rate vs compute (Ray: vLLM generator + torch trainer)"
                )
            return
        device = _local_device(device)
        records, seconds = _run_local(recipe, steps, threads, device, quiet=as_json)
        if as_json:
            print_json({"recipe": recipe.to_json(), "runner": "local", "wall_seconds": seconds, "records": records})
        else:
            _print_summary(
                records, seconds, title=f"validation pass rate vs compute (local runner, 1 {device.upper()} device)"
            )


def _local_device(device: str | None) -> str:
    import torch

    from rlscale.runner.builtin.local import default_device

    if device is None:
        return default_device()
    if device not in ("cpu", "cuda"):
        raise UserError(f"expected cpu or cuda, got {device!r}", field="--device")
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("cuda requested but torch sees no GPU (use --device cpu)", field="--device")
    return device


def _run_local(recipe, steps, threads, device, *, quiet: bool):
    from rich.progress import Progress, TextColumn, TimeElapsedColumn

    from rlscale.runner.builtin.local import run_local

    total = steps or recipe.steps
    started = time.perf_counter()
    if quiet:
        return run_local(recipe, steps=total, threads=threads, device=device), time.perf_counter() - started
    with Progress(TextColumn("{task.description}"), TimeElapsedColumn(), console=console, transient=True) as progress:
        line = progress.add_task("starting (loading the policy)", total=total)
        state = {"val": float("nan")}

        def on_step(step: int, metrics: dict) -> None:
            progress.update(
                line,
                completed=step,
                description=(
                    f"step {step}/{total}  train reward {metrics['train_reward']:.3f}  "
                    f"val pass rate {state['val']:.3f}  "
                    f"train {metrics['elapsed']:.0f}s"
                ),
            )

        def on_record(row: dict) -> None:
            state["val"] = row["val_reward"]
            progress.console.print(
                f"step {row['step']:5d}  device-hours {row['gpu_hours']:.5f}  rollouts {row['rollouts']:7d}  "
                f"val_reward {row['val_reward']:.3f}",
                highlight=False,
            )

        records = run_local(recipe, steps=total, threads=threads, device=device, on_step=on_step, on_record=on_record)
    return records, time.perf_counter() - started


def _run_on_ray(recipe, name: str, study_name: str, db: str | None, ray_address: str | None, *, quiet: bool):
    """The job as a one-run study through the sweep driver (store, resume, retries); its evaluated records."""
    from rlscale.cli.views import SweepView
    from rlscale.db.store import Store
    from rlscale.planner.study import Study
    from rlscale.runner.sweep.driver import SweepDriver
    from rlscale.runner.sweep.dry_run import check_cluster

    # a one-point grid (the recipe's own loss), so `status` and `report` see it like any study
    study = Study.model_validate(
        {
            "name": study_name,
            "method": "grid",
            "recipe": recipe.to_json(),
            "seeds": [recipe.seed],
            "parameters": {"loss": {"values": [recipe.loss]}},
        }
    )
    check_cluster(study, ray_address=ray_address)  # a named cluster that cannot be reached: exit 2, nothing stored
    store = Store(db)
    started = time.perf_counter()
    view = SweepView(study_name, enabled=not quiet)
    driver = SweepDriver(study, store, ray_address=ray_address, on_update=view.update)
    if study_name not in store.study_names():  # a study of ad-hoc runs keeps the spec it was created with
        store.upsert_study(study_name, study.to_spec())
    run = driver.add_run(name, recipe, recipe.seed, float("nan"))
    with view:
        summary = driver.run()
    if summary.count("failed"):
        console.print(f"[red]the job failed after {run.attempts} attempt(s):[/] {safe(run.note)}", highlight=False)
        raise typer.Exit(1)
    records = store.records_frame(study_name)
    mine = records[(records["run_id"] == run.run_id) & records["val_reward"].notna()]
    columns = [c for c in RECORD_COLUMNS if c in mine.columns]
    return mine[columns].to_dict("records"), time.perf_counter() - started


def _print_summary(
    records: list[dict], seconds: float, *, title: str = "validation pass rate vs compute (local runner, 1 CPU device)"
) -> None:
    rows = (
        (format_number(row.get(column), RECORD_FORMATS.get(column, "{}")) for column in RECORD_COLUMNS)
        for row in records
    )
    console.print(table(title, RECORD_COLUMNS, rows, right=True, title_justify="center"))
    first, last = records[0]["val_reward"], records[-1]["val_reward"]
    console.print(
        f"val_reward {first:.3f} -> {last:.3f} ({last - first:+.3f}) in {seconds:.0f} s wall", highlight=False
    )
