"""`rlscale export --format verl|trl|openrlhf|yaml`: the recommended (or a given) recipe as a production config."""

from pathlib import Path

import typer

from rlscale.cli.options import DbUrl


def register(app: typer.Typer) -> None:
    @app.command("export")
    def export(
        fmt: str = typer.Option(..., "--format", help="verl (Hydra YAML), trl (GRPOConfig YAML), openrlhf (command line) or yaml (rlscale recipe)"),
        study: str = typer.Option(None, "--study", help="export the recommendation learned from this study"),
        budget: float = typer.Option(None, "--budget", help="target compute for the recommendation (with --study)"),
        recipe: Path = typer.Option(None, "--recipe", help="export this recipe file instead of a recommendation"),
        db: DbUrl = None,
        profile: str = typer.Option(None, "--profile", help="cost profile for steps (see `rlscale recommend`)"),
        out: Path = typer.Option(None, "--out", help="write here instead of stdout"),
    ) -> None:
        """Write a production config; what the target cannot express is listed in a `# not expressible:` block.

        With --study and --budget the recipe is the study's base recipe with the recommended B_p, n and M
        (exit 2 with the reason if `rlscale recommend` would refuse); with --recipe it is that file.
        """
        from rlscale.fitting.export import FORMATS, export_config
        from rlscale.cli.console import console
        from rlscale.base.errors import UserError

        if fmt not in FORMATS:
            raise UserError(f"expected one of {', '.join(FORMATS)}, got {fmt!r}", field="--format")
        if (recipe is None) == (study is None and budget is None):
            raise UserError("give either --recipe FILE or --budget B (with --study S when the store has several studies)",
                            field="export")
        if recipe is not None:
            from rlscale.planner.loading import load_recipe

            chosen, header = load_recipe(recipe), [f"rlscale export of {recipe}"]
        else:
            if budget is None or not budget > 0:
                raise UserError("expected a positive --budget for the recommendation", field="--budget")
            from rlscale.db.store import Store
            from rlscale.fitting.recommend import Refusal, pick_study, recommend_study, recommended_recipe

            store = Store(db, create=False)
            name = pick_study(store, study)
            try:
                rec, stored = recommend_study(store, name, budget, profile=profile)
            except Refusal as refusal:
                raise UserError(str(refusal), field=f"study {name}") from None
            chosen = recommended_recipe(stored, rec)
            lo, hi = rec.predicted_interval
            header = [f"rlscale export: recommendation from study {name} for a budget of {budget:g}",
                      f"B_p {rec.prompts_per_batch}, n {rec.rollouts} (law n* {rec.n_star:.0f}), M {rec.steps} steps; "
                      f"predicted reward {rec.predicted_reward:.3f} [{lo:.3f}, {hi:.3f}] from run {rec.predicted_from}"]
        text = export_config(chosen, fmt, header=header)
        if out is None:
            typer.echo(text, nl=False)
            return
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        console.print(f"wrote {fmt} config to {out}", highlight=False, soft_wrap=True)
