"""Backtest, model-size, target and variants tables as text cells, the same in terminal, report.md and report.html."""

import math

from rlscale.base.numbers import format_number as _f
from rlscale.fitting.backtest import PICK_METHODS, RISE, BacktestSummary, CutPick, RunBacktest

BACKTEST_HEADER = [
    "run",
    "fit on C <=",
    "predicted [PI]",
    "observed",
    "error",
    "carry-forward (error)",
    "A part [95%]",
    "A full",
    "A inside",
    "rising",
    "part fit",
]


def backtest_cells(result: RunBacktest) -> list[str]:
    yes_no = {True: "yes", False: "no", None: "-"}
    status = ("identified" if result.identified else "not identified") if result.fitted else "not fitted"
    return [
        result.run,
        _f(result.cut_compute, "{:.4g}"),
        f"{_f(result.predicted)} [{_f(result.pi_lo)}, {_f(result.pi_hi)}]",
        _f(result.observed),
        _f(result.error, "{:+.3f}"),
        f"{_f(result.carry_forward)} ({_f(result.carry_forward_error, '{:+.3f}')})",
        f"{_f(result.A_part)} [{_f(result.A_part_lo)}, {_f(result.A_part_hi)}]",
        _f(result.A_full),
        yes_no[result.A_inside],
        yes_no[result.rising],
        status,
    ]


def backtest_summary_lines(summary: BacktestSummary) -> list[str]:
    lines = [
        f"{summary.fitted} of {summary.runs} runs fitted on their first {summary.fraction:.0%} of compute; "
        f"{summary.rising} still rising there (gained > {RISE:g} by the end)."
    ]
    if summary.rising:
        verdict = "fit better" if summary.fit_beats_carry_forward_rising else "carry-forward as good or better"
        lines.append(
            f"Mean |error| at the end on the rising runs: fit {_f(summary.mae_fit_rising)}, "
            f"carry-forward {_f(summary.mae_carry_forward_rising)} ({verdict})."
        )
    lines.append(
        f"Mean |error| on every fitted run: fit {_f(summary.mae_fit)}, carry-forward {_f(summary.mae_carry_forward)}."
    )
    if summary.pi_checked:
        lines.append(
            f"End reward in its {summary.level:.0%} prediction interval: {summary.pi_inside} of "
            f"{summary.pi_checked} ({summary.pi_coverage:.0%}); median width {_f(summary.pi_median_width)}; "
            f"mean interval score {_f(summary.pi_mean_score)}."
        )
    if summary.A_checked:
        lines.append(
            f"Full-run A inside the part-fit's 95% interval: {summary.A_inside} of {summary.A_checked} "
            f"({summary.A_inside_share:.0%}); where the full run's own A is identified: "
            f"{_f(summary.A_inside_identified_share, '{:.0%}')} of {summary.A_checked_identified}."
        )
    if summary.A_no_interval:
        lines.append(
            f"Not checked: {summary.A_no_interval} part-fit(s) with too few points for an interval "
            "(fewer than two per parameter)."
        )
    return lines


def backtest_note(table: dict) -> str:
    """What a `backtest_table` shows, with its cut and its prediction interval's level."""
    summary = table["summary"]
    cut = f"{summary['fraction']:.0%}"
    return (
        f"Each run fitted on its first {cut} of compute and extrapolated to its end: predicted vs observed "
        f"reward over the run's last 10% of compute with its {summary['level']:.0%} prediction interval, a "
        f"carry-forward baseline (the last reward at the cut), and whether the full run's A falls inside the "
        "part-fit's 95% interval."
    )


def table_rows(table: dict) -> list[list[str]]:
    """Cells of every run of a `backtest_table`."""
    return [backtest_cells(RunBacktest(**row)) for row in table["runs"]]


def table_lines(table: dict) -> list[str]:
    """The summary of a `backtest_table` in words, with the reasons for runs not fitted."""
    missed = [f"{row['run']}: not fitted: {row['reason']}" for row in table["runs"] if not row["fitted"]]
    decision = table.get("decision")
    chosen = cut_pick_lines(CutPick(**decision)) if decision else []
    return missed + backtest_summary_lines(BacktestSummary(**table["summary"])) + chosen


def cut_pick_lines(decision: CutPick) -> list[str]:
    """The decision in words: the pick from the cut, the best run at the end, each method's regret."""
    short = {"prediction": "prediction", "prediction_point": "point", "leader": "leader", "A": "A"}
    regret = ", ".join(f"{short[method]} {decision.regret[method]:.3f}" for method in PICK_METHODS)
    return [
        f"Picked at {decision.fraction:.0%} by prediction: {decision.picks['prediction']}",
        f"Best at the end: {decision.best}",
        f"Regret (best end - picked end): {regret}",
    ]


SIZE_HEADER = ["model", "params", "k [interval]", "E [interval]", "compute to"]
SIZE_NOTE = (
    "ln(1 - reward) = -k(N) ln C + E(N) per model size N at equal compute C; Tan et al.: "
    "k(N) = K_max / (1 + N0 / N). Intervals: a bootstrap over each size's runs."
)


def size_rows(sizes: dict) -> list[list[str]]:
    """Table cells of SizeLaw.to_dict(): one row per size."""

    def cell(value, interval):
        return f"{value:.3g} [{interval[0]:.3g}, {interval[1]:.3g}]"

    return [
        [
            row["model"],
            f"{row['parameters']:.3g}",
            cell(row["k"], row["k_interval"]),
            cell(row["E"], row["E_interval"]),
            f"{row['compute_max']:.3g}",
        ]
        for row in sizes["sizes"]
    ]


def size_summary(sizes: dict) -> str:
    """One line: K_max and N0 across sizes, identified or why not."""
    across = sizes["across"]
    fitted = "" if across is None else f"K_max = {across['K_max']:.3g}, N0 = {across['N0']:.3g}; "
    return f"{fitted}{'identified' if sizes['across_identified'] else 'not identified'}: {sizes['across_reason']}"


TARGET_HEADER = ["run", "compute to reach [interval]", "A [95%]", "fit"]


def target_cells(row: dict) -> list[str]:
    """Table cells of one target row: run, compute [lo, hi] (or why there is none), A [95%], identified."""
    code, v = row["reach"]["code"], row["reach"]["values"]
    if code == "reached":
        compute = f"{_f(v['compute'], '{:.4g}')} [{_f(v['compute_lo'], '{:.4g}')}, {_f(v['compute_hi'], '{:.4g}')}]"
    elif code == "reached_unbounded":
        compute = f"{_f(v['compute'], '{:.4g}')} [{_f(v['compute_lo'], '{:.4g}')}, never in {v['share_unreached']:.0%}]"
    else:
        compute = {
            "at_start": "at the start",
            "not_reached": "not below A",
            "a_not_identified": "A not identified",
        }.get(code, "no fit")
    return [
        row["run"],
        compute,
        f"{_f(row['A'])} [{_f(row['A_lo'])}, {_f(row['A_hi'])}]",
        "identified" if row["identified"] else "not identified",
    ]


def compare_header(comparison: dict) -> list[str]:
    return [
        "variant",
        "seeds",
        "A identified",
        "A mean +- sd",
        f"fitted reward at {comparison['compute']:.4g}",
        "vs best (fitted)",
        "observed end mean +- sd",
    ]


def compare_cells(row: dict) -> list[str]:
    """Table cells of one variant's row (compare_header's columns)."""

    def pm(mean, sd):
        if not math.isfinite(mean):
            return "-"
        return f"{mean:.3f} +- {sd:.3f}" if math.isfinite(sd) else f"{mean:.3f}"

    vs = row["reward_vs_best"]
    return [
        str(row["variant"]),
        str(row["seeds"]),
        f"{row['identified']} of {row['seeds']}",
        pm(row["A_mean"], row["A_sd"]),
        pm(row["reward_mean"], row["reward_sd"]),
        (f"{vs:+.3f}" + ("" if row["within_band"] else " (beyond)")) if math.isfinite(vs) else "-",
        pm(row["end_mean"], row["end_sd"]),
    ]
