"""Rich renderings shared by several commands: the live sweep view and the fits table."""

from rich.live import Live
from rich.table import Table

from rlscale.base.numbers import format_number as _num
from rlscale.cli.console import console, safe
from rlscale.runner.sweep.state import FINISHED

STATUS_STYLE = {"done": "green", "running": "cyan", "failed": "red", "stopped": "yellow", "paused": "magenta", "pending": "dim"}


def sweep_table(study: str, runs) -> Table:
    """One row per run: status, step, last validation reward, device/GPU-hours spent vs planned; a total row."""
    table = Table(title=f"sweep {safe(study)}", title_justify="left")
    width = min(28, max((len(run.name) for run in runs), default=3))
    for column in ("run", "status", "step", "val reward", "gpu-hours", "planned", "note"):
        table.add_column(column, justify="right" if column in ("step", "val reward", "gpu-hours", "planned") else "left",
                         min_width=width if column == "run" else None)
    for run in runs:
        style = STATUS_STYLE.get(run.status, "")
        steps = "-" if run.recipe is None else run.recipe.steps  # an imported run has no recipe
        table.add_row(safe(run.name), f"[{style}]{safe(run.status)}[/]", f"{run.step}/{steps}", _num(run.val_reward),
                      _num(run.gpu_hours, "{:.4f}"), _num(run.planned_gpu_hours, "{:.4f}"), safe(run.note[:60]))
    spent = sum(run.gpu_hours for run in runs)
    planned = sum(run.planned_gpu_hours for run in runs)
    finished = sum(run.status in FINISHED for run in runs)
    table.add_section()
    table.add_row("total", f"{finished}/{len(runs)} finished", "", "", _num(spent, "{:.4f}"), _num(planned, "{:.4f}"), "")
    return table


class SweepView:
    """A live-updating sweep table (rich), refreshed at most a few times a second."""

    def __init__(self, study: str, *, enabled: bool = True):
        self.study = study
        self.enabled = enabled
        self._live = Live(console=console, refresh_per_second=4, transient=False) if enabled else None
        self._runs = []

    def __enter__(self) -> "SweepView":
        if self._live:
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live:
            self._live.update(sweep_table(self.study, self._runs), refresh=True)
            self._live.__exit__(*exc)
            console.line()

    def update(self, runs) -> None:
        """Show the runs' current state."""
        self._runs = runs
        if self._live:
            self._live.update(sweep_table(self.study, runs))


def fits_table(fits, *, title: str = "sigmoid fits") -> Table:
    """A, B, C_mid with the interval on A, R^2 and whether A is identified; the reasons for runs whose
    A is not identified are listed in words under the table."""
    table = Table(title=safe(title), title_justify="left", caption_justify="left")
    width = min(28, max((len(str(run)) for run in fits.get("run", [])), default=3))
    for column in ("run", "A", "A 95% CI", "B", "C_mid", "R0", "R^2", "points", "identified"):
        table.add_column(column, justify="left" if column in ("run", "identified") else "right",
                         min_width=width if column == "run" else None)
    reasons = []
    for row in fits.to_dict("records"):
        if row.get("identified"):
            identified = "yes"
        else:
            reasons.append(f"{row.get('run')}: not identified: {row.get('reason') or '?'}")
            identified = f"[yellow]no ({len(reasons)})[/]"
        table.add_row(
            safe(row.get("run")), _num(row.get("A")), f"[{_num(row.get('A_lo'))}, {_num(row.get('A_hi'))}]",
            _num(row.get("B"), "{:.2f}"), _num(row.get("C_mid"), "{:.4g}"), _num(row.get("R0")),
            _num(row.get("r2")), str(row.get("n_points", "-")), identified,
        )
    if reasons:
        table.caption = "\n".join(f"({i}) {safe(reason)}" for i, reason in enumerate(reasons, 1))
    return table
