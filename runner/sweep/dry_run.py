"""`rlscale sweep STUDY --dry-run`: what each planned point would run, without submitting or storing anything."""

import os

from rlscale.planner.planning import extended, planned_runs
from rlscale.runner.engine import study_engine
from rlscale.runner.sweep.state import run_name

# the store names a run's checkpoints and jobs when the sweep first registers it (SweepDriver.run_key)
RUN_KEY = "RUN_KEY"


def dry_run(study, *, ray_address: str | None = None, shared_dir: str | None = None) -> list[dict]:
    """A dict per planned run: run, seed, engine, then its engine's first job (run key RUN_KEY) or builtin recipe."""
    several_seeds = len(study.seeds) > 1
    out, engines = [], {}
    points = planned_runs(study)
    recipes = [extended(point.recipe, study.extend) for point in points]  # what the jobs train: --extend grows steps
    for point, recipe in zip(points, recipes):
        entry = {"run": run_name(point, several_seeds), "seed": point.seed, "engine": recipe.engine}
        if recipe.engine in ("verl", "trl"):
            engine = engines.get(recipe.engine) or engines.setdefault(
                recipe.engine,
                study_engine(
                    study, recipe.engine, ray_address=ray_address, **({"shared_dir": shared_dir} if shared_dir else {})
                ),
            )
            # a run that ends at its measured GPU-hours may pass its planned steps (up to the cap)
            stops_at_compute = study.compute is not None and study.compute.unit == "gpu_hours"
            entry.update(engine.dry_run(recipe, RUN_KEY, gpu_hours=point.gpu_hours if stops_at_compute else None))
        else:
            entry["recipe"] = recipe.to_json()
        out.append(entry)
    for name, engine in engines.items():  # the framework's own code reads every job: all problems at once
        engine.rehearse([entry for entry in out if entry["engine"] == name], study_file=study.file)
    builtin = [(entry, recipe) for entry, recipe in zip(out, recipes) if recipe.engine == "builtin"]
    if builtin:
        from rlscale.runner.builtin.rehearsal import rehearse

        notes = rehearse([recipe for _, recipe in builtin], study_file=study.file, remote=ray_address is not None)
        for (entry, _), mine in zip(builtin, notes):
            entry["notes"] = mine
    return out


def admission_plan(
    study, *, ray_address: str | None = None, shared_dir: str | None = None, max_concurrent: int | None = None
) -> dict:
    """How the sweep would admit the study's runs on the cluster now: each run's devices, the first wave, the bound on
    runs in flight; `nodes` is None when the cluster cannot be read (admission is then decided at run time)."""

    from rlscale.runner.sweep.admission import first_wave

    several_seeds = len(study.seeds) > 1
    jobs, nodes = [], None
    for point in planned_runs(study):
        recipe = point.recipe
        if recipe.engine == "builtin":  # GPUs on a cluster, CPU cores of this host for a local sweep
            devices = [{"GPU" if ray_address else "CPU": float(recipe.generator_devices + recipe.trainer_devices)}]
            if ray_address is None:
                from rlscale.runner.ray_head import local_cpus

                nodes = [{"CPU": float(local_cpus())}]
        else:
            engine = study_engine(
                study, recipe.engine, ray_address=ray_address, **({"shared_dir": shared_dir} if shared_dir else {})
            )
            devices = engine.devices(recipe)
            if nodes is None and ray_address is not None:
                try:
                    found = engine.nodes()
                except Exception:  # no cluster to read: admission is decided at run time
                    found = None
                nodes = [node.free or node.total for node in found] if found else None
        jobs.append((run_name(point, several_seeds), devices))
    limit = max_concurrent or study.max_concurrent
    wave = first_wave(jobs, nodes, limit) if nodes else []
    return {
        "devices": {name: devices for name, devices in jobs},
        "nodes": nodes,
        "first": wave,
        "max_concurrent": limit,
    }


def check_cluster(study, *, ray_address: str | None = None) -> None:
    """UserError (why, what to set) if the sweep's named cluster is unreachable; before anything is stored."""
    engines = {point.recipe.engine for point in planned_runs(study)}
    address = ray_address or os.environ.get("RAY_ADDRESS")
    if not address:
        return
    from rlscale.runner.ray_head import check_driver_address, jobs_client

    if engines & {"verl", "trl"}:
        jobs_client(ray_address)
    if "builtin" in engines:
        check_driver_address(address, field="--ray-address" if ray_address else "RAY_ADDRESS")
