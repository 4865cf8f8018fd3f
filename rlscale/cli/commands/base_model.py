"""`rlscale base-model`: build (or rebuild) the embedded tiny policy and print where it is."""

import typer

from rlscale.cli.console import console, print_json


def register(app: typer.Typer) -> None:
    @app.command("base-model")
    def base_model(
        rebuild: bool = typer.Option(False, "--rebuild", help="Build again even if cached."),
        as_json: bool = typer.Option(False, "--json", help="Print {path, sft_steps, sampled_pass_rate} as JSON."),
    ) -> None:
        """Build the tiny CPU policy (char-level Llama, SFT on 2-digit addition) and print its path and initial pass rate."""
        import json

        from rlscale.base.errors import UserError

        try:
            from rlscale.runner.rl.policy import base_model_dir
        except ImportError as err:  # torch / transformers come with the runner extra
            missing = err.name or str(err).splitlines()[0]
            raise UserError(f"needs the runner extra: pip install -e '.[runner]' ({missing} is not installed)",
                            field="base-model") from None

        def log(step: int, loss: float, pass_rate: float) -> None:
            console.print(f"SFT step {step:5d}  loss {loss:.3f}  sampled pass rate {pass_rate:.3f}", highlight=False)

        path = base_model_dir(rebuild=rebuild, log=None if as_json else log)
        info = json.loads((path / "rlscale_base_model.json").read_text())
        if as_json:
            print_json({"path": str(path), **info})
            return
        console.print(f"{path}", highlight=False, soft_wrap=True)
        console.print(
            f"initial sampled pass rate {info['sampled_pass_rate']:.3f} (temperature {info['temperature']}, "
            f"{info['eval_prompts']} validation prompts) after {info['sft_steps']} SFT steps"
            + (f" (torch kernels: {info['torch_cpu_capability']})" if "torch_cpu_capability" in info else ""),
            highlight=False,
        )
