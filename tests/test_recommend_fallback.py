"""Without an optimal-n law `recommend` takes n from the best fitted runs and says so: when n* never moved over the
observed compute (still refusing when an unidentified run could be better beyond the noise band), when it moved
but every run is identified and stable (its fitted curve read at the budget), or at a budget every run reached
(each fitted curve read inside its own data, identified or not)."""

import numpy as np
import pandas as pd
import pytest
from rlscale.fitting.laws.optimal_n import RolloutsLaw
from rlscale.fitting.rules.reasons import Reason
from rlscale.fitting.rules.recommend import Refusal, recommend


def _flat_law(frontier_n):
    front = pd.DataFrame(
        {
            "compute": [1.0, 10.0, 100.0],
            "reward": [0.3, 0.5, 0.6],
            "rollouts": frontier_n,
            "prompts_per_batch": [16] * 3,
            "run": [f"n{n}" for n in frontier_n],
        }
    )
    verdict = Reason(
        "frontier_few_n",
        {"rollouts": sorted(set(frontier_n)), "compute_lo": 1.0, "compute_hi": 100.0, "min_distinct": 3},
    )
    return RolloutsLaw(
        lo=2.0, hi=2.0, k=1.0, c0=0.0, identified=False, verdict=verdict, compute_range=(1.0, 100.0), frontier=front
    )


def _refusal(curves, law, budget, steps_for=None):
    """The Refusal `recommend` raises (with allow_constant_n) for `curves` at `budget`."""
    with pytest.raises(Refusal) as refused:
        recommend(curves, law, budget=budget, steps_for=steps_for or _steps, allow_constant_n=True)
    return refused.value


def _curves(rows):
    base = {
        "status": "done",
        "R0": 0.3,
        "r2": 0.99,
        "n_points": 20,
        "c_min": 1.0,
        "c_max": 100.0,
        "truncation_rate": 0.01,
        "run_id": None,
        "prompts_per_batch": 16,
    }
    return pd.DataFrame(
        [
            {
                **base,
                "run": f"n{n}",
                "rollouts": n,
                "A": A,
                "B": B,
                "C_mid": c_mid,
                "A_lo": A - 0.01,
                "A_hi": A + 0.01,
                "identified": ok,
                "reason": "" if ok else "has not passed the inflection",
            }
            for n, A, B, c_mid, ok in rows
        ]
    )


def _steps(budget, bp, n, run):
    return int(budget // (bp * n))


def test_a_frontier_that_never_moved_gives_its_n_from_the_fitted_runs_and_says_so():
    curves = _curves([(4, 0.70, 1.5, 5.0, True), (8, 0.65, 1.5, 10.0, True)])
    rec = recommend(curves, _flat_law([4, 4, 4]), budget=400.0, steps_for=_steps, allow_constant_n=True)
    assert (rec.rollouts, rec.prompts_per_batch, rec.steps) == (4, 16, 400 // 64)
    assert not rec.law_identified and rec.to_dict()["law_identified"] is False
    assert rec.basis.code == "constant_frontier" and rec.basis["rollouts"] == 4
    assert [reason.code for reason in rec.reasons][:2] == ["law_not_identified", "law_needs_more_compute"]
    assert rec.to_dict()["basis"] == {
        "code": "constant_frontier",
        "values": {"rollouts": 4, "compute_lo": 1.0, "compute_hi": 100.0},
    }
    with pytest.raises(Refusal) as refused:  # off by default: the law's refusal stands
        recommend(curves, _flat_law([4, 4, 4]), budget=400.0, steps_for=_steps)
    assert refused.value.codes == ["law_not_identified"]
    assert refused.value.reasons[0]["law"].code == "frontier_few_n"


def test_an_unidentified_frontier_run_is_replaced_only_when_no_unidentified_run_is_beyond_noise():
    # n = 4 leads but is not identified; n = 8 is identified and within 0.02 of it at the compute both reached
    close = _curves([(4, 0.90, 0.5, 100.0, False), (8, 0.62, 1.5, 10.0, True)])
    at_100 = {4: 0.3 + 0.6 / 2, 8: 0.3 + 0.32 / (1 + 0.1**1.5)}
    assert at_100[4] - at_100[8] < 0.02
    rec = recommend(close, _flat_law([4, 4, 4]), budget=400.0, steps_for=_steps, allow_constant_n=True)
    assert rec.rollouts == 8 and rec.basis.code == "constant_frontier_substitute"
    assert rec.basis.values == {
        "frontier_rollouts": 4,
        "rollouts": 8,
        "run": "n8",
        "compute": 100.0,
        "reward": pytest.approx(at_100[8]),
        "noise_band": 0.02,
    }
    far = _curves([(4, 1.0, 0.5, 100.0, False), (8, 0.62, 1.5, 10.0, True)])  # n = 4 fits 0.650 vs 0.610: beyond
    refusal = _refusal(far, _flat_law([4, 4, 4]), 400.0)
    assert refusal.codes == ["law_not_identified", "unidentified_run_ahead"]
    ahead = refusal.reasons[1]
    assert (ahead["run"], ahead["best_run"], ahead["compute"]) == ("n4", "n8", 100.0)
    assert ahead["reward"] == pytest.approx(0.65) and ahead["best_reward"] == pytest.approx(at_100[8])


def test_a_frontier_that_moved_is_decided_from_the_fitted_runs_only_when_every_run_is_identified():
    moved = _flat_law([4, 4, 8])
    doubtful = _curves([(4, 0.70, 1.5, 5.0, True), (8, 0.71, 1.5, 10.0, False)])
    refusal = _refusal(doubtful, moved, 400.0)
    assert refusal.codes == ["law_not_identified", "runs_not_pinned"]
    assert refusal.reasons[1].values == {
        "moved": [4, 8],
        "runs": [{"run": "n8", "why": "has not passed the inflection"}],
    }
    unstable = _curves([(4, 0.70, 1.5, 5.0, True), (8, 0.75, 1.5, 10.0, True)])
    unstable.loc[1, "truncation_rate"] = 0.12  # ScaleRL: a run whose truncation climbs past 5% is crashing
    refusal = _refusal(unstable, moved, 400.0)
    assert refusal.codes == ["law_not_identified", "runs_not_pinned"]
    assert refusal.reasons[1]["runs"] == [{"run": "n8", "why": "unstable"}]
    unfitted = _curves([(4, 0.70, 1.5, 5.0, True), (8, 0.75, 1.5, 10.0, True), (16, np.nan, np.nan, np.nan, False)])
    unfitted.loc[2, "reason"] = "not fitted: fewer than 3 usable points"
    refusal = _refusal(unfitted, moved, 400.0)
    assert refusal.reasons[1]["runs"] == [{"run": "n16", "why": "not fitted: fewer than 3 usable points"}]
    # every run pinned: the curves are read at the budget; n = 8 (A 0.75, slower) is ahead there: 0.748 vs 0.699
    apart = _curves([(4, 0.70, 1.5, 5.0, True), (8, 0.75, 1.5, 10.0, True)])
    rec = recommend(apart, moved, budget=400.0, steps_for=_steps, allow_constant_n=True)
    assert (rec.rollouts, rec.steps) == (8, 400 // (16 * 8)) and not rec.law_identified
    basis = rec.basis
    assert (
        basis.code == "all_runs_pinned" and basis["moved"] == [4, 8] and (basis["run"], basis["rollouts"]) == ("n8", 8)
    )
    assert (basis["A_low"], basis["A_high"]) == pytest.approx((0.70, 0.75))
    assert basis["compute"] / basis["reach"] == pytest.approx(4.0)  # 4x the most compute a run reached
    assert basis["within_band"] == []  # n4 (0.699 vs 0.748) is beyond the band
    # at a budget inside the data where the faster n = 4 still leads, it is chosen; n = 8 within the band is named
    rec = recommend(apart, moved, budget=25.0, steps_for=lambda budget, bp, n, run: 10, allow_constant_n=True)
    at_25 = {4: 0.3 + 0.4 / (1 + (5 / 25) ** 1.5), 8: 0.3 + 0.45 / (1 + (10 / 25) ** 1.5)}
    assert at_25[4] > at_25[8] > at_25[4] - 0.02
    assert rec.rollouts == 4 and rec.basis.code == "within_data"
    assert rec.basis["within_band"] == [{"run": "n8", "reward": pytest.approx(at_25[8])}]
    assert rec.standing.within_band == ["n4", "n8"]


def test_at_a_budget_every_run_reached_unidentified_runs_count_and_the_best_there_is_chosen():
    moved = _flat_law([4, 4, 8])
    # n8 is not identified (A could be higher) but its curve is pinned by its data up to c_max = 100
    curves = _curves([(4, 0.70, 1.5, 5.0, True), (8, 0.80, 1.0, 20.0, False), (16, 0.72, 1.0, 30.0, True)])
    at_100 = {
        n: 0.3 + (A - 0.3) / (1 + (c_mid / 100.0) ** B)
        for n, A, B, c_mid in [(4, 0.70, 1.5, 5.0), (8, 0.80, 1.0, 20.0), (16, 0.72, 1.0, 30.0)]
    }
    assert max(at_100, key=at_100.get) == 8
    rec = recommend(curves, moved, budget=100.0, steps_for=lambda budget, bp, n, run: 10, allow_constant_n=True)
    assert rec.rollouts == 8 and rec.predicted_from == "n8" and not rec.law_identified
    assert rec.predicted_reward == pytest.approx(at_100[8])
    assert rec.basis.code == "within_data" and rec.basis["compute"] == 100.0  # each curve read inside its own data
    # past the compute the runs reached, the unidentified run blocks the decision as before
    assert _refusal(curves, moved, 400.0).codes == ["law_not_identified", "runs_not_pinned"]
    # a run that could not be fitted leaves the best at the budget unknown
    unfitted = _curves([(4, 0.70, 1.5, 5.0, True), (8, np.nan, np.nan, np.nan, False)])
    unfitted.loc[1, "reason"] = "not fitted: fewer than 3 usable points"
    refusal = _refusal(unfitted, moved, 100.0, lambda budget, bp, n: 10)
    assert refusal.codes == ["runs_not_fitted"]
    assert refusal.reasons[0].values == {
        "compute": 100.0,
        "runs": [{"run": "n8", "why": "not fitted: fewer than 3 usable points"}],
    }
