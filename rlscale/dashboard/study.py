"""One study as the dashboard shows it: read from the store, fitted on the fly, rebuilt only when it changed.

A study's page is rebuilt when the store's stamp for it moves (a record or a run's status). Each run is refitted
only when its evaluations change (cached by their count and last step), the optimal-n law only when a fit changed,
and the decision only when a run's status did, so a refresh while a sweep runs costs one fit.
"""

import threading
import time

import pandas as pd
import yaml

from rlscale.fitting.curves import compute_column, fitted, run_curves, study_unit, unit_label
from rlscale.fitting.sigmoid.points import fits_record_breaking, fitted_points_label
from rlscale.fitting.sigmoid.runs import run_labels
from rlscale.planner.study_file import stored_study
from rlscale.runner.sweep.state import planned_gpu_hours, run_states
from rlscale.views.page import StudyPage
from rlscale.views.page_charts import color_index, curve_chart, frontier_chart

BOOTSTRAP = 100  # draws per run fit: the band on each curve (as the sweep's own fits)
LAW_EVERY_S = 10.0  # the optimal-n law is refitted at most this often while records arrive


class StudyView:
    """The page of one study, kept between requests; `refresh` is safe from several request threads."""

    def __init__(self, name: str, db: str | None = None):
        self.name, self.db = name, db  # db: the --db the page's commands carry (None: the default store)
        self.stamp: str | None = None
        self._seen: str | None = None  # the store's stamp and the decisions' count the page was built on
        self.page: StudyPage | None = None
        self._fits: dict[int, tuple] = {}  # run_id -> ((evaluations, last step), curve row, draws)
        self._law: tuple = (None, None)  # (the fits' keys, RolloutsLaw or None)
        self._law_when, self._law_due = 0.0, None  # when it was fitted; when a refit held back is due
        self._law_fits = 0  # part of the stamp: a refit held back and done later changes the page
        # the decision refits every run with its bootstrap (tens of seconds on 2 cores): worked out on a thread of
        # its own when a run's status changes; the page shows the last one meanwhile
        self._decision: tuple = (None, None)  # (the runs' statuses it is for, decision)
        self._deciding = None  # the key being worked out
        self._decided = 0  # how many decisions were worked out: part of the stamp, so pages pick a new one up
        self._lock = threading.Lock()

    def refresh(self, store) -> tuple[str, StudyPage]:
        """(stamp, page), rebuilt if the store's stamp for the study moved since the last call."""
        with self._lock:
            # read first: a write after this moves it again
            seen = "-".join(map(str, store.study_stamp(self.name))) + f"-d{self._decided}"
            due = self._law_due is not None and time.monotonic() >= self._law_due
            if seen != self._seen or self.page is None or due:
                self.page = self._build(store)
                self._seen = seen
            self.stamp = f"{seen}-l{self._law_fits}"
            return self.stamp, self.page

    def _build(self, store) -> StudyPage:
        typed = stored_study(store, self.name)
        runs, records = store.runs_frame(self.name), store.records_frame(self.name)
        unit, compute_col = study_unit(typed), compute_column(typed)
        metric = typed.metric if typed is not None else "val_reward"
        runs = runs.assign(label=run_labels(runs))
        label_of = dict(zip(runs["run_id"], runs["label"]))
        evaluated = records[pd.to_numeric(records[metric], errors="coerce").notna()].copy() if len(records) else records
        evaluated["run"] = evaluated["run_id"].map(label_of)
        curves, draws = self._curves(runs, evaluated, compute_col, metric, fits_record_breaking(typed))
        states = run_states(runs.drop(columns=["label"]), records, planned_gpu_hours(typed))
        page = StudyPage(
            study=self.name,
            method=typed.method if typed is not None else "imported",
            unit=unit,
            description=typed.description if typed is not None else "",
            fitted_on=fitted_points_label(fits_record_breaking(typed)),
        )
        fit_of = {row["run_id"]: row for row in curves.to_dict("records")}
        for position, state in enumerate(states):
            fit = fit_of.get(state.run_id, {})
            page.runs.append(
                {
                    "run": label_of[state.run_id],
                    "color": color_index(position),
                    "status": state.status,
                    "note": state.note,
                    "step": state.step,
                    "compute": state.gpu_hours,
                    "planned": state.planned_gpu_hours,
                    "reward": state.val_reward,
                    **{k: fit.get(k) for k in ("A", "A_lo", "A_hi", "B", "C_mid", "R0", "r2", "n_points", "reason")},
                    "identified": bool(fit.get("identified", False)),
                }
            )
        page.flight = {
            "running": [[label_of[s.run_id], s.note.removeprefix("on ")] for s in states if s.status == "running"],
            "queued": sum(s.status in ("pending", "paused") for s in states),
            "counts": {status: sum(s.status == status for s in states) for status in ("done", "stopped", "failed")},
        }
        page.stopped = [{"run": label_of[s.run_id], "reason": s.note} for s in states if s.status == "stopped"]
        page.rule = _rule_words(typed)
        page.curves = curve_chart(
            evaluated,
            curves,
            compute_col=compute_col,
            reward_col=metric,
            draws=draws,
            unit_label=unit_label(unit),
            reward_label=metric.replace("_", " "),
        )
        law = self._rollouts_law(curves)
        if law is not None:
            page.law = law.to_dict()
            page.frontier = frontier_chart(law, unit_label=unit_label(unit))
        page.decision = self._cached_decision(store, typed, runs)
        return page

    def _curves(
        self, runs: pd.DataFrame, evaluated: pd.DataFrame, compute_col: str, metric: str, record_breaking: bool
    ) -> tuple[pd.DataFrame, dict]:
        """Every run's curve row (rules.recommend.run_curves) and bootstrap draws; refitted only when changed."""
        rows, draws = [], {}
        for run in runs.to_dict("records"):
            mine = evaluated[evaluated["run_id"] == run["run_id"]]
            key = (len(mine), int(mine["step"].max()) if len(mine) else -1, run["label"])
            cached = self._fits.get(run["run_id"])
            if cached is None or cached[0] != key:
                # the run's study-wide label as its name, so the fit and its draws carry it
                one = pd.DataFrame([{**run, "run": run["label"]}]).drop(columns=["seed", "label"])
                curve, got = run_curves(
                    mine.drop(columns=["run"]),
                    one,
                    compute_col=compute_col,
                    reward_col=metric,
                    record_breaking=record_breaking,
                    bootstrap=BOOTSTRAP,
                )
                cached = self._fits[run["run_id"]] = (key, curve.iloc[0].to_dict(), got.get(run["label"]))
            rows.append({**cached[1], "status": run["status"]})
            if cached[2] is not None:
                draws[run["label"]] = cached[2]
        return pd.DataFrame(rows), draws

    def _rollouts_law(self, curves: pd.DataFrame):
        """The optimal-n law over the fitted runs (no bootstrap: the chart draws the point estimate), or None;
        refitted at most every LAW_EVERY_S while records arrive (its multi-start fit is most of a rebuild)."""
        from rlscale.fitting.laws.optimal_n import fit_optimal_rollouts

        key = tuple(entry[0] for entry in self._fits.values())
        if self._law[0] == key:
            self._law_due = None
            return self._law[1]
        now = time.monotonic()
        if self._law[0] is not None and now < self._law_when + LAW_EVERY_S:
            self._law_due = self._law_when + LAW_EVERY_S  # refresh() rebuilds then, records or not
            return self._law[1]
        usable = fitted(curves) if len(curves) else curves
        law = None
        if len(usable) and usable["rollouts"].nunique() >= 2:
            try:
                law = fit_optimal_rollouts(usable, bootstrap=0)
            except ValueError:  # no frontier yet: every run still near its start
                law = None
        self._law, self._law_when, self._law_due = (key, law), now, None
        self._law_fits += 1
        return law

    def _cached_decision(self, store, typed, runs) -> dict | None:
        """The last decision worked out; a new one is started when the runs' statuses moved since."""
        key = tuple(zip(runs["run_id"], runs["status"]))
        if self._decision[0] != key and self._deciding is None:
            self._deciding = key

            def work():
                from rlscale.db.store import Store

                try:
                    # a store of its own: the app may close its store (Ctrl-C) while this one still reads
                    with Store(store.url.render_as_string(hide_password=False), read_only=True) as own:
                        decision = study_decision(own, self.name, typed, db=self.db)
                except Exception as err:  # the page says so; the next status change tries again
                    decision = {"verdict": "not yet", "lines": [f"no decision: {type(err).__name__}: {err}"]}
                self._decision, self._deciding = (key, decision), None
                self._decided += 1

            threading.Thread(target=work, name=f"decide-{self.name}", daemon=True).start()
        decision = self._decision[1]
        if self._decision[0] != key:
            working = "working out the decision for the runs as they are now (it refits every run)"
            decision = (
                {**decision, "lines": [*decision["lines"], f"- {working}"]}
                if decision
                else {"verdict": "not yet", "lines": [working[0].upper() + working[1:] + "..."]}
            )
        return decision


def _rule_words(typed) -> str:
    """The study's early-termination rule in words ("" for none)."""
    rule = None if typed is None else typed.early_terminate
    if rule is None or rule.type == "none":
        return "none (every run goes to its planned compute)"
    if rule.type == "asymptote":
        return (
            f"asymptote: runs pause at {', '.join(f'{r:g}' for r in rule.rungs)} of their compute; one is stopped "
            f"when its A's upper bound is below the best run's A less {rule.margin:g}"
        )
    return f"hyperband: keep 1/{rule.eta} of the runs at each rung, from {rule.min_fraction:g} of the steps"


def study_decision(store, study: str, typed, *, db: str | None = None) -> dict | None:
    """The decision as `rlscale sweep` prints it at its end, as the page shows it: {verdict, lines} (views/page.py);
    None before any run is evaluated. The one place the dashboard asks fitting for a decision: fitting.rules.decision's
    Decision, worded by rlscale.views.wording as in the terminal."""
    from rlscale.fitting.stored import study_decision as decide
    from rlscale.views.wording import decision_commands, decision_lines

    decision = decide(store, study, extend=getattr(typed, "extend", 1.0))
    if decision is None:
        return None
    lines = decision_lines(decision, decision_commands(decision, db=db))
    recipe = yaml.safe_dump(decision.recipe, sort_keys=False).strip() if decision.recipe else None
    return {
        "verdict": "decided" if decision.decided else "not yet",
        "lines": lines,
        "recipe": recipe,
    }
