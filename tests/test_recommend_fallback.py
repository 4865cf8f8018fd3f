"""Without an optimal-n law `recommend` takes n from the best fitted runs and says so: when n* never moved over the
observed compute (still refusing when an unidentified run could be better beyond the noise band), when it moved
but every run is identified and stable (its fitted curve read at the budget), or at a budget every run reached
(each fitted curve read inside its own data, identified or not)."""

import numpy as np
import pandas as pd
import pytest

from rlscale.fitting.optimal_n import RolloutsLaw
from rlscale.fitting.recommend import Refusal, recommend


def _flat_law(frontier_n):
    front = pd.DataFrame({"compute": [1.0, 10.0, 100.0], "reward": [0.3, 0.5, 0.6], "rollouts": frontier_n,
                          "prompts_per_batch": [16] * 3, "run": [f"n{n}" for n in frontier_n]})
    return RolloutsLaw(lo=2.0, hi=2.0, k=1.0, c0=0.0, identified=False,
                       reason=f"the frontier has not bent: n* takes only {sorted(set(frontier_n))}",
                       compute_range=(1.0, 100.0), frontier=front)


def _curves(rows):
    base = {"status": "done", "R0": 0.3, "r2": 0.99, "n_points": 20, "c_min": 1.0, "c_max": 100.0,
            "truncation_rate": 0.01, "run_id": None, "prompts_per_batch": 16}
    return pd.DataFrame([{**base, "run": f"n{n}", "rollouts": n, "A": A, "B": B, "C_mid": c_mid, "A_lo": A - 0.01,
                          "A_hi": A + 0.01, "identified": ok, "reason": "" if ok else "has not passed the inflection"}
                         for n, A, B, c_mid, ok in rows])


def _steps(budget, bp, n):
    return int(budget // (bp * n))


def test_a_frontier_that_never_moved_gives_its_n_from_the_fitted_runs_and_says_so():
    curves = _curves([(4, 0.70, 1.5, 5.0, True), (8, 0.65, 1.5, 10.0, True)])
    rec = recommend(curves, _flat_law([4, 4, 4]), budget=400.0, steps_for=_steps, allow_constant_n=True)
    assert (rec.rollouts, rec.prompts_per_batch, rec.steps) == (4, 16, 400 // 64)
    assert not rec.law_identified and rec.to_dict()["law_identified"] is False
    assert any("no optimal-n law" in note and "n = 4" in note for note in rec.notes)
    with pytest.raises(Refusal, match="has not bent"):  # off by default: the law's refusal stands
        recommend(curves, _flat_law([4, 4, 4]), budget=400.0, steps_for=_steps)


def test_an_unidentified_frontier_run_is_replaced_only_when_no_unidentified_run_is_beyond_noise():
    # n = 4 leads but is not identified; n = 8 is identified and within 0.02 of it at the compute both reached
    close = _curves([(4, 0.90, 0.5, 100.0, False), (8, 0.62, 1.5, 10.0, True)])
    at_100 = {4: 0.3 + 0.6 / 2, 8: 0.3 + 0.32 / (1 + 0.1**1.5)}
    assert at_100[4] - at_100[8] < 0.02
    rec = recommend(close, _flat_law([4, 4, 4]), budget=400.0, steps_for=_steps, allow_constant_n=True)
    assert rec.rollouts == 8 and any("no run at n = 4 is identified" in note for note in rec.notes)
    far = _curves([(4, 1.0, 0.5, 100.0, False), (8, 0.62, 1.5, 10.0, True)])  # n = 4 fits 0.650 vs 0.610: beyond
    with pytest.raises(Refusal, match="n4"):
        recommend(far, _flat_law([4, 4, 4]), budget=400.0, steps_for=_steps, allow_constant_n=True)


def test_a_frontier_that_moved_is_decided_from_the_fitted_runs_only_when_every_run_is_identified():
    moved = _flat_law([4, 4, 8])
    doubtful = _curves([(4, 0.70, 1.5, 5.0, True), (8, 0.71, 1.5, 10.0, False)])
    with pytest.raises(Refusal, match="not every run is identified"):
        recommend(doubtful, moved, budget=400.0, steps_for=_steps, allow_constant_n=True)
    unstable = _curves([(4, 0.70, 1.5, 5.0, True), (8, 0.75, 1.5, 10.0, True)])
    unstable.loc[1, "truncation_rate"] = 0.12  # ScaleRL: a run whose truncation climbs past 5% is crashing
    with pytest.raises(Refusal, match=r"not every run is identified and stable \(n8 \(unstable\)\)"):
        recommend(unstable, moved, budget=400.0, steps_for=_steps, allow_constant_n=True)
    unfitted = _curves([(4, 0.70, 1.5, 5.0, True), (8, 0.75, 1.5, 10.0, True), (16, np.nan, np.nan, np.nan, False)])
    unfitted.loc[2, "reason"] = "not fitted: fewer than 3 usable points"
    with pytest.raises(Refusal, match=r"n16 \(not fitted: fewer than 3"):
        recommend(unfitted, moved, budget=400.0, steps_for=_steps, allow_constant_n=True)
    # every run pinned: the curves are read at the budget; n = 8 (A 0.75, slower) is ahead there: 0.748 vs 0.699
    apart = _curves([(4, 0.70, 1.5, 5.0, True), (8, 0.75, 1.5, 10.0, True)])
    rec = recommend(apart, moved, budget=400.0, steps_for=_steps, allow_constant_n=True)
    assert (rec.rollouts, rec.steps) == (8, 400 // (16 * 8)) and not rec.law_identified
    note = next(note for note in rec.notes if "n* moved" in note)
    assert "n = 8 from n8" in note and "0.700-0.750" in note and "noise band of it" not in note
    assert "4.0x the most compute a run reached" in note
    # at a budget inside the data where the faster n = 4 still leads, it is chosen; n = 8 within the band is named
    rec = recommend(apart, moved, budget=25.0, steps_for=lambda budget, bp, n: 10, allow_constant_n=True)
    at_25 = {4: 0.3 + 0.4 / (1 + (5 / 25) ** 1.5), 8: 0.3 + 0.45 / (1 + (10 / 25) ** 1.5)}
    assert at_25[4] > at_25[8] > at_25[4] - 0.02
    assert rec.rollouts == 4
    assert any(f"within the 0.02 noise band there: n8 {at_25[8]:.3f}" in note for note in rec.notes)


def test_at_a_budget_every_run_reached_unidentified_runs_count_and_the_best_there_is_chosen():
    moved = _flat_law([4, 4, 8])
    # n8 is not identified (A could be higher) but its curve is pinned by its data up to c_max = 100
    curves = _curves([(4, 0.70, 1.5, 5.0, True), (8, 0.80, 1.0, 20.0, False), (16, 0.72, 1.0, 30.0, True)])
    at_100 = {n: 0.3 + (A - 0.3) / (1 + (c_mid / 100.0) ** B) for n, A, B, c_mid in
              [(4, 0.70, 1.5, 5.0), (8, 0.80, 1.0, 20.0), (16, 0.72, 1.0, 30.0)]}
    assert max(at_100, key=at_100.get) == 8
    rec = recommend(curves, moved, budget=100.0, steps_for=lambda budget, bp, n: 10, allow_constant_n=True)
    assert rec.rollouts == 8 and rec.predicted_from == "n8" and not rec.law_identified
    assert rec.predicted_reward == pytest.approx(at_100[8])
    assert any("read inside its own data" in note for note in rec.notes)
    # past the compute the runs reached, the unidentified run blocks the decision as before
    with pytest.raises(Refusal, match="not every run is identified"):
        recommend(curves, moved, budget=400.0, steps_for=_steps, allow_constant_n=True)
    # a run that could not be fitted leaves the best at the budget unknown
    unfitted = _curves([(4, 0.70, 1.5, 5.0, True), (8, np.nan, np.nan, np.nan, False)])
    unfitted.loc[1, "reason"] = "not fitted: fewer than 3 usable points"
    with pytest.raises(Refusal, match="could not be fitted"):
        recommend(unfitted, moved, budget=100.0, steps_for=lambda budget, bp, n: 10, allow_constant_n=True)
