"""`rlscale sweep STUDY --dry-run`: what each planned point would run, without submitting or storing anything."""

from rlscale.planner.study import planned_runs
from rlscale.runner.sweep.state import run_name

# the store names a run's checkpoints and jobs when the sweep first registers it (SweepDriver.run_key)
RUN_KEY = "RUN_KEY"


def dry_run(study, *, ray_address: str | None = None, shared_dir: str | None = None) -> list[dict]:
    """One dict per planned run: run, seed, engine; for verl the first job's entrypoint, Hydra overrides, data, log
    and checkpoint paths (RUN_KEY standing for the run key), GPUs and cluster address; for builtin the recipe."""
    several_seeds = len(study.seeds) > 1
    out = []
    for point in planned_runs(study):
        recipe = point.recipe
        entry = {"run": run_name(point, several_seeds), "seed": point.seed, "engine": recipe.engine}
        if recipe.engine == "verl":
            from rlscale.runner.verl.engine import VerlEngine

            engine = VerlEngine(ray_address=ray_address, shared_dir=shared_dir)
            job = engine.job(recipe, RUN_KEY, 1, until_step=recipe.steps)
            entry.update({"ray_address": ray_address or "RAY_ADDRESS", "submission_id": job.submission_id,
                          "entrypoint": f"{engine.python} -m {engine.module}", "overrides": job.overrides,
                          "env_vars": job.env_vars, "train_file": str(job.train_file), "val_file": str(job.val_file),
                          "log_file": str(job.log_file), "gpus": job.gpus})
        else:
            entry["recipe"] = recipe.to_json()
        out.append(entry)
    return out
