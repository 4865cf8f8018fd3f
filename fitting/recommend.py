"""The next allocation (B_p, n, M) for a target budget, following the IsoCompute Playbook.

Tune n first (the optimal-n law), take the smallest B_p whose asymptote is within the noise band of the
best and that trained stably (ScaleRL: truncation rate < 5%), give the rest of the budget to steps M.
Refuses (Refusal, with the reason) when the evidence cannot support the decision; `next_allocation` then says
which runs to extend, to what compute, to identify the fits and the law.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from rlscale.base.numbers import NOISE_BAND
from rlscale.fitting.bootstrap import percentile_interval
from rlscale.fitting.frame import run_labels
from rlscale.fitting.optimal_n import RolloutsLaw
from rlscale.fitting.records import fits_record_breaking, record_breaking_points
from rlscale.fitting.sigmoid import FitError, fit_sigmoid

MAX_TRUNCATION = 0.05  # ScaleRL: stable runs keep the truncation rate below 5%
MAX_EXTEND = 8.0  # the most one extension multiplies a run's compute by: beyond it, plan a new study
CURVE_COLUMNS = ["run_id", "run", "prompts_per_batch", "rollouts", "status", "A", "B", "C_mid", "R0", "A_lo", "A_hi",
                 "r2", "n_points", "identified", "reason", "c_min", "c_max", "truncation_rate"]


class Refusal(Exception):
    """The data cannot support a recommendation; str() is the reason a user reads."""


def run_geometry(runs: pd.DataFrame) -> pd.DataFrame:
    """runs with prompts_per_batch and rollouts columns, taken from each run's `config` when not given."""
    runs = runs.copy()
    for key in ("prompts_per_batch", "rollouts"):
        if key not in runs.columns:
            runs[key] = [(cfg or {}).get(key) for cfg in runs.get("config", [None] * len(runs))]
    return runs


def late_truncation_rate(records: pd.DataFrame) -> float:
    """Mean truncation rate over the last quarter of a run's records (where a crashing run climbs); NaN if unrecorded."""
    if "truncation_rate" not in records.columns:
        return float("nan")
    rates = pd.to_numeric(records.sort_values("step")["truncation_rate"], errors="coerce").dropna().to_numpy()
    if rates.size == 0:
        return float("nan")
    return float(rates[-max(1, rates.size // 4):].mean())


def run_curves(records: pd.DataFrame, runs: pd.DataFrame, *, compute_col: str = "gpu_hours",
               reward_col: str = "val_reward", record_breaking: bool = True, bin_width: float = 0.01,
               min_compute: float = 0.0, bootstrap: int = 100, seed: int = 0) -> tuple[pd.DataFrame, dict]:
    """Per-run sigmoid fits for the optimal-n law and recommend: (curves, draws).

    curves: one row per run (CURVE_COLUMNS); runs that cannot be fitted keep NaN parameters and the reason.
    draws: {run: (m, 4) bootstrap (A, B, C_mid, R0)}. Fits use the record-breaking points (IsoCompute) when
    record_breaking is set. Runs are keyed by run_id when both frames have it, else by name.
    """
    runs = run_geometry(runs)
    key = "run_id" if "run_id" in runs.columns and "run_id" in records.columns else "run"
    runs["label"] = run_labels(runs)
    rows, draws = [], {}
    for run in runs.to_dict("records"):
        mine = records[records[key] == run[key]]
        mine = mine[np.isfinite(pd.to_numeric(mine[reward_col], errors="coerce").astype(float))]
        compute = mine[compute_col].to_numpy(float)
        reward = mine[reward_col].to_numpy(float)
        label = run["label"]
        row = {"run_id": run.get("run_id"), "run": label, "prompts_per_batch": run["prompts_per_batch"],
               "rollouts": run["rollouts"], "status": run.get("status", "done"),
               "c_min": float(compute[compute > 0].min()) if (compute > 0).any() else np.nan,
               "c_max": float(compute.max()) if compute.size else np.nan,
               "truncation_rate": late_truncation_rate(mine)}
        keep = record_breaking_points(compute, reward, bin_width) if record_breaking else np.arange(compute.size)
        try:
            fit = fit_sigmoid(compute[keep], reward[keep], min_compute=min_compute, bootstrap=bootstrap, seed=seed)
        except FitError as err:
            row.update(A=np.nan, B=np.nan, C_mid=np.nan, R0=np.nan, A_lo=np.nan, A_hi=np.nan, r2=np.nan,
                       n_points=int(keep.size), identified=False, reason=f"not fitted: {err}")
        else:
            row.update({k: v for k, v in fit.to_dict().items() if k != "rss"})
            if fit.samples is not None and len(fit.samples):
                draws[label] = fit.samples
        rows.append(row)
    return pd.DataFrame(rows, columns=CURVE_COLUMNS), draws


def fitted(curves: pd.DataFrame) -> pd.DataFrame:
    """Runs with finite curve parameters (identified or not) and known geometry."""
    ok = curves[["A", "B", "C_mid", "R0"]].notna().all(axis=1)
    ok &= curves["prompts_per_batch"].notna() & curves["rollouts"].notna()
    return curves[ok]


def stable(curves: pd.DataFrame, max_truncation: float = MAX_TRUNCATION) -> pd.Series:
    """Runs that finished without failing and kept truncation below the limit (when it was recorded)."""
    truncation = curves["truncation_rate"].astype(float)
    return (curves["status"].fillna("done") != "failed") & ~(truncation >= max_truncation)


@dataclass(frozen=True)
class Recommendation:
    """A production allocation and the evidence behind it; compute in the study's unit (GPU-hours)."""

    budget: float
    prompts_per_batch: int
    rollouts: int
    steps: int
    n_star: float  # the law's continuous n*(budget)
    n_star_interval: tuple[float, float]
    predicted_reward: float
    predicted_interval: tuple[float, float]
    predicted_from: str  # the run whose curve gives the prediction
    extrapolation: float  # budget / largest compute observed
    law: dict
    evidence: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    law_identified: bool = True  # False: n is the one n* the frontier showed, not a law's prediction
    predicted_level: float = 0.95  # the level of predicted_interval

    def to_dict(self) -> dict:
        """Plain JSON-ready values."""
        return {
            "budget": self.budget, "prompts_per_batch": self.prompts_per_batch, "rollouts": self.rollouts,
            "steps": self.steps, "n_star": self.n_star, "n_star_interval": list(self.n_star_interval),
            "predicted_reward": self.predicted_reward, "predicted_interval": list(self.predicted_interval),
            "predicted_from": self.predicted_from, "extrapolation": self.extrapolation, "law": self.law,
            "evidence": self.evidence, "notes": self.notes, "law_identified": self.law_identified,
            "predicted_level": self.predicted_level,
        }


def constant_optimal_rollouts(law: RolloutsLaw) -> int | None:
    """The one n* of a frontier on which n* never moved (a law cannot be fitted to it), else None."""
    values = {int(n) for n in law.frontier["rollouts"]} if len(law.frontier) else set()
    return values.pop() if len(values) == 1 else None


def best_fitted_rollouts(curves: pd.DataFrame, law: RolloutsLaw, budget: float, *, noise_band: float = NOISE_BAND,
                         max_truncation: float = MAX_TRUNCATION) -> tuple[int, str]:
    """(n, why) without a law. When n* never moved over the observed compute: that n* when a run at it is
    identified; else the n of the identified, stable run with the highest fitted reward at the compute every run
    reached, provided no unidentified run's fitted reward there is higher by more than the noise band. When n* moved
    (a law would say where it goes next) only if every run is identified and stable: then each run's fitted curve is
    pinned, and n comes from the run with the highest fitted reward at `budget`. Raises Refusal otherwise.
    curves: every run's row (run_curves), those that could not be fitted included."""
    from rlscale.fitting.sigmoid import sigmoid

    constant = constant_optimal_rollouts(law)
    usable = fitted(curves).copy()
    usable["stable"] = stable(usable, max_truncation)
    trusted = usable[usable["identified"].astype(bool) & usable["stable"]]
    if constant is None:
        unfitted = curves[~curves.index.isin(usable.index)]
        return _identified_runs_rollouts(usable, trusted, unfitted, law, budget, noise_band)
    if trusted.empty:
        raise Refusal(f"no recommendation: the optimal-n law is not identified: {law.reason}; and no run has an "
                      "identified fit that trained stably")
    if (trusted["rollouts"].astype(int) == constant).any():
        return constant, (f"n = {constant} was the best n at every compute the runs reached "
                          f"({law.compute_range[0]:.3g}-{law.compute_range[1]:.3g}), so n comes from its fitted runs")
    common = float(usable["c_max"].min())  # the compute every run reached: fitted rewards there are interpolated
    reward_at = {row.run: float(sigmoid(common, row.A, row.B, row.C_mid, row.R0)) for row in usable.itertuples()}
    best = max(trusted.itertuples(), key=lambda row: reward_at[row.run])
    for row in usable.itertuples():
        if row.run not in set(trusted["run"]) and reward_at[row.run] > reward_at[best.run] + noise_band:
            raise Refusal(f"no recommendation: the optimal-n law is not identified: {law.reason}; and run {row.run} "
                          f"(not identified: {row.reason}) fits {reward_at[row.run]:.3f} at {common:.3g}, more than "
                          f"{noise_band:g} above the best identified run {best.run} ({reward_at[best.run]:.3f})")
    return int(best.rollouts), (f"n* was {constant} at every compute the runs reached, but no run at n = {constant} "
                                f"is identified; n = {int(best.rollouts)} from {best.run}, the identified run with the "
                                f"highest fitted reward at {common:.3g} ({reward_at[best.run]:.3f}; no unidentified run "
                                f"is more than {noise_band:g} above it there)")


def reach_of_finished(curves: pd.DataFrame) -> float:
    """The compute every fitted run that finished (neither stopped early nor failed) reached, 0 when none: below it
    a fitted curve is read inside its own data."""
    usable = fitted(curves)
    usable = usable[~usable["status"].fillna("done").isin(["stopped", "failed"])]
    return float(usable["c_max"].astype(float).min()) if len(usable) and "c_max" in usable else 0.0


def best_rollouts_within_data(curves: pd.DataFrame, budget: float, *, noise_band: float = NOISE_BAND,
                              max_truncation: float = MAX_TRUNCATION) -> tuple[int, str]:
    """(n, why) at a budget every finished run reached: each run's fitted curve is read inside its own data, where
    the curve is pinned whether or not its A is identified. Runs stopped early are left out (the scheduler judged
    them already). Raises Refusal when a run could not be fitted or none trained stably."""
    from rlscale.fitting.sigmoid import sigmoid

    usable = fitted(curves)
    unfitted = curves[~curves.index.isin(usable.index) & (curves["status"].fillna("done") != "failed")]
    if len(unfitted):
        names = ", ".join(f"{row.run} ({row.reason or 'not fitted'})" for row in unfitted.itertuples())
        raise Refusal(f"no recommendation: some runs could not be fitted, so the best at {budget:.4g} is unknown "
                      f"({names})")
    usable = usable[(usable["status"].fillna("done") != "stopped") & stable(usable, max_truncation)]
    if usable.empty:
        raise Refusal("no recommendation: no run finished and trained stably")
    reward_at = {row.run: float(sigmoid(budget, row.A, row.B, row.C_mid, row.R0)) for row in usable.itertuples()}
    best, close = _best_and_close(usable, reward_at, noise_band)
    tie = f"; also within the {noise_band:g} noise band there: {', '.join(close)}" if close else ""
    return int(best.rollouts), (f"every run reached {budget:.4g}, so each fitted curve is read inside its own data, "
                                f"where it holds whether or not A is identified; n = {int(best.rollouts)} from "
                                f"{best.run}, the highest there ({reward_at[best.run]:.3f}){tie}")


def _best_and_close(runs: pd.DataFrame, reward_at: dict, noise_band: float) -> tuple:
    """(the run with the highest reward_at, ["run reward"] for the best run of each other n within noise_band)."""
    best = max(runs.itertuples(), key=lambda row: reward_at[row.run])
    others = [max(group.itertuples(), key=lambda row: reward_at[row.run])
              for n, group in runs.groupby("rollouts") if n != best.rollouts]
    return best, [f"{row.run} {reward_at[row.run]:.3f}" for row in others
                  if reward_at[row.run] > reward_at[best.run] - noise_band]


def _identified_runs_rollouts(usable: pd.DataFrame, trusted: pd.DataFrame, unfitted: pd.DataFrame, law: RolloutsLaw,
                              budget: float, noise_band: float) -> tuple[int, str]:
    from rlscale.fitting.sigmoid import sigmoid

    moved = sorted({int(n) for n in law.frontier["rollouts"]})
    refused = f"no recommendation: the optimal-n law is not identified: {law.reason}"
    if trusted.empty or len(trusted) < len(usable) or len(unfitted):
        doubtful = ", ".join([f"{row.run} ({row.reason or 'unstable'})" for row in usable.itertuples()
                              if row.run not in set(trusted["run"])] +
                             [f"{row.run} ({row.reason or 'not fitted'})" for row in unfitted.itertuples()])
        raise Refusal(f"{refused}; and n* moved ({moved}) while not every run is identified and stable ({doubtful}), "
                      "so where it goes beyond the observed compute is unknown")
    reward_at = {row.run: float(sigmoid(budget, row.A, row.B, row.C_mid, row.R0)) for row in trusted.itertuples()}
    best, close = _best_and_close(trusted, reward_at, noise_band)
    tie = f"; within the {noise_band:g} noise band of it there: {', '.join(close)}" if close else ""
    low, high = float(trusted["A"].min()), float(trusted["A"].max())
    reach = float(trusted["c_max"].max())
    return int(best.rollouts), (
        f"n* moved over the compute the runs reached (it took {moved}), but every run is identified and stable "
        f"(asymptotes {low:.3f}-{high:.3f}), so each run's fitted curve is read at the budget instead of a law; "
        f"n = {int(best.rollouts)} from {best.run}, the highest there ({reward_at[best.run]:.3f} at {budget:.4g}, "
        f"{budget / reach:.1f}x the most compute a run reached){tie}")


def recommend(curves: pd.DataFrame, law: RolloutsLaw, *, budget: float, steps_for: Callable[[float, int, int], int],
              draws: dict | None = None, noise_band: float = NOISE_BAND,
              max_truncation: float = MAX_TRUNCATION, allow_constant_n: bool = False) -> Recommendation:
    """(B_p, n, M) for `budget`: n from the law, the smallest stable B_p within noise of the best A, M = steps_for.

    steps_for(budget, prompts_per_batch, rollouts) -> steps is the cost model. allow_constant_n: when the law is
    unidentified, take n from the best fitted runs (said in the notes, `law_identified` False): at a budget every
    finished run reached, the best fitted reward there, identified or not (best_rollouts_within_data); past it,
    best_fitted_rollouts. Raises Refusal when the law is unidentified (and allow_constant_n is off, or the fitted
    runs cannot decide), when the runs at the recommended n have no usable fit, or when no step fits the budget.
    """
    if not budget > 0:
        raise ValueError(f"budget must be > 0, got {budget}")
    notes = []
    usable = fitted(curves)
    within_data = budget <= reach_of_finished(curves) * (1 + 1e-9)  # no extrapolation: A's identification is moot
    if law.identified:
        n_star = float(law.predict(budget))
        n_lo, n_hi = (float(v) for v in law.predict_interval(budget))
        n_rec = int(2 ** round(np.log2(n_star)))
    elif allow_constant_n:
        if within_data:
            n_rec, why = best_rollouts_within_data(curves, budget, noise_band=noise_band, max_truncation=max_truncation)
        else:
            n_rec, why = best_fitted_rollouts(curves, law, budget, noise_band=noise_band, max_truncation=max_truncation)
        n_star = n_lo = n_hi = float(n_rec)
        notes.append(f"no optimal-n law: {law.reason}; {why}" if within_data else
                     f"no optimal-n law: {law.reason}. {why}; runs at larger compute levels would fit the law")
    else:
        raise Refusal(f"no recommendation: the optimal-n law is not identified: {law.reason}")

    tested = np.array(sorted({int(n) for n in usable["rollouts"]}))
    n_ev = int(tested[np.argmin(np.abs(np.log2(tested) - np.log2(n_rec)))])
    if n_ev != n_rec:
        notes.append(f"n = {n_rec} was not tested; B_p and the predicted reward come from the runs at n = {n_ev}")
    at_n = usable[usable["rollouts"] == n_ev].copy()
    at_n["stable"] = stable(at_n, max_truncation)
    from rlscale.fitting.sigmoid import sigmoid

    # B_p by A; inside the data (no extrapolation) by the fitted reward at the budget, identified or not
    at_n["score"] = (sigmoid(budget, *at_n[["A", "B", "C_mid", "R0"]].to_numpy(float).T) if within_data
                     else at_n["A"].astype(float))
    if within_data:
        trusted = at_n[at_n["stable"] & (at_n["status"].fillna("done") != "stopped")]
    else:
        trusted = at_n[at_n["identified"].astype(bool) & at_n["stable"]]
    if trusted.empty:
        why = "; ".join(f"{r.run}: {r.reason or 'unstable (truncation or failed)'}" for r in at_n.itertuples())
        law_why = "" if law.identified else f"the optimal-n law is not identified: {law.reason}; and "
        fit_kind = "a fit" if within_data else "an identified fit"
        raise Refusal(f"no recommendation: {law_why}no run at n = {n_ev} has {fit_kind} and trained stably ({why})")
    best_score = float(trusted["score"].max())
    within = trusted[trusted["score"] >= best_score - noise_band].sort_values(["prompts_per_batch", "score"],
                                                                              ascending=[True, False])
    chosen = within.iloc[0]
    prompts = int(chosen["prompts_per_batch"])
    steps = int(steps_for(budget, prompts, n_rec))
    if steps < 1:
        raise Refusal(f"no recommendation: a budget of {budget:g} does not pay for one step at B_p = {prompts}, n = {n_rec}")

    params = chosen[["A", "B", "C_mid", "R0"]].to_numpy(float)
    reward = float(sigmoid(budget, *params))
    samples = (draws or {}).get(chosen["run"])
    if samples is not None and len(samples) >= 2:
        curve = sigmoid(budget, samples[:, 0], samples[:, 1], samples[:, 2], samples[:, 3])
        lo, hi = (float(v) for v in percentile_interval(curve, 0.95))
    else:
        lo = hi = float("nan")
        notes.append("no bootstrap draws for the chosen run: the reward interval is unknown")
    extrapolation = law.extrapolation_factor(budget)
    if extrapolation > 10:
        notes.append(f"the budget is {extrapolation:.0f}x the largest compute observed: treat the law as a guess there")

    evidence = []
    for row in at_n.itertuples():
        evidence.append({
            "run": row.run, "prompts_per_batch": int(row.prompts_per_batch), "rollouts": int(row.rollouts),
            "A": row.A, "A_lo": row.A_lo, "A_hi": row.A_hi, "identified": bool(row.identified),
            "reason": row.reason or "", "truncation_rate": row.truncation_rate, "stable": bool(row.stable),
            "within_noise_of_best": bool(row.run in set(trusted["run"]) and row.score >= best_score - noise_band),
            "chosen": row.run == chosen["run"],
        })
    return Recommendation(
        budget=float(budget), prompts_per_batch=prompts, rollouts=n_rec, steps=steps,
        n_star=n_star, n_star_interval=(n_lo, n_hi), predicted_reward=reward, predicted_interval=(lo, hi),
        predicted_from=str(chosen["run"]), extrapolation=extrapolation,
        law={**law.to_dict(), "frontier": frontier_segments(law.frontier)}, evidence=evidence, notes=notes,
        law_identified=bool(law.identified),
    )


@dataclass(frozen=True)
class NextAllocation:
    """The runs to extend, and by how much, so that their fits and the optimal-n law can be identified."""

    factor: float  # multiply every run's compute by this (runs of an IsoCompute study stay at equal compute)
    runs: list[dict]  # {run, compute (reached), target, why}: why it needs the compute, "" for equal compute
    goal: str  # what the extension should identify

    def to_dict(self) -> dict:
        """Plain JSON-ready values."""
        return {"factor": self.factor, "runs": self.runs, "goal": self.goal}


def next_allocation(curves: pd.DataFrame, law_identified: bool | None) -> NextAllocation | None:
    """Which runs to extend, to what compute, so that the fits and the optimal-n law are identified (law_identified:
    None where the study has no law to fit); None when they all are, or no run has compute to extend. A run not yet past its inflection needs at least twice its
    fitted C_mid (the curve is then ~3/4 of the way up for B ~ 1.5); any other unidentified fit, and a law whose
    frontier has not bent, twice the compute reached: a longer plateau narrows A and shows where n* settles."""
    usable = curves[np.isfinite(curves["c_max"].astype(float)) & (curves["c_max"].astype(float) > 0)]
    if usable.empty:
        return None
    needs = {}
    for row in usable.itertuples():
        if bool(row.identified):
            continue
        factor = 2.0
        if np.isfinite(row.C_mid) and row.C_mid > row.c_max / 2:
            factor = max(factor, 2.0 ** np.ceil(np.log2(2 * row.C_mid / row.c_max)))
        needs[row.run] = (min(factor, MAX_EXTEND), row.reason or "not identified")
    law_open = law_identified is False
    if not needs and not law_open:
        return None
    factor = max([factor for factor, _ in needs.values()], default=2.0)
    if needs:
        goal = f"identify {len(needs)} of {len(usable)} fits" + (" and the optimal-n law" if law_open else "")
    else:
        goal = "identify the optimal-n law (the runs' fits are)"
    runs = [{"run": row.run, "compute": float(row.c_max), "target": float(row.c_max * factor),
             "why": needs[row.run][1] if row.run in needs else ""} for row in usable.itertuples()]
    return NextAllocation(factor=float(factor), runs=runs, goal=goal)


def frontier_segments(front: pd.DataFrame) -> list[dict]:
    """The frontier as runs of constant n*: [{rollouts, prompts_per_batch, run, compute_from, compute_to}]."""
    segments = []
    for row in front.itertuples():
        if segments and segments[-1]["run"] == row.run:
            segments[-1]["compute_to"] = float(row.compute)
        else:
            segments.append({"rollouts": int(row.rollouts), "prompts_per_batch": int(row.prompts_per_batch),
                             "run": str(row.run), "compute_from": float(row.compute), "compute_to": float(row.compute)})
    return segments


# --- the edge: a stored study in, a recommendation out --------------------------------------------------

COMPUTE_COLUMNS = {"gpu_hours": "gpu_hours", "rollouts": "rollouts", "tokens": "tokens"}


def study_unit(study) -> str:
    """The compute unit (gpu_hours, rollouts, tokens) of a Study; gpu_hours when it does not say (or is None)."""
    return study.compute.unit if study is not None and study.compute is not None else "gpu_hours"


def steps_model(study, records: pd.DataFrame, runs: pd.DataFrame, *, profile: str | None = None):
    """(steps_for(budget, B_p, n) -> steps, description) in the study's compute unit.

    GPU-hours use, in order: the named profile, a profile calibrated on the study's own measured records,
    the study's profile (compute.profile, else the default for its model). `study`: a Study, or None for a study
    imported without a spec (then the default profile of the default recipe's model).
    """
    from rlscale.planner.cost import calibrate, step_gpu_hours, steps_within

    unit = study_unit(study)
    if unit == "rollouts":
        return (lambda budget, bp, n: steps_within(budget, bp * n)), "rollouts: B_p x n per step"
    if unit == "tokens":
        both = records.dropna(subset=["tokens", "rollouts"]) if {"tokens", "rollouts"} <= set(records.columns) else records.iloc[:0]
        both = both[both["rollouts"].astype(float) > 0]
        per_rollout = float((both["tokens"].astype(float) / both["rollouts"].astype(float)).median()) if len(both) else float(
            _base_recipe(study).max_new_tokens)
        return (lambda budget, bp, n: steps_within(budget, bp * n * per_rollout)), f"tokens: {per_rollout:.1f} per rollout"
    chosen, how = None, ""
    if profile is not None:
        from rlscale.planner.profiles import load_profile

        chosen, how = load_profile(profile), f"profile {profile}"
    else:
        try:
            chosen, quality = calibrate(records, runs, name="measured")
            how = f"calibrated on the study's records (r2 {quality.r2:.2f})"
            if not quality.r2 >= 0.5:
                chosen = None
        except Exception:  # any calibration failure falls back to the study's profile
            chosen = None
        if chosen is None:
            from rlscale.planner.profiles import load_profile
            from rlscale.planner.cost import DEFAULT_PROFILE
            from rlscale.planner.study import default_profile

            # a study imported from logs has no spec: they come from real models, not the tiny policy
            chosen = default_profile(study) if study is not None else load_profile(DEFAULT_PROFILE)
            how = f"profile {chosen.name}"
    return (lambda budget, bp, n: steps_within(budget, step_gpu_hours(chosen, bp, n), chosen.startup_gpu_hours)), how


def pick_study(store, study: str | None) -> str:
    """`study`, or the only stored study whose runs try more than one rollouts value."""
    if study is not None:
        store.study_spec(study)  # UserError naming the known studies if it does not exist
        return study
    from rlscale.base.errors import UserError

    candidates = []
    for name in store.study_names():
        runs = run_geometry(store.runs_frame(name))
        if runs["rollouts"].nunique() >= 2:
            candidates.append(name)
    if len(candidates) != 1:
        known = ", ".join(candidates) or "none"
        raise UserError(f"pick the study with --study (studies that vary rollouts: {known})", field="--study")
    return candidates[0]


def study_curves(store, study: str, *, bootstrap: int = 100, seed: int = 0):
    """(the stored Study or None, runs, records, curves, draws) of a stored study, fitted as its sweep fits them."""
    from rlscale.planner.study import stored_study

    typed = stored_study(store, study)
    runs = store.runs_frame(study)
    records = store.records_frame(study)
    if records["val_reward"].notna().sum() == 0:
        raise Refusal(f"no recommendation: study {study!r} has no evaluated records yet")
    curves, draws = run_curves(records, runs, compute_col=COMPUTE_COLUMNS[study_unit(typed)],
                               record_breaking=fits_record_breaking(typed), bootstrap=bootstrap, seed=seed)
    return typed, runs, records, curves, draws


def _rollouts_law(study: str, curves: pd.DataFrame, draws: dict, bootstrap: int, seed: int) -> RolloutsLaw:
    from rlscale.fitting.optimal_n import fit_optimal_rollouts

    usable = fitted(curves)
    if usable["rollouts"].nunique() < 2:
        raise Refusal(f"no recommendation: study {study!r} has fitted runs at {usable['rollouts'].nunique()} rollouts "
                      "value(s); the optimal-n law needs an IsoCompute study that varies rollouts")
    try:
        return fit_optimal_rollouts(usable, draws=draws, bootstrap=bootstrap, seed=seed)
    except ValueError as err:  # e.g. every run stopped before its inflection: no frontier to fit a law to
        raise Refusal(f"no recommendation: the optimal-n law cannot be fitted: {err} "
                      "(have the runs passed their inflection?)") from None


def recommend_study(store, study: str, budget: float, *, profile: str | None = None, bootstrap: int = 100,
                    seed: int = 0) -> tuple[Recommendation, object]:
    """(recommendation, the stored Study or None) for a stored study; Refusal when the evidence is not enough."""
    typed, runs, records, curves, draws = study_curves(store, study, bootstrap=bootstrap, seed=seed)
    law = _rollouts_law(study, curves, draws, bootstrap, seed)
    steps_for, cost_how = steps_model(typed, records, runs, profile=profile)
    rec = recommend(curves, law, budget=budget, steps_for=steps_for, draws=draws, allow_constant_n=True)
    rec = _with_prediction_interval(rec, records, curves, COMPUTE_COLUMNS[study_unit(typed)])
    rec.notes.append(f"compute in {study_unit(typed)}; steps from the cost model: {cost_how}")
    return rec, typed


def _with_prediction_interval(rec: Recommendation, records: pd.DataFrame, curves: pd.DataFrame,
                              compute_col: str) -> Recommendation:
    """`rec` with its reward at the budget as fitting/predict.py gives it: the chosen run's mean reward over the last
    10% of the budget and its prediction interval (parameters, evaluation noise, the plateau's drift). Unchanged
    (the curve's bootstrap band) when the run has too few evaluations for an interval."""
    from dataclasses import replace

    from rlscale.fitting.predict import predict_stored_run

    chosen = curves[curves["run"] == rec.predicted_from]
    p = None if chosen.empty else predict_stored_run(records, chosen.iloc[0], compute_col, rec.budget)
    if p is None:
        return rec
    return replace(rec, predicted_reward=p.predicted, predicted_interval=(p.lo, p.hi), predicted_level=p.level,
                   notes=[*rec.notes, f"reward at the budget: the mean over its last 10%, with a {p.level:.0%} "
                          "prediction interval (fit, evaluation noise and drift past the data)"])


def next_allocation_study(store, study: str, *, bootstrap: int = 100, seed: int = 0) -> NextAllocation | None:
    """next_allocation for a stored study's finished runs (the law too, for a study that varies rollouts); None
    when nothing is left to identify or no run finished (failed and stopped runs are not extended)."""
    try:
        _typed, _runs, _records, curves, draws = study_curves(store, study, bootstrap=bootstrap, seed=seed)
    except Refusal:
        return None
    law_identified = None
    if fitted(curves)["rollouts"].nunique() >= 2:
        try:
            law_identified = _rollouts_law(study, curves, draws, bootstrap, seed).identified
        except Refusal:  # no frontier to fit a law to yet
            law_identified = False
    return next_allocation(curves[curves["status"] == "done"], law_identified)


def _base_recipe(study):
    """The study's base recipe; the default Recipe for a study imported without a spec (None)."""
    from rlscale.planner.recipe import Recipe

    return study.recipe if study is not None else Recipe()


def recommended_recipe(study, rec: Recommendation):
    """The base recipe of `study` (a Study, or None: the default recipe) with the recommended B_p, n and M."""
    from rlscale.planner.recipe import Recipe

    base = _base_recipe(study).to_json()
    return Recipe.model_validate({**base, "prompts_per_batch": rec.prompts_per_batch, "rollouts": rec.rollouts,
                                  "steps": rec.steps})


def model_parameters(study) -> dict[str, float]:
    """HF directory -> parameter count for a study with a `model` axis (its `models`); {} otherwise."""
    return {} if study is None else {name: size.parameters for name, size in study.models.items()}


def study_size_law(store, study: str, *, bootstrap: int = 100, seed: int = 0):
    """(the stored Study, SizeLaw) of a study with a `model` axis; Refusal when its sizes cannot be fitted."""
    from rlscale.fitting.model_size import fit_size_law, size_frame
    from rlscale.planner.study import stored_study

    typed = stored_study(store, study)
    parameters = model_parameters(typed)
    if not parameters:
        raise Refusal(f"no size recommendation: study {study!r} has no `model` axis with `models`")
    frame = size_frame(store.records_frame(study), store.runs_frame(study), parameters,
                       compute_col=COMPUTE_COLUMNS[study_unit(typed)], reward_col=typed.metric)
    try:
        return typed, fit_size_law(frame, bootstrap=bootstrap, seed=seed)
    except FitError as err:
        raise Refusal(f"no size recommendation: the power law across sizes cannot be fitted: {err}") from None


def recommend_size_study(store, study: str, budget: float, *, bootstrap: int = 100, seed: int = 0):
    """The model size for `budget` (fitting.model_size.SizeChoice) from a stored study with a `model` axis."""
    from rlscale.fitting.model_size import choose_size

    _typed, law = study_size_law(store, study, bootstrap=bootstrap, seed=seed)
    return choose_size(law, budget)


def sweeps_models(store, study: str) -> bool:
    """Whether stored study `study` has a `model` axis (then recommend names a model size)."""
    from rlscale.planner.study import stored_study

    return bool(model_parameters(stored_study(store, study)))
