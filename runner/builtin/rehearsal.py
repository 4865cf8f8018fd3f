"""The built-in engine's dry-run: each job's model, task and verifier, loaded here as the job will load them."""

from pathlib import Path

from rlscale.planner.recipe import TINY
from rlscale.runner.rl.tasks import load_verifier, make_task

from rlscale.base.errors import UserError


def rehearse(recipes: list, *, study_file: str | None, remote: bool) -> list[list[str]]:
    """Each recipe's notes, after loading its model config, task and verifier (once per distinct three); UserError
    naming the study file and the recipe key. On a cluster (`remote`), what this machine cannot see gets a note."""
    loaded: dict[tuple, list[str]] = {}
    for recipe in recipes:
        key = (recipe.model, recipe.task, recipe.verifier)
        if key not in loaded:
            loaded[key] = _load(recipe, study_file, remote)
    return [loaded[recipe.model, recipe.task, recipe.verifier] for recipe in recipes]


def _load(recipe, study_file: str | None, remote: bool) -> list[str]:
    notes = []
    task_file = recipe.task.endswith(".jsonl")
    unseen = [
        (field, value)
        for field, value, is_path in (("model", recipe.model, recipe.model != TINY), ("task", recipe.task, task_file))
        if is_path and remote and not Path(value).parent.is_dir()
    ]
    notes += [f"{field}: {value}: not on this machine (a cluster path?), not checked here" for field, value in unseen]
    unseen_fields = {field for field, _ in unseen}
    try:
        if recipe.model != TINY and "model" not in unseen_fields:
            from rlscale.runner.builtin.local import resolve_model_dir  # torch: only for a model of the user's

            resolve_model_dir(recipe)
        if task_file and "task" not in unseen_fields and not Path(recipe.task).is_file():
            where = (
                ""
                if Path(recipe.task).is_absolute()
                else f" (a relative path is read from where rlscale runs: {Path.cwd()})"
            )
            raise UserError(f"file not found: {recipe.task}{where}", field="task")
        if "task" not in unseen_fields:
            make_task(recipe)  # a task file's bad line is named in that file
        elif recipe.verifier:
            load_verifier(recipe.verifier)
    except UserError as err:
        if err.file is not None:
            raise
        if remote and err.field == "verifier":  # the job imports it in the cluster's environment
            return [*notes, f"verifier: {err.detail}; not importable here, the job must import it"]
        value = getattr(recipe, err.field, None) if err.field in ("model", "verifier") else None
        detail = f"{value}: {err.detail}" if value and str(value) not in err.detail else err.detail
        raise UserError(detail, file=study_file, field=f"recipe.{err.field}") from None
    return notes
