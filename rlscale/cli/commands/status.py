"""`rlscale status STUDY`: a study's runs and their progress, read from the store (safe while a sweep writes)."""

import typer


def register(app: typer.Typer) -> None:
    @app.command("status")
    def status(
        study: str = typer.Argument(..., help="study name"),
        db: str = typer.Option(None, "--db", help="SQLAlchemy URL (default: RLSCALE_DB or sqlite:///rlscale.db)"),
        json_out: bool = typer.Option(False, "--json", help="print the runs as JSON"),
    ) -> None:
        """Show each run's status, step, last validation reward and compute spent."""
        from rlscale.db.store import Store
        from rlscale.cli.console import console, print_json
        from rlscale.cli.views import sweep_table
        from rlscale.runner.sweep.driver import RunState

        store = Store(db, create=False)
        runs = store.runs_frame(study)
        records = store.records_frame(study)
        planned = _planned_gpu_hours(store.study_spec(study))
        states = []
        for row in runs.to_dict("records"):
            state = RunState(row["run_id"], row["run"], _recipe(row["config"]), row["seed"],
                             planned.get(row["run"], float("nan")), status=row["status"],
                             note=(row["error"] or "").splitlines()[0] if row["error"] else "")
            mine = records[records["run_id"] == row["run_id"]]
            if len(mine):
                state.step = int(mine["step"].max())
                state.gpu_hours = float(mine["gpu_hours"].max())
                evals = mine["val_reward"].dropna()
                state.val_reward = float(evals.iloc[-1]) if len(evals) else None
            states.append(state)
        if json_out:
            print_json([
                {"run_id": s.run_id, "run": s.name, "seed": s.seed, "status": s.status, "step": s.step,
                 "steps": None if s.recipe is None else s.recipe.steps, "val_reward": s.val_reward, "gpu_hours": s.gpu_hours,
                 "planned_gpu_hours": s.planned_gpu_hours, "note": s.note}
                for s in states
            ])
            return
        console.print(sweep_table(study, states))


def _recipe(config: dict):
    """The run's recipe; None for an imported run (its config names the source, not a recipe)."""
    from pydantic import ValidationError

    from rlscale.planner.recipe import Recipe

    try:
        return Recipe.model_validate(config)
    except ValidationError:
        return None


def _planned_gpu_hours(spec: dict) -> dict:
    """Run name -> planned GPU-hours, re-planned from the stored study spec (empty if it has none)."""
    if not spec:
        return {}
    from rlscale.planner.study import Study, planned_runs
    from rlscale.runner.sweep.driver import run_name

    try:
        study = Study.model_validate(spec)
    except Exception:  # a spec saved by an older rlscale: show the runs without their plan
        return {}
    return {run_name(point, len(study.seeds) > 1): point.gpu_hours for point in planned_runs(study)}
