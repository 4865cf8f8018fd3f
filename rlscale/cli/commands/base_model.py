"""`rlscale base-model`: where the embedded tiny policy is, how it was built; --rebuild checks it."""

import json

import typer

from rlscale.base.errors import UserError
from rlscale.cli.console import console, print_json


def register(app: typer.Typer) -> None:
    @app.command("base-model")
    def base_model(
        rebuild: bool = typer.Option(
            False,
            "--rebuild",
            help=("Build it again (portable numerics, one core: minutes) and check it against the shipped weights."),
        ),
        as_json: bool = typer.Option(False, "--json", help="Print {path, sft_steps, sampled_pass_rate, ...} as JSON."),
    ) -> None:
        """The tiny CPU policy (char-level Llama, SFT on 2-digit addition): its path and initial pass rate."""
        try:
            from rlscale.runner.rl.policy import base_model_dir, same_as_shipped
        except ImportError as err:  # torch / transformers come with the runner extra
            missing = err.name or str(err).splitlines()[0]
            raise UserError(
                f"needs the runner extra: pip install -e '.[runner]' ({missing} is not installed)", field="base-model"
            ) from None

        if not rebuild or as_json:
            path = base_model_dir(rebuild=rebuild)
        else:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            from rlscale.runner.rl.policy import SFT_MAX_STEPS, SFT_TARGET_PASS_RATE

            console.print("building the base policy with portable numerics (one core: minutes)", highlight=False)
            with Progress(
                TextColumn("SFT"),
                BarColumn(),
                TextColumn("step {task.completed:.0f}"),
                TextColumn("{task.fields[rate]}"),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            ) as progress:
                task = progress.add_task("sft", total=SFT_MAX_STEPS, rate="")
                path = base_model_dir(
                    rebuild=True,
                    log=lambda step, loss, rate: progress.update(
                        task, completed=step, rate=f"pass rate {rate:.3f} (stops at {SFT_TARGET_PASS_RATE})"
                    ),
                )
        info = json.loads((path / "rlscale_base_model.json").read_text())
        same = same_as_shipped(path) if rebuild else None
        if as_json:
            print_json({"path": str(path), **info, "same_as_shipped": same})
            return
        console.print(f"{path}", highlight=False, soft_wrap=True)
        console.print(
            f"initial sampled pass rate {info['sampled_pass_rate']:.3f} after {info['sft_steps']} SFT steps",
            highlight=False,
        )
        console.print(
            f"built with {'portable numerics' if info.get('portable') else 'the CPU kernels of its host'} "
            f"(torch {info['torch']}, kernels {info['torch_cpu_capability']})",
            highlight=False,
        )
        if same is not None:
            console.print(
                "bit-identical to the shipped weights"
                if same
                else "differs from the shipped weights (runs use the shipped ones)",
                highlight=False,
            )
