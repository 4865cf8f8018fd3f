"""One study's fit of record and Decision for the dashboard, kept between requests; pages get the parts that changed."""

import json
import secrets
import threading
import time

import numpy as np
import pandas as pd
import yaml

from rlscale.fitting.curves import FitMemo, latest_runs, unit_label
from rlscale.fitting.rules.reasons import Refusal
from rlscale.fitting.rules.standing import count_or_none, fitted_rewards
from rlscale.fitting.sigmoid.points import fits_record_breaking, fitted_points_label
from rlscale.fitting.sigmoid.runs import run_labels
from rlscale.fitting.stored import fits_from_frames
from rlscale.planner.study_file import stored_study
from rlscale.runner.sweep.state import planned_gpu_hours, run_states
from rlscale.views.page import StudyPage, live_sections, page_data
from rlscale.views.page_charts import color_index, default_group, frontier_chart, number, parallel_axes, run_points
from rlscale.views.page_charts import study_axes as axes_of

LAW_EVERY_S = 10.0  # the optimal-n law is refitted at most this often while records arrive
DECIDE_EVERY_S = 30.0  # the decision is worked out again at most this often while only records arrive
FIT_KEYS = ("A", "A_lo", "A_hi", "B", "C_mid", "R0", "r2", "c_min", "c_max")


class StudyRecords:
    """Records read whole once, then by id since; whole again when the count misses the stamp's (rerun, late commit)."""

    def __init__(self):
        self.frame: pd.DataFrame | None = None
        self.last_id = 0
        self.reads = {"whole": 0, "added": 0}  # how each read went (a test reads it)

    def read(self, store, study: str, stamp: tuple) -> pd.DataFrame:
        count, last_id = int(stamp[2]), stamp[3]
        last_id = int(last_id) if last_id is not None else 0
        if self.frame is not None and last_id >= self.last_id:
            added = store.records_frame(study, after_id=self.last_id, until_id=last_id)
            merged = pd.concat([self.frame, added], ignore_index=True) if len(added) else self.frame
            if len(merged) == count:
                self.frame, self.last_id = merged, last_id
                self.reads["added"] += 1
                return merged
        self.frame = store.records_frame(study, until_id=last_id)
        self.last_id = last_id
        self.reads["whole"] += 1
        return self.frame


class StudyView:
    """The page of one study, kept between requests; `refresh` and `changes` are safe from several request threads."""

    def __init__(self, name: str, db: str | None = None):
        self.name, self.db = name, db  # db: the --db the page's commands carry (None: the default store)
        self.key = secrets.token_hex(4)  # a stamp this view did not give (an earlier server's) gets every part
        self.version = 0  # one more at each rebuild; a stamp names the version a page has
        self.stamp: str | None = None
        self.page: StudyPage | None = None
        self.memo = FitMemo()
        self.records = StudyRecords()
        self._seen: tuple | None = None  # the store's stamp and the decisions' count the page was built on
        self._parts: dict[str, tuple[int, object, str]] = {}  # part -> (version it last changed, value, its JSON)
        self._planned: tuple = (None, {})  # (the spec it is for, planned GPU-hours by run name)
        self._run_states: dict[int, tuple] = {}  # run_id -> (its row's status, note and progress, RunState)
        self._law: tuple = (None, None)  # (the fits' keys, RolloutsLaw or None)
        self._law_when, self._law_due = 0.0, None  # when it was fitted; when a refit held back is due
        # the decision's bootstrapped law takes seconds: a thread works it out; the page shows the last one meanwhile
        self._decision: tuple = (None, None, None)  # ((the runs' statuses, records) it is for, Decision, its words)
        self._deciding = None  # the key being worked out
        self._decide_when, self._decide_due = 0.0, None  # when the last one started; when one held back is due
        self._decided = 0  # how many decisions were worked out: a new one rebuilds the page
        self._lock = threading.Lock()

    def refresh(self, store) -> tuple[str, StudyPage]:
        """(stamp, page), rebuilt if the store's stamp for the study moved since the last call."""
        with self._lock:
            # read first: a write after this moves it again
            stamp = tuple(store.study_stamp(self.name))
            swept = store.study_is_swept(self.name)  # a driver killed with -9 writes nothing: asked each time
            seen = (stamp, self._decided, swept)
            now = time.monotonic()
            due = any(when is not None and now >= when for when in (self._law_due, self._decide_due))
            if seen != self._seen or self.page is None or due:
                self.page = self._build(store, stamp, swept)
                self._seen = seen
                self._publish(self.page)
            return self.stamp, self.page

    def changes(self, since: str | None) -> dict:
        """The parts a page at stamp `since` lacks: {stamp, full, sections?, meta?, order?, runs?, frontier?}, each key
        only when its part changed since (every part, and full, for a stamp this view did not give)."""
        with self._lock:
            version = self._version_of(since)
            payload: dict = {"stamp": self.stamp, "full": version == 0}
            for name, (changed, value, _) in self._parts.items():
                if changed <= version:
                    continue
                kind, _, key = name.partition(":")
                if kind == "run":
                    payload.setdefault("runs", {})[key] = value
                elif kind == "section":
                    payload.setdefault("sections", {})[key] = value
                else:
                    payload[kind] = value
            return payload

    def _version_of(self, since: str | None) -> int:
        key, _, version = (since or "").partition(".")
        return int(version) if key == self.key and version.isdigit() and int(version) <= self.version else 0

    def _publish(self, page: StudyPage) -> None:
        data = page_data(page)
        parts = {f"section:{key}": html for key, html in live_sections(page).items()}
        parts.update(meta=data["meta"], order=data["order"], frontier=data["frontier"])
        parts.update({f"run:{key}": row for key, row in data["runs"].items()})
        texts = {name: json.dumps(value, sort_keys=True) for name, value in parts.items()}
        changed = [name for name, text in texts.items() if self._parts.get(name, (0, None, None))[2] != text]
        gone = set(self._parts) - set(parts)  # a run superseded by a rerun
        if self.stamp is not None and not changed and not gone:
            return
        self.version += 1
        for name in changed:
            self._parts[name] = (self.version, parts[name], texts[name])
        for name in gone:
            del self._parts[name]
        self.stamp = f"{self.key}.{self.version}"

    def _build(self, store, stamp: tuple, swept: bool | None = None) -> StudyPage:
        typed = stored_study(store, self.name)
        # the runs of the study as its fit of record reads them (a rerun supersedes the attempt before it)
        runs = latest_runs(store.runs_frame(self.name)).reset_index(drop=True)
        records = self.records.read(store, self.name, stamp)
        self.memo.size = 2 * len(runs) + 16
        try:
            fits = fits_from_frames(self.name, typed, runs, records, cache=self.memo)
        except Refusal:  # no run evaluated yet
            fits = None
        metric = typed.metric if typed is not None else "val_reward"
        page = StudyPage(
            study=self.name,
            method=typed.method if typed is not None else "imported",
            unit=fits.unit if fits is not None else "gpu_hours",
            description=typed.description if typed is not None else "",
            fitted_on=fitted_points_label(fits_record_breaking(typed)),
            reward_label=metric.replace("_", " "),
        )
        states = self._states(runs, records, self._planned_gpu_hours(typed))
        labels = dict(zip(runs["run_id"], run_labels(runs)))
        decision = self._cached_decision(fits, runs)
        page.decision = self._decision_words(runs)
        budget = decision.budget if decision is not None and decision.budget > 0 else None
        axes = axes_of(typed, runs)
        page.runs = self._rows(states, labels, fits, budget, axes)
        budget_label = f"fitted reward at {budget:.4g} {unit_label(page.unit)}" if budget else None
        page.axes, page.group = parallel_axes(axes, page.runs, budget_label), default_group(axes)
        page.flight = {
            "running": [[labels[s.run_id], s.note.removeprefix("on ")] for s in states if s.status == "running"],
            "queued": sum(s.status in ("pending", "paused") for s in states),
            "counts": {status: sum(s.status == status for s in states) for status in ("done", "stopped", "failed")},
            "swept": swept,  # False: the runs marked running were left by a sweep that ended
        }
        page.stopped = [{"run": labels[s.run_id], "reason": s.note} for s in states if s.status == "stopped"]
        page.rule = _rule_words(typed)
        law = self._rollouts_law(fits.curves if fits is not None else None)
        if law is not None:
            page.law = law.to_dict()
            page.frontier = frontier_chart(law, unit_label=unit_label(page.unit))
        return page

    def _states(self, runs: pd.DataFrame, records: pd.DataFrame, planned: dict) -> list:
        progress = records.groupby("run_id")["step"].agg(["count", "max"]) if len(records) else pd.DataFrame()
        seen = {run_id: tuple(row) for run_id, row in zip(progress.index, progress.to_numpy().tolist())}
        keys = [
            (status, error if isinstance(error, str) else None, seen.get(run_id), planned.get(name))
            for run_id, status, error, name in zip(runs["run_id"], runs["status"], runs["error"], runs["run"])
        ]
        moved = [key != self._run_states.get(run_id, (None,))[0] for run_id, key in zip(runs["run_id"], keys)]
        if any(moved):
            changed = runs[moved]
            mine = records[records["run_id"].isin(changed["run_id"])] if len(records) else records
            again = run_states(changed, mine, planned)
            for run_id, key, state in zip(changed["run_id"], [k for k, m in zip(keys, moved) if m], again):
                self._run_states[run_id] = (key, state)
        return [self._run_states[run_id][1] for run_id in runs["run_id"]]

    def _rows(self, states, labels, fits, budget, axes: dict[str, list]) -> list[dict]:
        curves = {row["run_id"]: row for row in fits.curves.to_dict("records")} if fits is not None else {}
        at_budget = {}
        if budget is not None and fits is not None:
            at_budget = dict(zip(fits.curves["run_id"], fitted_rewards(fits.curves, budget)))
        evaluations = _by_run(fits.records, fits.compute_col, fits.metric) if fits is not None else {}
        rows = []
        for position, state in enumerate(states):
            fit = curves.get(state.run_id, {})
            mine = evaluations.get(state.run_id, ([], []))
            points = run_points(*mine)
            rewards = np.asarray(mine[1], dtype=float)
            rewards = rewards[np.isfinite(rewards)]
            rows.append(
                {
                    "id": int(state.run_id),
                    "run": labels[state.run_id],
                    "color": color_index(position),
                    "status": state.status,
                    "note": state.note,
                    "step": state.step,
                    "compute": number(state.gpu_hours),  # against the plan, which is in GPU-hours
                    "planned": number(state.planned_gpu_hours),
                    "reward": number(rewards[-1]) if rewards.size else None,  # the study's metric, as fitted
                    "axes": {key: values[position] for key, values in axes.items()},
                    **{key: number(fit.get(key)) for key in FIT_KEYS},
                    "n_points": count_or_none(fit.get("n_points")),
                    "identified": bool(fit.get("identified", False)),
                    "reason": fit.get("reason") if isinstance(fit.get("reason"), str) else None,
                    "at_budget": number(at_budget.get(state.run_id)),
                    **points,
                }
            )
        return rows

    def _planned_gpu_hours(self, typed) -> dict:
        spec = typed.to_spec() if typed is not None else None
        if self._planned[0] != spec:
            self._planned = (spec, planned_gpu_hours(typed))
        return self._planned[1]

    def _rollouts_law(self, curves):
        from rlscale.fitting.curves import fitted
        from rlscale.fitting.laws.optimal_n import fit_optimal_rollouts

        key = None if curves is None else str(curves[["run_id", "n_points", "c_max", "A"]].to_numpy().tolist())
        if self._law[0] == key:
            self._law_due = None
            return self._law[1]
        now = time.monotonic()
        if self._law[0] is not None and now < self._law_when + LAW_EVERY_S:
            self._law_due = self._law_when + LAW_EVERY_S  # refresh() rebuilds then, records or not
            return self._law[1]
        usable = fitted(curves) if curves is not None and len(curves) else None
        law = None
        if usable is not None and len(usable) and usable["rollouts"].nunique() >= 2:
            try:
                law = fit_optimal_rollouts(usable, bootstrap=0)  # the chart draws the point estimate
            except ValueError:  # no frontier yet: every run still near its start
                law = None
        self._law, self._law_when, self._law_due = (key, law), now, None
        return law

    def _cached_decision(self, fits, runs):
        # worked out again at a run's new status at once, and at new evaluations at most every DECIDE_EVERY_S
        key = (tuple(zip(runs["run_id"], runs["status"])), 0 if fits is None else len(fits.records))
        last, now = self._decision[0], time.monotonic()
        self._decide_due = None
        if last == key or self._deciding is not None:
            return self._decision[1]
        if last is not None and last[0] == key[0] and now < self._decide_when + DECIDE_EVERY_S:
            self._decide_due = self._decide_when + DECIDE_EVERY_S  # refresh() rebuilds then, records or not
            return self._decision[1]
        self._deciding, self._decide_when = key, now
        thread = threading.Thread(target=self._decide, args=(fits, key), name=f"decide-{self.name}", daemon=True)
        thread.start()
        return self._decision[1]

    def _decide(self, fits, key) -> None:
        from rlscale.fitting.rules.decision import decide

        try:
            decision = None if fits is None else decide(fits, extend=getattr(fits.spec, "extend", None) or 1.0)
            words = decision_words(decision, db=self.db)
        except Exception as err:  # the page says so; the next status change or evaluations try again
            decision, words = None, {"verdict": "not yet", "lines": [f"no decision: {type(err).__name__}: {err}"]}
        self._decision, self._deciding = (key, decision, words), None
        self._decided += 1

    def _decision_words(self, runs) -> dict | None:
        statuses = tuple(zip(runs["run_id"], runs["status"]))
        words = self._decision[2]
        if self._decision[0] is None or self._decision[0][0] != statuses:  # new evaluations alone: said when due
            working = "working out the decision for the runs as they are now"
            words = (
                {**words, "lines": [*words["lines"], f"- {working}"]}
                if words
                else {"verdict": "not yet", "lines": [working[0].upper() + working[1:] + "..."]}
            )
        return words


def _by_run(records: pd.DataFrame, compute_col: str, metric: str) -> dict:
    ids = records["run_id"].to_numpy()
    order = np.argsort(ids, kind="stable")
    compute = records[compute_col].to_numpy(float)[order]
    reward = pd.to_numeric(records[metric], errors="coerce").to_numpy(float)[order]
    keys, starts = np.unique(ids[order], return_index=True)
    ends = [*starts[1:], len(order)]
    return {key: (compute[a:b], reward[a:b]) for key, a, b in zip(keys.tolist(), starts, ends)}


def _rule_words(typed) -> str:
    rule = None if typed is None else typed.early_terminate
    if rule is None or rule.type == "none":
        return "none (every run goes to its planned compute)"
    if rule.type == "asymptote":
        margin = "the noise band" if rule.margin is None else f"{rule.margin:g}"
        return (
            f"asymptote: runs pause at {', '.join(f'{r:g}' for r in rule.rungs)} of their compute; one is stopped "
            f"when its A's upper bound is below the best run's A less {margin}"
        )
    return f"hyperband: keep 1/{rule.eta} of the runs at each rung, from {rule.min_fraction:g} of the steps"


def decision_words(decision, *, db: str | None = None) -> dict | None:
    """{verdict, lines, recipe} for the page, the lines as `rlscale sweep` prints them; None for no decision."""
    from rlscale.views.wording import decision_commands, decision_lines

    if decision is None:
        return None
    recipe = yaml.safe_dump(decision.recipe, sort_keys=False, allow_unicode=True).strip() if decision.recipe else None
    return {
        "verdict": "decided" if decision.decided else "not yet",
        "lines": decision_lines(decision, decision_commands(decision, db=db)),
        "recipe": recipe,
    }


def study_decision(store, study: str, typed, *, db: str | None = None, cache=None) -> dict | None:
    """decision_words of fitting.stored.study_decision, the one the dashboard asks for; None before any evaluation."""
    from rlscale.fitting.stored import study_decision as decide

    return decision_words(decide(store, study, extend=getattr(typed, "extend", 1.0), cache=cache), db=db)
