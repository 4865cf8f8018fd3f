"""`rlscale export --format verl|trl|openrlhf|yaml`: a study's recommended (or best) recipe, or a recipe file, as a
production config; `--gpus/--nodes` lay the job out (deployment choices, marked apart from the recipe)."""

import shlex
from importlib.machinery import PathFinder
from pathlib import Path

import typer

from rlscale.base.errors import UserError
from rlscale.base.names import check_budget, check_steps
from rlscale.cli.console import say
from rlscale.cli.options import DbUrl, check_out_dir


def register(app: typer.Typer) -> None:
    @app.command("export")
    def export(
        fmt: str = typer.Option(
            ...,
            "--format",
            help=(
                "verl 0.9.1 (Hydra overrides), trl 1.16.0 (GRPOConfig YAML), openrlhf 0.11.2 (command line) or yaml "
                "(rlscale recipe)"
            ),
        ),
        study: str = typer.Option(
            None,
            "--study",
            help="export from this study: the recommendation (with --budget, "
            "for a study that varies rollouts), else its best run",
        ),
        budget: float = typer.Option(
            None, "--budget", help=("target compute: recommend for it, or pick the run predicted best at it")
        ),
        recipe: Path = typer.Option(None, "--recipe", help="export this recipe file instead"),
        db: DbUrl = None,
        profile: str = typer.Option(None, "--profile", help="cost profile for steps (see `rlscale recommend`)"),
        gpus: int = typer.Option(8, "--gpus", help="deployment: GPUs per node"),
        nodes: int = typer.Option(1, "--nodes", help="deployment: nodes"),
        tp: int = typer.Option(1, "--tp", help="deployment: the generator's tensor-parallel size"),
        prompt_tokens: int = typer.Option(
            1024, "--prompt-tokens", help=("deployment: the longest prompt in the data (tokens)")
        ),
        out: Path = typer.Option(None, "--out", help="write here instead of stdout"),
    ) -> None:
        """Write a production config (verl, TRL, OpenRLHF or rlscale's own YAML) naming its target version.

        What the target cannot express is listed in a `# not expressible:` block, and keys that are only the
        nearest form say how they differ.

        --study with --budget, for a study that varies rollouts: the study's recipe with the recommended B_p, n
        and M (exit 2 with the reason if `rlscale recommend` would refuse). Any other study, or no --budget: the
        recipe of its best run (by predicted reward at --budget, else by fitted asymptote), naming the run.
        """
        from rlscale.planner.frameworks import FORMATS, Deployment, export_config

        if fmt not in FORMATS:
            raise UserError(f"expected one of {', '.join(FORMATS)}, got {fmt!r}", field="--format")
        for flag, value in (("--gpus", gpus), ("--nodes", nodes), ("--tp", tp), ("--prompt-tokens", prompt_tokens)):
            if value < 1:
                raise UserError(f"expected a positive integer, got {value}", field=flag)
        if gpus % tp:
            raise UserError(f"--tp {tp} must divide --gpus {gpus}", field="--tp")
        deployment = Deployment(gpus_per_node=gpus, nodes=nodes, tensor_parallel=tp, max_prompt_tokens=prompt_tokens)
        if recipe is not None and (study is not None or budget is not None or profile is not None):
            raise UserError(
                "--recipe exports that file as written: leave out --study, --budget and --profile", field="--recipe"
            )
        if recipe is None and study is None and budget is None:
            raise UserError("give either --recipe FILE or --study S (and/or --budget B)", field="export")
        if budget is not None:
            check_budget(budget)
        if out is not None:
            check_out_dir(out.parent, out.name)
        if recipe is not None:
            from rlscale.planner.loading import load_recipe

            chosen, header = load_recipe(recipe), [f"rlscale export of {recipe}"]
        else:
            from rlscale.db.store import Store
            from rlscale.fitting.stored import pick_study, study_decision
            from rlscale.planner.recipe import Recipe
            from rlscale.views.wording import db_flag, export_header, extension_command, refusal_with_next

            store = Store(db, create=False)
            name = pick_study(store, study)
            decision = study_decision(store, name, budget=budget, profile=profile)
            if decision is None:
                raise UserError(f"study {name!r} has no evaluated records yet", field="--study")
            if not decision.exportable:
                why = (
                    refusal_with_next(decision.refusal, extension_command(decision, db))
                    if decision.refusal
                    else "no run has a fit yet, so nothing is decided; why, run by run: "
                    f"rlscale fit --study {shlex.quote(name)}{db_flag(db)}"
                )
                raise UserError(why, field=f"study {name}")
            chosen = Recipe.model_validate(decision.recipe)
            check_steps(chosen.steps)
            header = export_header(decision)
        text = _user_setup_text(store, name, chosen, fmt, header) if recipe is None else None
        text = text or export_config(chosen, fmt, header=header, deployment=deployment)
        if out is None:
            typer.echo(text, nl=False)
            return
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text, encoding="utf-8")
        except OSError as err:  # a file where a directory should be, a full disk, no permission
            raise UserError(f"cannot write {out}: {err.strerror or err}", field="--out") from None
        say(f"wrote {fmt} config to {out}")


def _user_setup_text(store, study: str, recipe, fmt: str, header: list[str]) -> str | None:
    """A study that started from the user's own verl or TRL setup, exported to that framework: the user's config with
    the decision applied (planner/frameworks/setup.py); None for any other study or format."""
    from rlscale.planner.frameworks.setup import export_setup, setup_plan
    from rlscale.planner.study_file import stored_study

    typed = stored_study(store, study)
    if typed is None or typed.setup is None or typed.recipe.engine != fmt:
        return None
    plan = setup_plan(typed)
    if fmt != "trl":
        return export_setup(plan, recipe, header)
    from rlscale.runner.trl.setup import import_paths, local_paths

    file = plan.setup.config_file
    funcs = plan.setup.keys.get("reward_funcs") or []
    modules = sorted({name.rsplit(".", 1)[0] for name in ([funcs] if isinstance(funcs, str) else funcs) if "." in name})
    if modules:  # `trl grpo` imports them from where it runs; the sweep's jobs found them in these folders
        folders = import_paths(file, typed.launch_dir)
        found = [folder for folder in folders if any(_module_in(folder, name) for name in modules)]
        if found:  # none found: an installed package, imported as it is
            header = [
                *header,
                f"reward modules {', '.join(modules)}: run with PYTHONPATH={shlex.quote(':'.join(found))}",
            ]
    return export_setup(plan, recipe, header, paths=local_paths(plan.setup.keys, file, typed.launch_dir))


def _module_in(folder: str, module: str) -> bool:
    """Whether Python would import `module`'s top package from `folder` (a module, package or namespace package)."""
    return PathFinder.find_spec(module.split(".")[0], [folder]) is not None
