"""The allocation (B_p, n, M) for a budget, following the IsoCompute Playbook: pure, fits in, a Recommendation out.
Every choice carries a Reason; Refusal carries the reasons when the evidence cannot support a decision."""

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from rlscale.fitting.curves import (
    CURVE_COLUMNS,
    MAX_TRUNCATION,
    fitted,
    reach_of_finished,
    run_curves,
    run_geometry,
    stable,
)
from rlscale.fitting.laws.optimal_n import RolloutsLaw, frontier_segments
from rlscale.fitting.rules.reasons import Reason, Refusal
from rlscale.fitting.rules.standing import Standing, beyond_noise, decision_runs, standing_at
from rlscale.fitting.sigmoid.bootstrap import percentile_interval
from rlscale.fitting.sigmoid.curve import sigmoid

from rlscale.base.numbers import NOISE_BAND

# Also imported from here by older callers (bench/): the per-run fits the decision reads.
__all__ = [
    "CURVE_COLUMNS",
    "MAX_TRUNCATION",
    "Recommendation",
    "Refusal",
    "fitted",
    "recommend",
    "run_curves",
    "run_geometry",
    "stable",
]


@dataclass(frozen=True)
class Recommendation:
    """A production allocation and its evidence, compute in the study's unit (GPU-hours by default); basis: how n was
    chosen; reasons: what else a reader should know; standing: the runs at the budget inside the data, else None."""

    budget: float
    prompts_per_batch: int
    rollouts: int
    steps: int
    n_star: float  # the law's continuous n*(budget); the chosen n where n does not come from the law
    n_star_interval: tuple[float, float]
    predicted_reward: float
    predicted_interval: tuple[float, float]
    predicted_from: str  # the run whose curve gives the prediction
    extrapolation: float  # budget / largest compute observed
    law: dict
    basis: Reason
    evidence: list[dict] = field(default_factory=list)
    reasons: tuple = ()
    law_identified: bool = True  # whether the optimal-n law is identified (n comes from it past the data)
    predicted_level: float = 0.95  # the level of predicted_interval
    standing: Standing | None = None

    def to_dict(self) -> dict:
        """Plain JSON-ready values; `basis` and `reasons` as {"code", "values"}."""
        return {
            "budget": self.budget,
            "prompts_per_batch": self.prompts_per_batch,
            "rollouts": self.rollouts,
            "steps": self.steps,
            "n_star": self.n_star,
            "n_star_interval": list(self.n_star_interval),
            "predicted_reward": self.predicted_reward,
            "predicted_interval": list(self.predicted_interval),
            "predicted_from": self.predicted_from,
            "extrapolation": self.extrapolation,
            "law": self.law,
            "evidence": self.evidence,
            "law_identified": self.law_identified,
            "predicted_level": self.predicted_level,
            "basis": self.basis.to_dict(),
            "reasons": [reason.to_dict() for reason in self.reasons],
            "standing": self.standing.to_dict() if self.standing is not None else None,
        }


def constant_optimal_rollouts(law: RolloutsLaw) -> int | None:
    """The one n* of a frontier on which n* never moved (a law cannot be fitted to it), else None."""
    values = {int(n) for n in law.frontier["rollouts"]} if len(law.frontier) else set()
    return values.pop() if len(values) == 1 else None


def _run_why(row) -> dict:
    return {"run": str(row.run), "why": row.reason or ("not fitted" if row.A != row.A else "unstable")}


def _within(standing: Standing) -> list[dict]:
    return [{"run": row["run"], "reward": row["reward"]} for row in standing.runs[1:] if row["within_band"]]


def best_rollouts_within_data(
    curves: pd.DataFrame, budget: float, *, noise_band: float = NOISE_BAND, max_truncation: float = MAX_TRUNCATION
) -> tuple[int, Reason, Standing]:
    """(n, basis, standing) at a budget every finished run reached: the best run's n, each curve read inside its data
    (pinned even with A unidentified); early-stopped runs left out. Refusal if a run is unfitted or none is stable."""
    usable = fitted(curves)
    unfitted = curves[~curves.index.isin(usable.index) & (curves["status"].fillna("done") != "failed")]
    if len(unfitted):
        raise Refusal(
            Reason("runs_not_fitted", {"compute": budget, "runs": [_run_why(row) for row in unfitted.itertuples()]})
        )
    standing = standing_at(decision_runs(curves, max_truncation), budget, noise_band=noise_band)
    if standing is None:
        raise Refusal(Reason("no_stable_finished_run"))
    best = standing.best
    return (
        standing.best_rollouts,
        Reason(
            "within_data",
            {
                "compute": budget,
                "run": best["run"],
                "rollouts": best["rollouts"],
                "reward": best["reward"],
                "within_band": _within(standing),
                "noise_band": noise_band,
            },
        ),
        standing,
    )


def best_fitted_rollouts(
    curves: pd.DataFrame,
    law: RolloutsLaw,
    budget: float,
    *,
    noise_band: float = NOISE_BAND,
    max_truncation: float = MAX_TRUNCATION,
) -> tuple[int, Reason]:
    """(n, basis) without a law, past the compute every run reached: a constant frontier's n* or its best pinned
    substitute, or with n* moving the best run at `budget` if every run is pinned; else Refusal (law_not_identified)."""
    not_identified = Reason("law_not_identified", {"law": law.verdict})
    constant = constant_optimal_rollouts(law)
    usable = fitted(curves).copy()
    usable["stable"] = stable(usable, max_truncation)
    trusted = usable[usable["identified"].astype(bool) & usable["stable"]]
    if constant is None:
        unfitted = curves[~curves.index.isin(usable.index)]
        doubtful = [_run_why(row) for row in usable.itertuples() if row.run not in set(trusted["run"])]
        doubtful += [_run_why(row) for row in unfitted.itertuples()]
        moved = sorted({int(n) for n in law.frontier["rollouts"]})
        if trusted.empty or doubtful:
            raise Refusal(not_identified, Reason("runs_not_pinned", {"moved": moved, "runs": doubtful}))
        standing = standing_at(trusted, budget, noise_band=noise_band, inside_data=False)  # every curve is pinned
        best = standing.best
        return standing.best_rollouts, Reason(
            "all_runs_pinned",
            {
                "moved": moved,
                "A_low": float(trusted["A"].min()),
                "A_high": float(trusted["A"].max()),
                "run": best["run"],
                "rollouts": best["rollouts"],
                "reward": best["reward"],
                "compute": budget,
                "reach": float(trusted["c_max"].max()),
                "within_band": _within(standing),
                "noise_band": noise_band,
            },
        )
    if trusted.empty:
        raise Refusal(not_identified, Reason("no_trusted_run"))
    if (trusted["rollouts"].astype(int) == constant).any():
        return constant, Reason(
            "constant_frontier",
            {"rollouts": constant, "compute_lo": law.compute_range[0], "compute_hi": law.compute_range[1]},
        )
    common = float(usable["c_max"].min())  # the compute every run reached: fitted rewards there are interpolated
    reward_at = {row.run: float(sigmoid(common, row.A, row.B, row.C_mid, row.R0)) for row in usable.itertuples()}
    best = max(trusted.itertuples(), key=lambda row: reward_at[row.run])
    for row in usable.itertuples():
        gap = reward_at[row.run] - reward_at[best.run]
        if row.run not in set(trusted["run"]) and gap > 0 and beyond_noise(gap, noise_band=noise_band):
            raise Refusal(
                not_identified,
                Reason(
                    "unidentified_run_ahead",
                    {
                        "run": row.run,
                        "fit_reason": row.reason,
                        "reward": reward_at[row.run],
                        "compute": common,
                        "best_run": best.run,
                        "best_reward": reward_at[best.run],
                        "noise_band": noise_band,
                    },
                ),
            )
    return int(best.rollouts), Reason(
        "constant_frontier_substitute",
        {
            "frontier_rollouts": constant,
            "rollouts": int(best.rollouts),
            "run": best.run,
            "compute": common,
            "reward": reward_at[best.run],
            "noise_band": noise_band,
        },
    )


def _choose_rollouts(curves, law, budget, noise_band, max_truncation, allow_constant_n):
    if budget <= reach_of_finished(curves) * (1 + 1e-9) and (law.identified or allow_constant_n):
        # inside the data the runs themselves decide: no extrapolation, so A's identification is moot
        n_rec, basis, standing = best_rollouts_within_data(
            curves, budget, noise_band=noise_band, max_truncation=max_truncation
        )
        law_note = () if law.identified else (Reason("law_not_identified", {"law": law.verdict}),)
        return n_rec, float(n_rec), (float(n_rec),) * 2, basis, law_note, standing
    if law.identified:
        n_star = float(law.predict(budget))
        n_lo, n_hi = (float(v) for v in law.predict_interval(budget))
        return (
            int(2 ** round(np.log2(n_star))),
            n_star,
            (n_lo, n_hi),
            Reason(
                "law",
                {
                    "n_star": n_star,
                    "n_lo": n_lo,
                    "n_hi": n_hi,
                    "compute": budget,
                    "extrapolation": law.extrapolation_factor(budget),
                },
            ),
            (),
            None,
        )
    if not allow_constant_n:
        raise Refusal(Reason("law_not_identified", {"law": law.verdict}))
    n_rec, basis = best_fitted_rollouts(curves, law, budget, noise_band=noise_band, max_truncation=max_truncation)
    return (
        n_rec,
        float(n_rec),
        (float(n_rec),) * 2,
        basis,
        (Reason("law_not_identified", {"law": law.verdict}), Reason("law_needs_more_compute")),
        None,
    )


def recommend(
    curves: pd.DataFrame,
    law: RolloutsLaw,
    *,
    budget: float,
    steps_for: Callable[[float, int, int, str], int],
    draws: dict | None = None,
    noise_band: float = NOISE_BAND,
    max_truncation: float = MAX_TRUNCATION,
    allow_constant_n: bool = False,
) -> Recommendation:
    """(B_p, n, M) for `budget`: n, the smallest stable B_p within the noise band of the best at n, M from
    `steps_for(budget, B_p, n, run)` (run: the one the recommendation rests on).
    allow_constant_n: without an identified law, n from the fitted runs. Refusal when the evidence cannot decide."""
    if not budget > 0:
        raise ValueError(f"budget must be > 0, got {budget}")
    n_rec, n_star, (n_lo, n_hi), basis, reasons, standing = _choose_rollouts(
        curves, law, budget, noise_band, max_truncation, allow_constant_n
    )
    reasons = list(reasons)
    within_data = basis.code == "within_data"
    usable = fitted(curves)
    tested = np.array(sorted({int(n) for n in usable["rollouts"]}))
    n_ev = int(tested[np.argmin(np.abs(np.log2(tested) - np.log2(n_rec)))])
    if n_ev != n_rec:
        reasons.append(Reason("n_untested", {"rollouts": n_rec, "tested": n_ev}))
    at_n = usable[usable["rollouts"] == n_ev].copy()
    at_n["stable"] = stable(at_n, max_truncation)
    # B_p by A; inside the data (no extrapolation) by the fitted reward at the budget, identified or not
    at_n["score"] = (
        sigmoid(budget, *at_n[["A", "B", "C_mid", "R0"]].to_numpy(float).T) if within_data else at_n["A"].astype(float)
    )
    if within_data:
        trusted = at_n[at_n["stable"] & (at_n["status"].fillna("done") != "stopped")]
    else:
        trusted = at_n[at_n["identified"].astype(bool) & at_n["stable"]]
    if trusted.empty:
        refusal = Reason(
            "no_trusted_run_at_n",
            {
                "rollouts": n_ev,
                "identified_required": not within_data,
                "runs": [_run_why(row) for row in at_n.itertuples()],
            },
        )
        raise Refusal(*([] if law.identified else [Reason("law_not_identified", {"law": law.verdict})]), refusal)
    best_score = float(trusted["score"].max())
    close = [not beyond_noise(best_score - score, noise_band=noise_band) for score in trusted["score"]]
    within = trusted[close].sort_values(["prompts_per_batch", "score"], ascending=[True, False])
    chosen = within.iloc[0]
    prompts = int(chosen["prompts_per_batch"])
    steps = int(steps_for(budget, prompts, n_rec, str(chosen["run"])))
    if steps < 1:
        raise Refusal(
            Reason("budget_buys_no_step", {"budget": budget, "prompts_per_batch": prompts, "rollouts": n_rec})
        )
    reward = float(sigmoid(budget, *chosen[["A", "B", "C_mid", "R0"]].to_numpy(float)))
    samples = (draws or {}).get(chosen["run"])
    if samples is not None and len(samples) >= 2:
        curve = sigmoid(budget, samples[:, 0], samples[:, 1], samples[:, 2], samples[:, 3])
        lo, hi = (float(v) for v in percentile_interval(curve, 0.95))
    else:
        lo = hi = float("nan")
        reasons.append(Reason("no_draws", {"run": str(chosen["run"])}))
    extrapolation = law.extrapolation_factor(budget)
    if extrapolation > 10:
        reasons.append(Reason("far_extrapolation", {"factor": extrapolation}))
    trusted_runs = set(trusted["run"])
    evidence = [
        {
            "run": row.run,
            "prompts_per_batch": int(row.prompts_per_batch),
            "rollouts": int(row.rollouts),
            "A": row.A,
            "A_lo": row.A_lo,
            "A_hi": row.A_hi,
            "identified": bool(row.identified),
            "reason": row.reason or "",
            "truncation_rate": row.truncation_rate,
            "stable": bool(row.stable),
            "score": float(row.score),
            "within_noise_of_best": bool(
                row.run in trusted_runs and not beyond_noise(best_score - row.score, noise_band=noise_band)
            ),
            "chosen": row.run == chosen["run"],
        }
        for row in at_n.itertuples()
    ]
    return Recommendation(
        budget=float(budget),
        prompts_per_batch=prompts,
        rollouts=n_rec,
        steps=steps,
        n_star=n_star,
        n_star_interval=(n_lo, n_hi),
        predicted_reward=reward,
        predicted_interval=(lo, hi),
        predicted_from=str(chosen["run"]),
        extrapolation=extrapolation,
        law={**law.to_dict(), "frontier": frontier_segments(law.frontier)},
        basis=basis,
        evidence=evidence,
        reasons=tuple(reasons),
        law_identified=bool(law.identified),
        standing=standing,
    )
