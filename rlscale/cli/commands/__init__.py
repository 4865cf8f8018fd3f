"""One module per command. Each defines `register(app: typer.Typer) -> None`.
Modules must import cheaply: torch, Ray and vLLM are imported inside the command body."""
