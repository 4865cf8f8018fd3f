"""The study page for report.html and the dashboard (pure); every word is escaped here, page.js uses textContent."""

import base64
import html
import json
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import yaml

from rlscale.fitting.curves import unit_label
from rlscale.views.page_charts import CURVE_POINTS, EXTEND
from rlscale.views.wording import law_formula, orphaned_runs, reason_text

ASSET_DIR = Path(__file__).parent / "assets"
# the files the page uses, by name -> content type: the dashboard serves these and nothing else
ASSETS = {
    "page.css": "text/css; charset=utf-8",
    "page.js": "text/javascript; charset=utf-8",
    "uPlot.min.css": "text/css; charset=utf-8",
    "uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "uPlot.LICENSE": "text/plain; charset=utf-8",
}
_STYLES = ("uPlot.min.css", "page.css")
_SCRIPTS = ("uPlot.iife.min.js", "page.js")


@dataclass
class StudyPage:
    """Everything the study page shows, as plain data page.js reads: decision {verdict, lines, recipe}, flight {running,
    queued, counts}, stopped [{run, reason}] or None, runs (dashboard.study's rows), sections [(title, blocks)]."""

    study: str
    method: str = ""
    unit: str = "gpu_hours"
    description: str = ""
    fitted_on: str = ""
    decision: dict | None = None
    runs: list[dict] = field(default_factory=list)
    flight: dict | None = None
    stopped: list[dict] | None = None
    rule: str = ""
    reward_label: str = "reward"
    axes: list[dict] = field(default_factory=list)
    group: str = "status"
    frontier: dict | None = None
    law: dict | None = None
    sections: list[tuple] = field(default_factory=list)


def report_page(report, sections: list[tuple]) -> StudyPage:
    """A Report's study page: the decision in its own block, then the other sections (report_text.report_sections)."""
    decision = None
    if report.decision_lines:
        recipe = getattr(report.decision, "recipe", None)
        decision = {
            "verdict": "decided" if report.decision is not None and report.decision.decided else "not yet",
            "lines": list(report.decision_lines),
            "recipe": yaml.safe_dump(recipe, sort_keys=False, allow_unicode=True).strip() if recipe else None,
        }
    return StudyPage(
        study=report.study,
        method=report.method,
        unit=report.unit,
        description=report.description,
        fitted_on=report.fitted_on,
        decision=decision,
        sections=[(title, blocks) for title, blocks in sections if title != "Decision"],
    )


def esc(value) -> str:
    """`value` as HTML text (quotes too, so it is safe in an attribute)."""
    return html.escape(str(value), quote=True)


def asset(name: str) -> bytes:
    """The bytes of one of the page's own files; KeyError for any other name (nothing else is ever read)."""
    if name not in ASSETS:
        raise KeyError(name)
    return (ASSET_DIR / name).read_bytes()


def png_data_uri(path) -> str:
    """A PNG file as a data: URI (report.html carries its images inside)."""
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode()


def script_json(data) -> str:
    """JSON to embed in <script type="application/json">: '<', '>' and '&' escaped so no name can close it."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def study_href(study: str) -> str:
    """The dashboard's path of a study's page (names are file-safe words; quoted all the same)."""
    return "study/" + quote(str(study), safe="")


def page_data(page: StudyPage) -> dict:
    """For page.js: meta {study, unit, reward, axes, group, extend}, order (run ids), runs {str id: row}, frontier."""
    meta = {
        "study": page.study,
        "unit": unit_label(page.unit),
        "reward": page.reward_label,
        "axes": page.axes,
        "group": page.group,
        "extend": EXTEND,
    }
    return {
        "meta": meta,
        "order": [row["id"] for row in page.runs],
        "runs": {str(row["id"]): row for row in page.runs},
        "frontier": page.frontier,
    }


def live_sections(page: StudyPage) -> dict[str, str]:
    """The inner HTML of each section a live page replaces on refresh, by element id."""
    return {
        "decision": _decision(page.decision),
        "flight": _flight(page.flight),
        "law": _law(page.law, page.frontier),
        "stopped": _stopped(page.stopped, page.rule),
    }


def render_study_page(page: StudyPage, *, live_url: str | None = None, stamp: str = "", assets_href: str = "") -> str:
    """The page; live_url: the JSON route to poll (assets at `assets_href`); None: static with assets inlined."""
    sections = live_sections(page)
    unit = unit_label(page.unit)
    meta = [
        f"Method: <b>{esc(page.method)}</b>" if page.method else "",
        f"Compute: {esc(unit)}",
        f"Fits on {esc(page.fitted_on)}" if page.fitted_on else "",
        esc(page.description),
    ]
    body = [
        f'<header><h1>{esc(page.study)}</h1><p class="meta">{". ".join(m for m in meta if m)}</p>',
        '<p id="live-status" class="live-status"></p></header>' if live_url else "</header>",
    ]
    if page.decision is not None or live_url:
        body.append(f'<section id="decision" class="decision">{sections["decision"]}</section>')
    if page.flight is not None or live_url:
        body.append(f'<section id="flight">{sections["flight"]}</section>')
    if page.runs or live_url:
        body.append(
            _chart_section(
                "parallel",
                "Runs by their axes",
                "one line per run, coloured by the group; drag along an axis to keep a range of it (click the axis "
                "to clear); fitted reward: each run's sigmoid at the decision's budget",
                '<div id="controls" class="controls"></div>',
            )
        )
        body.append(
            _chart_section(
                "curves",
                "Reward vs compute",
                f"points: evaluations (up to {CURVE_POINTS} a run, spread over log compute); line: fitted sigmoid "
                "(dashed past the run's last compute); band: 95% interval on A (with few runs shown)",
                '<div id="legend" class="legend"></div>',
            )
        )
        body.append(
            '<section id="runs"><h2>Runs</h2><p class="caption" id="runs-shown"></p>'
            '<table class="runs"><thead></thead><tbody></tbody></table></section>'
        )
    if page.frontier is not None or live_url:
        body.append(
            _chart_section(
                "frontier",
                "Frontier and optimal-n law",
                "steps: the frontier's n*; line: the law (dashed: extrapolated)",
                f'<div id="law">{sections["law"]}</div>',
            )
        )
    if page.stopped is not None or live_url:
        body.append(f'<section id="stopped">{sections["stopped"]}</section>')
    for title, blocks in page.sections:
        body.append(f"<section><h2>{esc(title)}</h2>{''.join(_block(block) for block in blocks)}</section>")
    drawn = bool(page.runs or page.frontier or live_url)
    if drawn:
        body.append(f'<script type="application/json" id="page-data">{script_json(page_data(page))}</script>')
    attrs = f' data-live="{esc(live_url)}" data-stamp="{esc(stamp)}"' if live_url else ""
    scripts = _SCRIPTS if drawn else ()
    return _document(f"{page.study}: study", "".join(body), attrs, scripts, assets_href if live_url else None)


def render_index(studies: list[dict], *, store: str = "", error: str = "") -> str:
    """The dashboard's first page: every study with its runs by status, each linking to its page."""
    rows = []
    for row in studies:
        name = esc(row["study"])
        counts = [
            str(row.get(key, 0)) for key in ("runs", "running", "pending", "done", "stopped", "failed", "records")
        ]
        rows.append(
            f'<tr><td><a href="{esc(study_href(row["study"]))}">{name}</a></td>'
            + "".join(f"<td>{c}</td>" for c in counts)
            + "</tr>"
        )
    head = "".join(
        f"<th>{h}</th>" for h in ("study", "runs", "running", "queued", "done", "stopped", "failed", "records")
    )
    table = (
        f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
        if rows
        else "<p>No studies in this store yet.</p>"
    )
    problem = f'<p class="note">{esc(error)}</p>' if error else ""
    body = f'<header><h1>Studies</h1><p class="meta">Store: {esc(store)} (read-only)</p></header>{problem}{table}'
    return _document("rlscale studies", body, "", (), "assets/")


def _document(title: str, body: str, attrs: str, scripts, assets_href: str | None) -> str:
    icon = ""
    if assets_href is not None:
        icon = '<link rel="icon" href="data:,">'  # an empty icon: browsers ask the server for /favicon.ico otherwise
        head = "".join(f'<link rel="stylesheet" href="{esc(assets_href + name)}">' for name in _STYLES)
        tail = "".join(f'<script src="{esc(assets_href + name)}"></script>' for name in scripts)
    else:
        head = "<style>" + "\n".join(asset(name).decode() for name in _STYLES) + "</style>"
        tail = "".join(f"<script>{asset(name).decode()}</script>" for name in scripts)
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">{icon}{head}</head>'
        f"<body{attrs}>{body}{tail}</body></html>\n"
    )


def _chart_section(name: str, title: str, caption: str, extra: str = "") -> str:
    return (
        f'<section id="section-{name}"><h2>{esc(title)}</h2>{extra}<div class="chart" id="chart-{name}"></div>'
        f'<p class="caption">{esc(caption)}</p></section>'
    )


def _decision(decision: dict | None) -> str:
    if decision is None:
        return "<h2>Decision</h2><p>No decision yet: no run has been evaluated.</p>"
    verdict = str(decision.get("verdict", "")).replace(" ", "-")
    lines = list(decision.get("lines") or [])
    parts = ["<h2>Decision</h2>"]
    if lines:
        parts.append(f'<p class="headline {esc(verdict)}">{esc(lines.pop(0))}</p>')
    bullets: list[str] = []
    for line in lines + [""]:
        if line.startswith("- "):
            bullets.append(f"<li>{esc(line[2:])}</li>")
            continue
        if bullets:
            parts.append("<ul>" + "".join(bullets) + "</ul>")
            bullets = []
        if line.startswith("  "):
            parts.append(f'<pre class="command"><code>{esc(line.strip())}</code></pre>')
        elif line:
            parts.append(f"<p>{esc(line)}</p>")
    if decision.get("recipe"):
        parts.append(f'<p>The recipe to run:</p><pre class="command"><code>{esc(decision["recipe"])}</code></pre>')
    return "".join(parts)


def _flight(flight: dict | None) -> str:
    if flight is None:
        return ""
    running = flight.get("running") or []
    held = ", ".join(f"{run} ({holds})" if holds else str(run) for run, holds in running)
    counts = flight.get("counts") or {}
    rest = ", ".join(f"{counts[key]} {key}" for key in ("done", "stopped", "failed") if counts.get(key))
    text = f"{len(running)} in flight" + (f": {held}" if held else "") + f"; {flight.get('queued', 0)} queued"
    if flight.get("swept") is False and running:
        text = f"{orphaned_runs(len(running))}: {held}; {flight.get('queued', 0)} queued"
    return f'<p class="flight">{esc(text)}{esc("; " + rest) if rest else ""}</p>'


def _law(law: dict | None, frontier: dict | None) -> str:
    if law is None:
        reason = (frontier or {}).get("reason", "")
        return f"<p>No optimal-n law yet{esc(': ' + reason) if reason else ''}.</p>" if frontier is None else ""
    verdict = "identified" if law["identified"] else "not identified"
    return f"<p>{esc('log2 n*(C) = ' + law_formula(law))}; {verdict}: {esc(reason_text(law['verdict']))}</p>"


def _stopped(stopped: list[dict] | None, rule: str) -> str:
    if stopped is None:
        return ""
    title = "<h2>Early termination</h2>"
    ruled = f"<p>Rule: {esc(rule)}.</p>" if rule else ""
    if not stopped:
        return f"{title}{ruled}<p>No run stopped early.</p>"
    items = "".join(f"<li><b>{esc(row['run'])}</b>: {esc(row.get('reason') or 'stopped')}</li>" for row in stopped)
    return f'{title}{ruled}<ul class="stopped">{items}</ul>'


def _block(block: tuple) -> str:
    kind = block[0]
    if kind == "p":
        return f"<p>{esc(block[1])}</p>"
    if kind == "bullets":
        return "<ul>" + "".join(f"<li>{esc(item)}</li>" for item in block[1]) + "</ul>"
    if kind == "code":
        return f'<pre class="command"><code>{esc(block[1])}</code></pre>'
    if kind == "img":
        return f'<img alt="{esc(block[1])}" src="{esc(png_data_uri(block[2]))}">'
    header, rows, classes = block[1], block[2], block[3] if len(block) > 3 else None
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = [
        f'<tr class="{esc(classes[i] if classes and classes[i] else "")}">'
        + "".join(f"<td>{esc(cell)}</td>" for cell in row)
        + "</tr>"
        for i, row in enumerate(rows)
    ]
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
