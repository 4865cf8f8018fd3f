"""`rlscale recommend --budget B`: the (B_p, n, M) to spend a production budget on, with the evidence."""

import typer

from rlscale.base.errors import UserError
from rlscale.base.names import check_budget, check_steps
from rlscale.base.numbers import NOISE_BAND
from rlscale.cli.console import bullet, console, print_json, safe, say, table
from rlscale.cli.options import MAX_BOOTSTRAP, DbUrl


def register(app: typer.Typer) -> None:
    @app.command("recommend")
    def recommend(
        budget: float = typer.Option(
            ..., "--budget", help=("target compute, in the study's unit (GPU-hours by default)")
        ),
        study: str = typer.Option(
            None, "--study", help=("the IsoCompute study to learn from (default: the only one that varies rollouts)")
        ),
        db: DbUrl = None,
        profile: str = typer.Option(
            None,
            "--profile",
            help=(
                "cost profile for steps past the runs' data (default: the chosen run's own compute per step, "
                "else one calibrated on the study's records)"
            ),
        ),
        bootstrap: int = typer.Option(
            100,
            "--bootstrap",
            min=0,
            max=MAX_BOOTSTRAP,
            help="bootstrap draws for the model-size law's intervals (a `model` axis)",
        ),
        json_out: bool = typer.Option(False, "--json", help="print JSON"),
    ) -> None:
        """Tune n by the optimal-n law, take the smallest stable B_p within noise of the best, give the rest to M.

        A study with a `model` axis instead gets the model size for the budget (the power law across sizes) and
        the crossover budgets where a larger size starts to win.

        Exit 0 with a recommendation; exit 2 when it refuses (the law or the fits are not identified, or the
        input is bad), with the reason on stderr and, where runs extended by a sweep would decide, that sweep's
        command (and {"refused": true, "reason": ..., "extend": COMMAND or null, "reasons": [{code, values}, ...]}
        on stdout with --json).
        """
        from rlscale.db.store import Store
        from rlscale.fitting.rules.reasons import Reason, Refusal
        from rlscale.fitting.stored import pick_study, recommend_size_study, study_decision, sweeps_models
        from rlscale.views.wording import extension_command, refusal_with_next

        check_budget(budget)
        store = Store(db, create=False)
        name = pick_study(store, study)
        decision = None
        try:
            if sweeps_models(store, name):  # a `model` axis: the size for the budget, by the power law across sizes
                choice = recommend_size_study(store, name, budget, bootstrap=bootstrap)
                if json_out:
                    print_json({"study": name, "refused": False, **choice.to_dict()})
                else:
                    show_size(choice, name)
                return
            decision = study_decision(store, name, budget=budget, profile=profile)  # the one decision, at this budget
            if decision is None:
                raise Refusal(Reason("no_evaluations", {"study": name}))
            if decision.kind != "allocation":
                raise Refusal(Reason("one_rollouts_value", {"study": name, "values": 1}))
            if decision.recommendation is None:
                raise Refusal(*decision.refusal)
            rec = decision.recommendation
        except Refusal as refusal:
            extend = None
            if decision is not None and decision.kind == "allocation" and decision.refusal:  # and what would decide
                extend = extension_command(decision, db)
            said = refusal_with_next(refusal.reasons, extend)
            if json_out:
                print_json({"study": name, "budget": budget, "reason": said, "extend": extend, **refusal.to_dict()})
            raise UserError(said, field=f"study {name}") from None
        check_steps(rec.steps)
        if json_out:
            print_json({"study": name, "refused": False, **rec.to_dict()})
            return
        show(rec, name, decision.unit)


def show(rec, study: str, unit: str) -> None:
    """Rich tables: the allocation, then the runs it rests on (80 columns hold them); the law and notes in short
    lines."""
    from rlscale.cli.views import cli_reason
    from rlscale.fitting.curves import unit_label
    from rlscale.views.wording import law_formula, recommendation_notes

    from_law = rec.basis.code == "law"
    n_from = "n* from the law [95%]" if from_law else "n from"
    allocation = (
        str(rec.prompts_per_batch),
        str(rec.rollouts),
        str(rec.steps),
        f"{rec.n_star:.0f} [{rec.n_star_interval[0]:.0f}, {rec.n_star_interval[1]:.0f}]"
        if from_law
        else "runs at the budget"
        if rec.basis.code == "within_data"
        else "best fitted runs",
        f"{rec.predicted_reward:.3f} [{rec.predicted_interval[0]:.3f}, {rec.predicted_interval[1]:.3f}]",
    )
    columns = ("B_p", "n", "M steps", n_from, f"predicted reward [{rec.predicted_level:.0%}]")
    console.print(table(f"recommendation for {rec.budget:g} {unit_label(unit)} ({safe(study)})", columns, [allocation]))
    measure = (
        f"the best fitted reward at {rec.budget:.4g} (the runs reached it)"
        if rec.basis.code == "within_data"
        else "the best A"
    )
    evidence = table(
        f"evidence: runs at n = {rec.evidence[0]['rollouts'] if rec.evidence else '-'}",
        ("run", "B_p", "A [95%]", "ident.", "trunc.", "near best", "chosen"),
        caption=f"ident.: A identified; trunc.: truncation rate; near best: within {NOISE_BAND:g} of "
        f"{measure}; *: chosen",
        wrap=("run",),
        fold=True,
    )
    reasons = []
    for row in rec.evidence:
        if not row["identified"]:
            reasons.append(f"({len(reasons) + 1}) {row['run']}: not identified: {cli_reason(row['reason'])}")
        evidence.add_row(
            safe(row["run"]),
            str(row["prompts_per_batch"]),
            f"{row['A']:.3f} [{row['A_lo']:.3f}, {row['A_hi']:.3f}]",
            "yes" if row["identified"] else f"no ({len(reasons)})",
            "-" if row["truncation_rate"] != row["truncation_rate"] else f"{row['truncation_rate']:.1%}",
            "yes" if row["within_noise_of_best"] else "no",
            "*" if row["chosen"] else "",
        )
    console.print(evidence)
    for line in reasons:
        say(line, rest="    ")
    law = rec.law
    if rec.law_identified:
        say(
            f"law: log2 n* = {law_formula(law)}; observed {law['compute_min']:.3g} to {law['compute_max']:.3g}; the "
            f"budget is {rec.extrapolation:.1f}x beyond",
            rest="  ",
        )
    say(
        "frontier: "
        + ", ".join(
            f"n={s['rollouts']} (B_p {s['prompts_per_batch']}) {s['compute_from']:.3g} to {s['compute_to']:.3g}"
            for s in law["frontier"]
        ),
        rest="  ",
    )
    for note in recommendation_notes(rec):
        bullet(note)


def show_size(choice, study: str) -> None:
    """The model size for the budget: each size's predicted reward, then the crossover budgets."""
    level = f"{choice.level:.0%}"
    rows = (
        (
            safe(row["model"]),
            f"{row['parameters']:.3g}",
            f"{row['reward']:.3f} [{row['reward_lo']:.3f}, {row['reward_hi']:.3f}]",
            "*" if row["model"] == choice.model else "",
        )
        for row in choice.predicted
    )
    columns = ("model", "params", f"reward at budget [{level}]", "chosen")
    console.print(table(f"model size for {choice.budget:g} ({safe(study)})", columns, rows, fold=True))
    say(f"chosen: {choice.model} (picked in {choice.pick_share:.0%} of the bootstrap draws)", rest="  ")
    for c in choice.crossovers:
        say(
            f"crossover: {c['above']} beats {c['below']} above {c['budget']:.3g} "
            f"[{level}: {c['budget_lo']:.3g}, {c['budget_hi']:.3g}]"
            f"{'' if c['identified'] else ' (not identified)'}"
            f"{'' if c['measured'] else ' (past the data: extrapolated)'}",
            rest="  ",
        )
    if not choice.crossovers:
        say("crossover: none; one size has the lowest loss at every budget", rest="  ")
    for note in choice.notes:
        bullet(note)
