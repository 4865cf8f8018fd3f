"""The English of every Reason code (fitting.rules.reasons), for terminal, report and dashboard; tests assert codes."""

import math
import os
import shlex
from pathlib import Path

from rlscale.base.settings import command_db_url
from rlscale.fitting.curves import unit_label
from rlscale.fitting.rules.reasons import Reason


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _runs(items) -> str:
    return ", ".join(f"{item['run']} ({item['why']})" for item in items)


def _runs_why(runs) -> str:
    return f" ({'; '.join(str(r['run']) + ': ' + str(r['why']) for r in runs)})" if runs else ""


def _band(v) -> str:
    close = v.get("within_band") or []
    if not close:
        return ""
    return f"; also within the {v['noise_band']:g} noise band there: " + ", ".join(
        f"{item['run']} {item['reward']:.3f}" for item in close
    )


def separated_pair(pair: dict) -> str:
    """ "a above b (+0.030)": one separated pair of variants, the gap in fitted reward."""
    return f"{pair['better']} above {pair['worse']} ({pair['gap']:+.3f})"


def _one_seed(v) -> str:
    return " (one seed each: the band is ScaleRL's 3-seed spread)" if v.get("one_seed") else ""


def _within_best(v) -> str:
    close = [name for name in v.get("within_band", []) if name != v.get("best")]
    return f"; within the band of {v['best']}: {', '.join(close)}" if close else ""


def _fit_reason(v) -> str:
    return v.get("fit_reason") or "not identified"


_TEXT = {
    # the optimal-n law's verdict (fitting.laws.optimal_n)
    "law_identified": lambda v: "n* rises and saturates within the observed compute",
    "frontier_few_n": lambda v: (
        f"the frontier has not bent: n* takes only {v['rollouts']} over compute {v['compute_lo']:.3g} to "
        f"{v['compute_hi']:.3g} (need at least {v['min_distinct']} distinct values; add runs with more rollouts or "
        "more compute)"
    ),
    "n_falls": lambda v: (
        f"n* falls with compute (fitted from n={v['n_low']:.0f} to n={v['n_high']:.0f}), not the rise-then-saturate "
        "shape of the Playbook: check the low-compute runs"
    ),
    "n_still_moving": lambda v: (
        f"the frontier has not bent: n* is still moving at the largest compute observed ({v['compute_hi']:.3g}); "
        f"the last n* = {v['rollouts']} holds over only {v['held']:.0%} of the log-compute range "
        f"(need {v['min_plateau']:.0%}), so extrapolation would be a guess"
    ),
    "plateau_unseen": lambda v: (
        f"the frontier has not bent: n* is still moving at the largest compute observed ({v['compute_hi']:.3g}); "
        f"its plateau (n={v['n_plateau']:.0f}) is not in the data, so extrapolation would be a guess"
    ),
    "law_flat": lambda v: "the law is flat (n* varies by less than a factor sqrt(2)): noise, not a trend",
    # how n was chosen (Recommendation.basis)
    "law": lambda v: (
        f"n* = {v['n_star']:.0f} [{v['n_lo']:.0f}, {v['n_hi']:.0f}] from the optimal-n law at {v['compute']:.4g} "
        f"({v['extrapolation']:.1f}x the largest compute observed)"
    ),
    "within_data": lambda v: (
        f"every run reached {v['compute']:.4g}, so each fitted curve is read inside its own data, where it holds "
        f"whether or not A is identified; n = {v['rollouts']} from {v['run']}, the highest fitted reward there "
        f"({v['reward']:.3f})"
    ),
    "constant_frontier": lambda v: (
        f"n = {v['rollouts']} was the best n at every compute the runs reached ({v['compute_lo']:.3g} to "
        f"{v['compute_hi']:.3g}), so n comes from its fitted runs"
    ),
    "constant_frontier_substitute": lambda v: (
        f"n* was {v['frontier_rollouts']} at every compute the runs reached, but no run at n = "
        f"{v['frontier_rollouts']} is identified; n = {v['rollouts']} from {v['run']}, the identified run with the "
        f"highest fitted reward at {v['compute']:.3g} ({v['reward']:.3f}; no unidentified run is {v['noise_band']:g} "
        "or more above it there)"
    ),
    "all_runs_pinned": lambda v: (
        f"n* moved over the compute the runs reached (it took {v['moved']}), but every run is identified and stable "
        f"(asymptotes {v['A_low']:.3f}-{v['A_high']:.3f}), so each run's fitted curve is read at the budget instead "
        f"of a law; n = {v['rollouts']} from {v['run']}, the highest there ({v['reward']:.3f} at {v['compute']:.4g}, "
        f"{v['compute'] / v['reach']:.1f}x the most compute a run reached){_band(v)}"
    ),
    # notes beside a recommendation
    "law_needs_more_compute": lambda v: "runs at larger compute levels would fit the optimal-n law",
    "n_untested": lambda v: (
        f"n = {v['rollouts']} was not tested; B_p and the predicted reward come from the runs at n = {v['tested']}"
    ),
    "no_draws": lambda v: f"no bootstrap draws for run {v['run']}: the reward interval is unknown",
    "far_extrapolation": lambda v: (
        f"the budget is {v['factor']:.0f}x the largest compute observed: treat the law as a guess there"
    ),
    "prediction_interval": lambda v: (
        f"reward at the budget: the mean over its last 10%, with a {v['level']:.0%} prediction interval (fit, "
        "evaluation noise and drift past the data)"
    ),
    "cost_model": lambda v: f"compute in {unit_label(v['unit'])}; steps {reason_text(v['how'])}",
    "steps_per_rollout": lambda v: "from the rollouts: B_p x n per step",
    "steps_per_token": lambda v: f"from the tokens: {v['tokens_per_rollout']:.1f} per rollout",
    "steps_profile": lambda v: f"from the cost model, profile {v['profile']}",
    "steps_calibrated": lambda v: f"from the cost model calibrated on the study's records (r2 {v['r2']:.2f})",
    "steps_measured": lambda v: f"as run {v['run']} took them to this compute ({v['steps']:,}), measured",
    "steps_run_rate": lambda v: f"as run {v['run']} spent compute per step over its second half, past its data",
    # refusals
    "no_evaluations": lambda v: f"study {v['study']!r} has no evaluated records yet",
    "one_rollouts_value": lambda v: (
        (
            f"study {v['study']!r} has fitted runs at {v['values']} rollouts value(s)"
            if v["values"]
            else f"study {v['study']!r} has no fitted run"
        )
        + "; the optimal-n law needs an IsoCompute study that varies rollouts"
    ),
    "no_frontier": lambda v: (
        f"the optimal-n law cannot be fitted: {v['error']} (have the runs passed their inflection?)"
    ),
    "law_not_identified": lambda v: f"the optimal-n law is not identified: {reason_text(v['law'])}",
    "no_trusted_run": lambda v: "no run has an identified fit that trained stably" + _runs_why(v.get("runs")),
    "best_within_data": lambda v: (
        f"the highest fitted reward at {v['compute']:.4g}: {v['reward']:.3f} (A {v['A']:.3f}; "
        f"{_count(v['runs'], 'run')} compared, each read inside its own data)"
    ),
    "best_predicted": lambda v: (
        f"the highest predicted reward at {v['compute']:.4g}: {v['reward']:.3f} (A {v['A']:.3f} "
        f"[{v['A_lo']:.3f}, {v['A_hi']:.3f}]; {v['runs']} identified, stable runs compared)"
    ),
    "no_recipe": lambda v: f"run {v['run']} has no recipe to export: {v['error']}",
    "unidentified_run_ahead": lambda v: (
        f"run {v['run']} (not identified: {_fit_reason(v)}) fits {v['reward']:.3f} at {v['compute']:.3g}, "
        f"{v['noise_band']:g} or more above the best identified run {v['best_run']} ({v['best_reward']:.3f})"
    ),
    "runs_not_pinned": lambda v: (
        f"n* moved ({v['moved']}) while not every run is identified and stable ({_runs(v['runs'])}), so where it "
        "goes beyond the observed compute is unknown"
    ),
    "runs_not_fitted": lambda v: (
        f"some runs could not be fitted, so the best at {v['compute']:.4g} is unknown ({_runs(v['runs'])})"
    ),
    "no_stable_finished_run": lambda v: "no run finished and trained stably",
    "no_trusted_run_at_n": lambda v: (
        f"no run at n = {v['rollouts']} has {'an identified fit' if v['identified_required'] else 'a fit'} and "
        f"trained stably ({_runs(v['runs'])})"
    ),
    "budget_buys_no_step": lambda v: (
        f"a budget of {v['budget']:g} does not pay for one step at B_p = {v['prompts_per_batch']}, n = {v['rollouts']}"
    ),
    # the model-size recommendation (fitting.laws.model_size)
    "no_model_axis": lambda v: f"study {v['study']!r} has no `model` axis with `models`",
    "size_law_not_fitted": lambda v: f"the power law across sizes cannot be fitted: {v['error']}",
    "size_not_learning": lambda v: (
        f"the loss of {v['model']} does not clearly fall with compute (k = {v['k']:.3g}, {v['level']:.0%} interval "
        f"from {v['k_lo']:.3g}); train it longer"
    ),
    "size_budget_past_data": lambda v: (
        f"the budget {v['budget']:g} is {v['factor']:.0f}x the largest compute measured for {v['model']} "
        f"({v['reach']:.3g}); at most {v['max_beyond']:g}x is predicted"
    ),
    # what the next allocation should identify (fitting.rules.allocation)
    "identify_fits": lambda v: f"identify {v['unidentified']} of {v['runs']} fits",
    "identify_fits_and_law": lambda v: f"identify {v['unidentified']} of {v['runs']} fits and the optimal-n law",
    "identify_law": lambda v: "identify the optimal-n law (every run's fit is identified already)",
    # the variants compared across seeds (fitting.rules.compare)
    "variants_separated": lambda v: (
        f"separated beyond the {v['noise_band']:g} noise band at {v['compute']:.4g} (fitted reward){_one_seed(v)}: "
        + "; ".join(separated_pair(p) for p in v["pairs"])
        + _within_best(v)
    ),
    "variants_within_band": lambda v: (
        f"no two variants separated beyond the {v['noise_band']:g} noise band at {v['compute']:.4g} (fitted "
        + (
            f"reward): the widest gap is {v['widest']['gap']:.3f} ({v['widest']['better']} vs {v['widest']['worse']})"
            if v["widest"]["gap"] is not None
            else "reward): no two variants can both be read there, inside their data"
        )
        + (
            f"; seed-to-seed sd of the fitted reward {v['sd_lo']:.3f}-{v['sd_hi']:.3f}"
            if v.get("sd_lo") is not None
            else "; one seed each (the band is ScaleRL's 3-seed spread)"
        )
        + (
            ""
            if v.get("identified") is None
            else "; A not compared: not every seed's fit is identified ("
            + ", ".join(f"{r['variant']} {r['identified']} of {r['seeds']}" for r in v["identified"])
            + ")"
        )
    ),
    # the compute to reach a target reward (fitting.laws.target)
    "reached": lambda v: (
        f"reaches {v['target']:.3f} at {v['compute']:.4g} [{v['compute_lo']:.4g}, {v['compute_hi']:.4g}]"
    ),
    "reached_unbounded": lambda v: (
        f"reaches {v['target']:.3f} at {v['compute']:.4g} (from {v['compute_lo']:.4g}; {v['share_unreached']:.0%} "
        f"of the bootstrap draws never reach it)"
    ),
    "at_start": lambda v: f"starts at or above {v['target']:.3f} (R0 {v['R0']:.3f})",
    "not_reached": lambda v: f"does not reach {v['target']:.3f} below A = {v['A']:.3f}",
    "a_not_identified": lambda v: (
        f"A = {v['A']:.3f} is not identified: whether it reaches {v['target']:.3f} is not known"
    ),
    "not_fitted": lambda v: f"no fit: {v['error']}",
}


def orphaned_runs(running: int) -> str:
    """What runs marked running are when no sweep driver holds their study (kill -9, a lost node): `status` and the
    dashboard say it alike."""
    return (
        f"no sweep is running: {running} run(s) marked running were left by one that ended; "
        "run the sweep again to resume them"
    )


def law_formula(law: dict) -> str:
    """The optimal-n law's right-hand side for log2 n*, with its fitted lo, hi, k and c0."""
    shift = f"- {law['c0']:.2f}" if law["c0"] >= 0 else f"+ {-law['c0']:.2f}"  # ln C of a small compute is negative
    return f"{law['lo']:.2f} + ({law['hi']:.2f} - {law['lo']:.2f}) / (1 + exp(-{law['k']:.2f} (ln C {shift})))"


def reason_text(reason) -> str:
    """The English of one Reason or of its JSON form {code, values}; an unknown code shows as code and values."""
    if isinstance(reason, Reason):
        render = _TEXT.get(reason.code)
        return f"{reason.code} {reason.values}" if render is None else render(reason.values)
    try:
        return reason_text(Reason(reason["code"], reason.get("values", {})))
    except (TypeError, ValueError):  # a number JSON turned into null: worded as nan, as the Reason itself is
        return reason_text(Reason(reason["code"], _nan_for_none(reason.get("values", {}))))


_SIZE_CODES = ("no_model_axis", "size_law_not_fitted", "size_not_learning", "size_budget_past_data")


def refusal_text(reasons) -> str:
    """ "no recommendation: <first>; and <second> ..." ("no size recommendation" for the model-size decision; the
    reason alone for a decision with no recipe to export)."""
    text = "; and ".join(reason_text(reason) for reason in reasons)
    if reasons and reasons[0].code == "no_recipe":  # decided, with nothing to export: the reason says so
        return text
    subject = "size recommendation" if reasons and reasons[0].code in _SIZE_CODES else "recommendation"
    return f"no {subject}: {text}"


def recommendation_notes(rec) -> list[str]:
    """A Recommendation's basis and reasons in words, the optimal-n law's verdict first."""
    return with_words(rec.to_dict())["notes"]


def with_words(payload):
    """The payload with a "text" in each reason ({code, values}) and "notes" in each recommendation (basis, reasons)."""
    if isinstance(payload, list):
        return [with_words(item) for item in payload]
    if not isinstance(payload, dict):
        return payload
    out = {key: with_words(value) for key, value in payload.items()}
    if set(payload) == {"code", "values"} and isinstance(payload["code"], str):
        out["text"] = reason_text(payload)
    if "basis" in payload and "reasons" in payload and "notes" not in payload:
        law = [r for r in payload["reasons"] if r["code"] == "law_not_identified"]
        rest = [r for r in payload["reasons"] if r["code"] != "law_not_identified"]
        out["notes"] = [reason_text(reason) for reason in (*law, payload["basis"], *rest)]
    return out


def _nan_for_none(value):
    if value is None:
        return math.nan
    if isinstance(value, dict):
        return {key: _nan_for_none(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_nan_for_none(item) for item in value]
    return value


def comparison_lines(comparison: dict, *, limit: int = 3) -> list[str]:
    """rules.compare's verdict, then at most `limit` separated pairs (widest first) and a count of the rest."""
    verdict = Reason(comparison["verdict"]["code"], comparison["verdict"]["values"])
    if verdict.code != "variants_separated":
        return [reason_text(verdict)]
    pairs = verdict["pairs"]
    lines = [
        f"{len(pairs)} of {len(comparison['pairs'])} pairs of variants separated beyond the "
        f"{comparison['noise_band']:g} noise band at {comparison['compute']:.4g} (fitted reward)"
        f"{_one_seed(verdict.values)}:"
    ]
    lines += [separated_pair(p) for p in pairs[:limit]]
    if len(pairs) > limit:
        lines.append(f"and {len(pairs) - limit} more (report.md)")
    return lines


def clauses(text: str) -> list[str]:
    """A long message as short clauses: split at '; ' outside parentheses, a leading 'and' dropped."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and text.startswith("; ", index):
            parts.append(text[start:index])
            start = index + 2
    parts.append(text[start:])
    return [part.strip().removeprefix("and ") for part in parts if part.strip()]


_HOW = {"law": "from the optimal-n law", "within_data": "from the runs' fitted rewards there"}


def standing_line(standing) -> str:
    """The runs at a compute: the best, and the others within the noise band (fitted rewards)."""
    best = standing.best
    close = [f"{row['run']} {row['reward']:.3f}" for row in standing.runs[1:] if row["within_band"]]
    others = (
        f"; within the {standing.noise_band:g} noise band of it: {', '.join(close)}"
        if close
        else f"; no other run within the {standing.noise_band:g} noise band"
    )
    ended = ", ".join(f"{row['run']} at {row['c_max']:.4g}" for row in standing.ended_before)
    ended = f"; not read there (their data end before it): {ended}" if ended else ""
    return f"best at {standing.compute:.4g} ({standing.measure}): {best['run']} {best['reward']:.3f}{others}{ended}"


def budget_text(budget: float) -> str:
    """The shortest decimal that reads back as `budget`: a rounded one can fall past the compute a run reached."""
    return repr(float(budget)).removesuffix(".0")


def db_flag(db: str | None) -> str:
    """ " --db URL" (shell-quoted) for a command line: the store `db` names (--db, RLSCALE_DB or ./rlscale.db), a
    SQLite file by its absolute path so that the command reads the same store from any directory; "" for a server
    that RLSCALE_DB names (the command reads it too)."""
    url = command_db_url(db)
    return "" if db is None and not url.lower().startswith("sqlite") else f" --db {shlex.quote(url)}"


def extend_command(study_file, db: str | None, factor: float, out=None) -> str:
    """The sweep command that extends every run of the study to `factor` times its planned compute; `out`: the
    report's directory, named when it is not the default."""
    flag = "" if out is None else f" --out {shlex.quote(os.path.abspath(out))}"
    return f"rlscale sweep {shlex.quote(str(study_file))} --extend {factor:.3g}{db_flag(db)}{flag}"


def shown_path(path: str | None) -> str | None:
    """An existing file's absolute path, as a command line names it so that it runs from any directory; None if gone."""
    return os.path.abspath(path) if path is not None and os.path.isfile(path) else None


def extension_command(decision, db: str | None = None) -> str | None:
    """The sweep that extends the study's runs toward a decision, when it has one and the file it names exists."""
    if decision.next_allocation is None or not decision.planned or shown_path(decision.study_file) is None:
        return None
    # a budget that buys no step is decided by a larger budget, not by longer runs
    if any(reason.code == "budget_buys_no_step" for reason in decision.refusal):
        return None
    return decision_commands(decision, db=db)["extend"]


def refusal_with_next(reasons, command: str | None) -> str:
    """A refusal's reasons, then the command (an extension_command) that would decide, where there is one."""
    text = refusal_text(reasons)
    return f"{text}; to decide it, extend the runs: {command}" if command else text


def decision_commands(decision, *, study_file=None, db: str | None = None, out=None) -> dict:
    """{"export", "evidence", "extend"}: command lines at the decision's exact budget (None where there is none);
    the extension names `study_file`, else the file the study's sweep read if it is still there, else STUDY.yaml,
    and writes its report to `out` (default reports/STUDY)."""
    at = f"--study {shlex.quote(decision.study)} --budget {budget_text(decision.budget)}{db_flag(db)}"
    export = f"rlscale export --format {decision.export_format} {at}" if decision.exportable else None
    evidence = f"rlscale recommend {at}" if decision.recommendation is not None else None
    extend = None
    if decision.next_allocation is not None and decision.planned:
        study_file = os.path.abspath(study_file) if study_file else shown_path(decision.study_file) or "STUDY.yaml"
        out = None if out is None or Path(out) == Path("reports", decision.study) else out
        extend = extend_command(study_file, db, decision.extend * decision.next_allocation.factor, out)
    return {"export": export, "evidence": evidence, "extend": extend}


def export_header(decision) -> list[str]:
    """The header of `rlscale export --study`: which decision the recipe carries, and why."""
    unit = unit_label(decision.unit)
    rec = decision.recommendation
    if rec is not None:
        lo, hi = rec.predicted_interval
        how = _HOW.get(rec.basis.code, "from the best fitted runs (no optimal-n law)")
        return [
            f"rlscale export: the decision of study {decision.study} for {budget_text(decision.budget)} {unit}",
            f"B_p {rec.prompts_per_batch}, n {rec.rollouts} ({how}), M {rec.steps} steps; predicted reward "
            f"{rec.predicted_reward:.3f} [{lo:.3f}, {hi:.3f}] from run {rec.predicted_from}",
        ]
    lines = [
        f"rlscale export: best run of study {decision.study}: {decision.best_run} at "
        f"{budget_text(decision.budget)} {unit}: {reason_text(decision.best)}",
        "the run's own recipe: B_p, n and M as it ran",
    ]
    p = decision.prediction
    if p is not None:
        lines.append(
            f"reward at {decision.budget:.4g}: {p.predicted:.3f} [{p.lo:.3f}, {p.hi:.3f}] ({p.level:.0%} prediction "
            "interval of the mean over the last 10% of compute)"
        )
    else:
        lines.append(f"reward at {decision.budget:.4g}: no prediction interval (too few evaluations)")
    return lines


def decision_lines(decision, commands: dict) -> list[str]:
    """A Decision as sentences, "- " bullets and "  rlscale ..." command lines, the command to run next last."""
    unit = unit_label(decision.unit)
    rec = decision.recommendation
    lines = []
    if rec is not None:
        how = _HOW.get(rec.basis.code, "from the best fitted runs (no optimal-n law)")
        lo, hi = rec.predicted_interval
        predicted = (
            "predicted mean reward over the last 10% of the budget"
            if any(r.code == "prediction_interval" for r in rec.reasons)
            else "predicted reward"
        )
        lines += [
            f"decided: B_p {rec.prompts_per_batch}, n {rec.rollouts}, M {rec.steps:,} steps for "
            f"{rec.budget:.4g} {unit}, {how}",
            f"{predicted} {rec.predicted_reward:.3f} [{lo:.3f}, {hi:.3f}] ({rec.predicted_level:.0%} "
            f"interval), from run {rec.predicted_from}'s curve",
        ]
        if rec.standing is not None:  # the runs at the budget, where it is inside their data
            lines.append(standing_line(rec.standing))
        lines += [f"- {part}" for note in recommendation_notes(rec) for part in clauses(note)]
        lines += [f"- {part}" for reason in decision.refusal for part in clauses(reason_text(reason))]
        if commands.get("export"):
            lines += ["next: the recipe for your framework:", f"  {commands['export']}"]
    elif decision.best is not None:
        lines += [f"decided: the best run, {decision.best_run}: {reason_text(decision.best)}"]
        if decision.standing is not None:
            lines.append(standing_line(decision.standing))
        if decision.prediction is not None:
            p = decision.prediction
            lines.append(
                f"- predicted mean reward over the last 10% of {decision.budget:.4g} {unit}: {p.predicted:.3f} "
                f"[{p.lo:.3f}, {p.hi:.3f}] ({p.level:.0%} interval)"
            )
        lines += [f"- {part}" for reason in decision.refusal for part in clauses(reason_text(reason))]
        if commands.get("export"):
            lines += ["next: the best run's recipe for your framework:", f"  {commands['export']}"]
    elif decision.refusal:
        lines.append(f"not yet: no decision for {budget_text(decision.budget)} {unit}{_budget_basis(decision)}")
        lines += [f"- {part}" for reason in decision.refusal for part in clauses(reason_text(reason))]
    plan = decision.next_allocation
    if plan is None:
        return lines
    if rec is not None:
        lines += [
            f"to decide past {decision.budget:.4g} {unit}: extend every run {plan.factor:g}x to "
            f"{reason_text(plan.goal)}:",
            _extend_line(decision, commands),
        ]
        return lines
    low, high = min(run["compute"] for run in plan.runs), max(run["compute"] for run in plan.runs)
    reach = f"{high:.3g} -> {high * plan.factor:.3g} {unit} each"
    if f"{low:.3g}" != f"{high:.3g}":  # runs imported at different computes
        reach = f"{low:.3g} to {high:.3g} -> {low * plan.factor:.3g} to {high * plan.factor:.3g} {unit}"
    lines.append(f"next: extend every run {plan.factor:g}x ({reach}) to {reason_text(plan.goal)}:")
    lines += [f"- {run['run']}: {run['why']}" for run in plan.runs if run["why"]]
    lines.append(_extend_line(decision, commands))
    return lines


def _budget_basis(decision) -> str:
    """Where the budget lies against the data: a budget past what every run reached asks the law to extrapolate."""
    if decision.budget > decision.compute * (1 + 1e-9) > 0:
        return f", past the {decision.compute:.4g} the runs reached"
    return ""


def _extend_line(decision, commands: dict) -> str:
    if commands.get("extend"):
        return f"  {commands['extend']}"
    if decision.trials:
        return "- a sweep does not extend Optuna's trials: sweep a study with more steps in its recipe"
    return "- a study imported from logs: train its runs further, then `rlscale import` their logs again"
