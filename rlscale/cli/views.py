"""Rich renderings shared by several commands: the live sweep view and the fits table."""

import re

from rich.live import Live
from rich.table import Table

from rlscale.base.numbers import format_number as _num
from rlscale.cli.console import console, safe, say, table
from rlscale.runner.sweep.state import FINISHED

STATUS_STYLE = {
    "done": "green",
    "running": "cyan",
    "starting": "cyan",
    "failed": "red",
    "stopped": "yellow",
    "paused": "magenta",
    "pending": "dim",
    "queued": "dim",
}
IN_FLIGHT = ("starting", "running")
SWEEP_LEGEND = (
    "step: steps taken; hours / plan: device-hours (GPU-hours on GPUs) spent of those planned, "
    "where the run stops; %: share of its plan"
)


def compute_progress(spent: float, planned: float) -> tuple[str, str]:
    """("spent / planned", "share%") of the compute that stops a run; "-" share for a run imported without a plan."""
    known = planned == planned and planned > 0
    hours = f"{_num(spent, '{:.4g}')} / {_num(planned, '{:.4g}')}" if known else _num(spent, "{:.4g}")
    return hours, f"{spent / planned:.0%}" if known else "-"


def sweep_table(study: str, runs, cluster: str = "", unit: str = "gpu_hours") -> Table:
    """One row per run, a total row, then the cluster line and legend; fits 80 columns, long names and notes wrap.
    unit: what the runs' compute counts (an imported log's own axis, which has no plan)."""
    lines = [cluster] if cluster else []
    spent, legend = "hours / plan", SWEEP_LEGEND
    if unit != "gpu_hours":
        from rlscale.fitting.curves import unit_label

        spent, legend = "compute", f"step: steps logged; compute: {unit_label(unit)}, as the imported logs count it"
    sweep = table(
        f"study {safe(study)}",
        ("run", "status", "step", "reward", spent, "%", "note"),
        caption="\n".join(safe(line) for line in [*lines, legend]),
        right=("step", "reward", spent, "%"),
        wrap=("run", "note"),
        fold=True,
    )
    for run in runs:
        style = STATUS_STYLE.get(run.status, "")
        status = f"{run.status} {run.devices}" if run.status in IN_FLIGHT and run.devices else run.status
        sweep.add_row(
            safe(run.name),
            f"[{style}]{safe(status)}[/]",
            f"{run.step:,}",
            _num(run.val_reward),
            *compute_progress(run.gpu_hours, run.planned_gpu_hours),
            safe(run.note[:120]),
        )
    spent = sum(run.gpu_hours for run in runs)
    planned = sum(run.planned_gpu_hours for run in runs if run.planned_gpu_hours == run.planned_gpu_hours)
    finished = sum(run.status in FINISHED for run in runs)
    sweep.add_section()
    sweep.add_row(
        "total", f"{finished}/{len(runs)} ended", "", "", *compute_progress(spent, planned or float("nan")), ""
    )
    return sweep


def failure_lines(runs) -> list[str]:
    """'RUN failed: <why>' per failed run, its note whole: the table's note column has room for only its start."""
    return [f"{run.name} failed: {run.note}" for run in runs if run.status == "failed" and run.note]


def sweep_view(study: str, runs, cluster: str = "", unit: str = "gpu_hours"):
    """The sweep table with, under it, why each failed run failed (failure_lines), wrapped to the terminal."""
    from rich.console import Group
    from rich.text import Text

    lines = failure_lines(runs)
    if not lines:
        return sweep_table(study, runs, cluster, unit)
    return Group(sweep_table(study, runs, cluster, unit), *(Text(line, style="red") for line in lines))


class SweepView:
    """A live-updating sweep table (rich), refreshed at most a few times a second."""

    def __init__(self, study: str, *, enabled: bool = True):
        self.study = study
        self.enabled = enabled
        self._live = Live(console=console, refresh_per_second=4, transient=False) if enabled else None
        self._runs = []
        self._cluster = ""

    def __enter__(self) -> "SweepView":
        if self._live:
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live:
            self._live.update(sweep_view(self.study, self._runs), refresh=True)
            self._live.__exit__(*exc)
            console.line()

    def update(self, runs, cluster: str = "") -> None:
        """Show the runs' current state and the cluster line (devices busy / total, in flight, queued)."""
        self._runs, self._cluster = runs, cluster
        if self._live:
            self._live.update(sweep_view(self.study, runs, cluster))


FITS_LEGEND = "pts: points fitted; fit: yes = A identified, none = no fit; R^2 etc.: --json"


def fits_table(fits, *, title: str = "sigmoid fits") -> Table:
    """A [95%], B, C_mid, R0, points and whether A is identified per run (fit_runs' columns), in 80 columns."""
    # numbers stay whole; a long run name wraps (folding where it has no spaces)
    result = table(
        safe(title),
        ("run", "A [95%]", "B", "C_mid", "R0", "pts", "fit"),
        caption=FITS_LEGEND,
        right=("A [95%]", "B", "C_mid", "R0", "pts"),
        wrap=("run",),
        fold=("run",),
    )
    for row in _numbered(fits):
        status = "yes" if row["identified"] else f"{'no' if _fitted(row) else 'none'} ({row['note']})"
        result.add_row(
            safe(row.get("run")),
            f"{_num(row.get('A'))} [{_num(row.get('A_lo'))}, {_num(row.get('A_hi'))}]",
            _num(row.get("B"), "{:.2f}"),
            _num(row.get("C_mid"), "{:.3g}"),
            _num(row.get("R0")),
            str(row.get("n_points", "-")),
            status,
            style=None if row["identified"] else "dim",
        )
    return result


def fit_reasons(fits) -> list[str]:
    """'(n) run: not identified|not fitted: reason' for each run whose A is not identified, numbered as in the table."""
    return [f"({row['note']}) {reason_line(row)}" for row in _numbered(fits) if not row["identified"]]


def reason_line(row) -> str:
    """'run: not identified|not fitted: reason' for one fit (a dict with fit_runs' columns)."""
    verdict = "not identified" if _fitted(row) else "not fitted"
    reason = cli_reason(row.get("reason")) or "?"
    return f"{row.get('run')}: {verdict}: {reason.removeprefix(verdict + ': ')}"  # the fit of record's says it too


def print_fits(fits, *, title: str) -> None:
    """The fits table, then the reasons for fits whose A is not identified, wrapped to the terminal."""
    console.print(fits_table(fits, title=title))
    for line in fit_reasons(fits):
        say(line, rest="    ")


def cli_reason(reason) -> str:
    """A fit's reason in the command line's words (the fitting library's also names its API's arguments)."""
    return (
        ""
        if reason is None or reason != reason
        else _API_WORDS.sub("if the metric is not a pass rate, use --unbounded", str(reason))
    )


_API_WORDS = re.compile(r"fit metrics not in \[0, 1\] unbounded \(rlscale fit --unbounded; bounded=False in the API\)")


def _fitted(row) -> bool:
    A = row.get("A")
    return A is not None and A == A


def _numbered(fits):
    """Each fit (a frame's rows or dicts) with `identified` a bool and `note` the number of the fits not identified."""
    count = 0
    for row in fits.to_dict("records") if hasattr(fits, "to_dict") else fits:
        identified = bool(row.get("identified"))
        count += not identified
        yield {**row, "identified": identified, "note": None if identified else count}
