"""A Report as sections of blocks, rendered as report.md and report.html; decision words come from views.wording."""

import re
from pathlib import Path

import yaml

from rlscale.base.numbers import format_number as _f
from rlscale.fitting.curves import unit_label
from rlscale.views.page import render_study_page, report_page
from rlscale.views.tables import (
    BACKTEST_HEADER,
    SIZE_HEADER,
    SIZE_NOTE,
    TARGET_HEADER,
    backtest_note,
    compare_cells,
    compare_header,
    size_rows,
    size_summary,
    table_lines,
    table_rows,
    target_cells,
)
from rlscale.views.wording import law_formula, reason_text

FIT_HEADER = ["run", "A [95%]", "B", "C_mid", "R0", "r2", "points", "fit"]
COMPARE_NOTE = (
    "Each variant over its seeds, read as the decision reads runs: its fitted reward at the compute every "
    "finished run reached. Separated: a gap of at least {band:.3g} and at least twice the seeds' "
    "pooled sd. Beside it, the fitted asymptote A (identified fits only) and the observed end reward (each "
    "run's mean over its last 10% of compute), which are not what the verdict reads."
)


def loo_header(band: float) -> list[str]:
    return ["variant", "A [95%]", "B", "C_mid", "dA", "dB", f"beyond {band:.3g} noise", "verdict"]


def standing_header(band: float) -> list[str]:
    return ["run", "B_p", "n", "fitted reward", "vs best", f"within {band:.3g}"]


def _interval(row) -> str:
    return f"{_f(row['A'])} [{_f(row['A_lo'])}, {_f(row['A_hi'])}]"


def fit_cells(row) -> list[str]:
    return [
        str(row["run"]),
        _interval(row),
        _f(row["B"], "{:.2f}"),
        _f(row["C_mid"], "{:.3g}"),
        _f(row["R0"]),
        _f(row["r2"]),
        str(row["n_points"]),
        row["status"],
    ]


def loo_cells(row) -> list[str]:
    return [
        row["variant"],
        _interval(row),
        _f(row["B"], "{:.2f}"),
        _f(row["C_mid"], "{:.4g}"),
        _f(row["dA"], "{:+.3f}"),
        _f(row["dB"], "{:+.2f}"),
        "yes" if row["beyond_noise"] else "no",
        row["verdict"],
    ]


def standing_cells(row) -> list[str]:
    return [
        str(row["run"]),
        _f(row["prompts_per_batch"], "{:d}"),
        _f(row["rollouts"], "{:d}"),
        _f(row["reward"]),
        _f(-row["gap"], "{:+.3f}"),
        "yes" if row["within_band"] else "no",
    ]


def decision_blocks(report) -> list[tuple]:
    """The decision's lines (views.wording.decision_lines) as blocks, then the recipe to run."""
    blocks, bullets = [], []
    for line in report.decision_lines:
        if line.startswith("- "):
            bullets.append(line[2:])
            continue
        if bullets:
            blocks.append(("bullets", bullets))
            bullets = []
        blocks.append(("code", line.strip()) if line.startswith("  rlscale ") else ("p", line))
    if bullets:
        blocks.append(("bullets", bullets))
    recipe = report.decision.recipe if report.decision is not None else None
    if recipe:
        blocks += [
            (
                "p",
                "The recipe to run (the study's recipe with the decided B_p, n and M; the export command "
                "writes it for your framework):",
            ),
            ("code", yaml.safe_dump(recipe, sort_keys=False, allow_unicode=True).strip()),
        ]
    return blocks


def _table_section(title, note, header, rows, classes=None, bullets=None) -> tuple[str, list[tuple]]:
    """A section of a paragraph, a table (row classes or None) and, when given, bullets under it."""
    blocks = [("p", note), ("table", header, rows, classes)]
    return title, blocks if bullets is None else [*blocks, ("bullets", bullets)]


def report_sections(report) -> list[tuple[str, list[tuple]]]:
    """(title, blocks) in the report's order; a block is ("p", text), ("bullets", [text]), ("code", text),
    ("table", header, rows, row classes or None) or ("img", name, path)."""
    sections = []
    if report.decision_lines:
        sections.append(("Decision", decision_blocks(report)))
    standing = report.decision.standing if report.decision is not None else None
    if standing is not None:
        sections.append(
            _table_section(
                f"Runs at {standing.compute:.4g} {unit_label(report.unit)} (fitted reward)",
                "Every finished run reached this compute: each run's fitted curve is read inside its own "
                "data, as the decision, the variants and the frontier read it.",
                standing_header(standing.noise_band),
                [standing_cells(row) for row in standing.runs],
                ["" if row["within_band"] else "outside" for row in standing.runs],
            )
        )
    if report.targets is not None:
        sections.append(
            _table_section(
                f"Compute to reach a reward of {report.targets['target']:.3f}",
                report.targets["note"],
                TARGET_HEADER,
                [target_cells(row) for row in report.targets["runs"]],
            )
        )
    if report.loo is not None:
        sections.append(
            _table_section(
                "Leave-one-out (ScaleRL)",
                f"dA is each variant's asymptote minus the full recipe's; |dA| < {report.noise_band:.3g} is seed "
                "noise.",
                loo_header(report.noise_band),
                [loo_cells(r) for r in report.loo],
                ["beyond" if r["beyond_noise"] else ("" if r["identified"] else "unidentified") for r in report.loo],
            )
        )
    if report.comparison is not None:
        sections.append(
            _table_section(
                "Variants across seeds",
                COMPARE_NOTE.format(band=report.noise_band),
                compare_header(report.comparison),
                [compare_cells(r) for r in report.comparison["rows"]],
                bullets=[reason_text(report.comparison["verdict"])],
            )
        )
    sections.append(
        _table_section(
            "Per-run sigmoid fits",
            f"R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B), fitted on {report.fitted_on}",
            FIT_HEADER,
            [fit_cells(r) for r in report.fits],
            ["" if r["identified"] else "unidentified" for r in report.fits],
        )
    )
    if report.backtest is not None:
        sections.append(
            _table_section(
                "Backtest (ScaleRL: fit on the first half, extrapolate)",
                backtest_note(report.backtest),
                BACKTEST_HEADER,
                table_rows(report.backtest),
                ["" if r["fitted"] else "unidentified" for r in report.backtest["runs"]],
                table_lines(report.backtest),
            )
        )
    if report.law is not None:
        law = report.law
        law_text = (
            f"log2 n*(C) = {law_formula(law)}; "
            f"{'identified' if law['identified'] else 'not identified'}: {reason_text(law['verdict'])}"
        )
        sections.append(("Optimal rollouts per prompt", [("p", law_text)]))
    if report.sizes is not None:
        sections.append(
            _table_section(
                "Across model sizes (Tan et al.)",
                SIZE_NOTE,
                SIZE_HEADER,
                size_rows(report.sizes),
                bullets=[size_summary(report.sizes)],
            )
        )
    if report.notes:
        sections.append(("Notes", [("bullets", list(report.notes))]))
    for name, path in report.plots.items():
        sections.append((name.replace("_", " "), [("img", name, path)]))
    return sections


_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]<>#|!~$])")


def md_text(text) -> str:
    """`text` (a run name, or prose quoting one) with markdown's punctuation escaped, so it renders as typed."""
    return _MD_SPECIAL.sub(r"\\\1", str(text))


def _md_block(block) -> str:
    kind = block[0]
    if kind == "p":
        return md_text(block[1])
    if kind == "bullets":
        return "\n".join(f"- {md_text(item)}" for item in block[1])
    if kind == "code":
        return f"```\n{block[1]}\n```"
    if kind == "img":
        return f"![{block[1]}]({Path(block[2]).name})"
    header, rows = block[1], block[2]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += [
        "| " + " | ".join([md_text(row[0]), *(cell.replace("|", "\\|") for cell in row[1:])]) + " |" for row in rows
    ]
    return "\n".join(lines)


def render_markdown(report) -> str:
    """report.md: the decision first, then the tables and PNG links (relative, beside the file)."""
    parts = [
        f"# {md_text(report.study)}: scaling report",
        "",
        md_text(f"Method: {report.method}. Compute: {unit_label(report.unit)}. {report.description}".strip()),
        "",
    ]
    for title, blocks in report_sections(report):
        parts += [f"## {md_text(title)}", ""]
        for block in blocks:
            parts += [_md_block(block), ""]
    return "\n".join(parts)


def render_html(report) -> str:
    """report.html: the dashboard's study page (views/page.py), self-contained (styles inline, PNGs as data URIs)."""
    return render_study_page(report_page(report, report_sections(report)))
