"""Early termination rules: the asymptote rule on fitted curves, and Optuna's Hyperband pruner as the sweep uses it."""

import numpy as np
from helpers import bench_module
from rlscale.fitting.rules.early_stop import UPPER_LEVEL, best_fit_of, should_stop
from rlscale.fitting.sigmoid import SigmoidFit, fit_sigmoid, sigmoid
from rlscale.planner.study import EarlyTerminate
from rlscale.runner.sweep.hyperband import HyperbandStopper
from rlscale.runner.sweep.scheduler import Move, RungSchedule, RunProgress, next_move

run_by_rungs = bench_module("early_termination").run_by_rungs  # run_concurrently with one slot
RUNGS = EarlyTerminate(type="asymptote").rungs  # the study default: 0.25, 0.5, 1.0

COMPUTE = np.linspace(0.025, 1.0, 40)


def curve(A, C_mid=0.1, B=2.0, R0=0.15, upto=1.0, seed=0):
    rng = np.random.default_rng(seed)
    c = COMPUTE[COMPUTE <= upto]
    return c, rng.binomial(2048, sigmoid(c, A, B, C_mid, R0)) / 2048


def judged(*data):
    """A fit as the sweep driver makes it for early termination (with the profile bound on A)."""
    return fit_sigmoid(*data, bootstrap=100, upper_level=UPPER_LEVEL)


def test_a_run_well_past_its_inflection_and_clearly_below_the_best_is_stopped():
    best = fit_sigmoid(*curve(0.80, seed=1))
    worse = judged(*curve(0.50, upto=0.5, seed=2))
    decision = should_stop(worse, best, max_compute=0.5)
    assert decision.stop and "asymptote" in decision.reason


def test_a_run_within_the_noise_band_of_the_best_is_kept():
    best = fit_sigmoid(*curve(0.80, seed=1))
    close = judged(*curve(0.79, upto=0.5, seed=3))
    assert not should_stop(close, best, max_compute=0.5).stop


def test_a_run_before_its_inflection_is_never_judged():
    best = fit_sigmoid(*curve(0.80, seed=1))
    early = judged(*curve(0.40, C_mid=0.3, upto=0.2, seed=4))
    assert not should_stop(early, best, max_compute=0.2).stop


def test_the_reference_is_the_identified_fit_with_the_highest_lower_bound():
    fits = {1: fit_sigmoid(*curve(0.6, seed=5)), 2: fit_sigmoid(*curve(0.8, seed=6)), 3: None}
    assert best_fit_of(fits) is fits[2]


def test_hyperband_prunes_runs_that_trail_at_a_rung_and_keeps_the_leader():
    stopper = HyperbandStopper(steps=40, min_fraction=0.1, eta=3)
    stopped = {}
    for run, asymptote in enumerate([0.8, 0.3, 0.3, 0.3, 0.8, 0.3]):
        evaluations = []
        for step in range(0, 41, 4):
            evaluations.append((step, asymptote * step / 40))
            reason = stopper.check(run, evaluations)
            if reason:
                stopped[run] = step
                break
        else:
            stopper.finish(run, evaluations[-1][1])
    assert 0 not in stopped and stopped  # the first leader runs to the end; some trailing runs are cut
    assert all(step < 40 for step in stopped.values())


# The rung scheduler: hand-built fits, so each test states exactly what the scheduler sees.


def sigmoid_fit(A, half_width=0.01, C_mid=0.1, identified=True):
    return SigmoidFit(
        A=A,
        B=2.0,
        C_mid=C_mid,
        R0=0.15,
        rss=0.0,
        r2=1.0,
        A_lo=A - half_width,
        A_hi=min(1.0, A + half_width),
        n_points=20,
        identified=identified,
        reason="",
        A_upper=min(1.0, A + half_width),
    )


def at(key, fraction, A=None, half_width=0.01, C_mid=0.1, identified=True, **kw):
    fit = None if A is None else sigmoid_fit(A, half_width, C_mid, identified)
    return RunProgress(key=key, fraction=fraction, fit=fit, finished=fraction >= 1.0, **kw)


def test_every_run_reaches_the_first_rung_before_any_run_goes_further():
    runs = [at("a", 0.25, 0.8), at("b", 0.1, 0.5), at("c", 0.0)]
    assert next_move(runs, rungs=RUNGS) == Move("advance", "c", until=0.25)  # the least advanced first
    runs = [at("a", 0.25, 0.8), at("b", 0.1, 0.5), at("c", 0.25, 0.6)]
    assert next_move(runs, rungs=RUNGS) == Move("advance", "b", until=0.25)


def test_after_exploring_the_leader_runs_to_its_full_budget():
    # b has the highest asymptote lower bound; c's point estimate is higher but unidentified and wide
    runs = [at("a", 0.25, 0.6, 0.05), at("b", 0.25, 0.75, 0.03), at("c", 0.25, 0.9, 0.4, identified=False)]
    assert next_move(runs, rungs=RUNGS) == Move("advance", "b", until=1.0)


def test_with_a_finished_reference_the_best_of_the_least_advanced_runs_goes_to_its_next_rung():
    runs = [at("best", 1.0, 0.8), at("a", 0.5, 0.79, 0.1), at("b", 0.25, 0.7, 0.1), at("c", 0.25, 0.78, 0.1)]
    assert next_move(runs, rungs=RUNGS) == Move("advance", "c", until=0.5)
    runs = [at("best", 1.0, 0.8), at("a", 0.5, 0.79, 0.1), at("c", 0.5, 0.78, 0.1)]
    assert next_move(runs, rungs=RUNGS) == Move("advance", "a", until=1.0)


def test_a_run_that_cannot_reach_the_best_is_stopped_with_both_bounds_in_the_reason():
    runs = [at("best", 1.0, 0.80, 0.005), at("low", 0.5, 0.60, 0.03)]
    move = next_move(runs, rungs=RUNGS)
    assert move.kind == "stop" and move.key == "low"
    # upper bound max(0.63, 0.60 + 0.02); the best's lower bound min(0.795, 0.80 - 0.02)
    assert "0.630" in move.reason and "0.780" in move.reason


def test_a_run_within_the_noise_band_or_before_its_inflection_is_not_stopped():
    close = [at("best", 1.0, 0.80, 0.005), at("close", 0.5, 0.77, 0.005)]
    assert next_move(close, rungs=RUNGS) == Move("advance", "close", until=1.0)
    # compute 0.5 GPU-hours of a curve with C_mid 0.6: not yet past its inflection
    early = [at("best", 1.0, 0.80, 0.005), at("early", 0.5, 0.5, 0.01, C_mid=0.6)]
    assert next_move(early, rungs=RUNGS).kind == "advance"


def test_an_unset_margin_is_the_studys_noise_band_in_its_rewards_units():
    # the same runs, rewards x 100 (a percentage): 0.77 against 0.80 is 77 against 80, within 0.02 x 100
    pct = [at("best", 1.0, 80.0, 0.5, noise_band=2.0), at("close", 0.5, 77.0, 0.5, noise_band=2.0)]
    assert RungSchedule(rungs=RUNGS).next_move(pct) == Move("advance", "close", until=1.0)
    assert RungSchedule(rungs=RUNGS).stop_check(pct)(pct[1]) is None
    # a margin the rule sets is the metric's own units: 0.02 of a percentage stops it
    assert RungSchedule(rungs=RUNGS, noise_band=0.02).next_move(pct).kind == "stop"


def test_the_past_inflection_check_uses_the_fits_compute_unit():
    # the fit's C_mid is in GPU-hours: 40 GPU-hours spent is 4 x C_mid, though only half the budget
    runs = [at("best", 1.0, 0.80, 0.005), at("low", 0.5, 0.5, C_mid=10.0, compute=40.0)]
    assert next_move(runs, rungs=RUNGS).kind == "stop"
    runs = [at("best", 1.0, 0.80, 0.005), at("low", 0.5, 0.5, C_mid=10.0, compute=8.0)]
    assert next_move(runs, rungs=RUNGS).kind == "advance"


def test_none_when_every_run_is_finished_or_stopped():
    assert next_move([], rungs=RUNGS) is None
    assert next_move([at("a", 1.0, 0.8), at("b", 0.3, 0.5, stopped=True)], rungs=RUNGS) is None
    assert next_move([at("a", 0.3, 0.5, stopped=True)], rungs=RUNGS) is None


def test_a_whole_study_explores_then_finishes_the_best_run_and_never_stops_it():
    """The sweep's rung loop (runner/sweep/scheduler.py) on made-up runs whose interval on A narrows as they
    advance; each advance jumps straight to its target (no checks on the way)."""
    true_asymptote = {"a": 0.50, "b": 0.80, "c": 0.62, "d": 0.79, "e": 0.40}
    progress = {key: 0.0 for key in true_asymptote}
    stopped, moves = set(), []

    def view(key):
        fraction = progress[key]
        fit = sigmoid_fit(true_asymptote[key], 0.02 + 0.2 * (1 - fraction)) if fraction else None
        return RunProgress(key, fraction, fit, finished=fraction >= 1.0, stopped=key in stopped)

    def advance(key, until, check):
        moves.append(Move("advance", key, until=until))
        assert until > progress[key]
        progress[key] = until

    def stop(key, reason):
        moves.append(Move("stop", key, reason=reason))
        assert key not in ("b", "d")  # the best run, and one within the noise band of it
        stopped.add(key)

    schedule = RungSchedule(rungs=RUNGS)
    assert run_by_rungs(schedule, lambda: [view(key) for key in true_asymptote], advance, stop) == len(moves)
    assert [m.until for m in moves[:5]] == [0.25] * 5
    assert moves[5] == Move("advance", "b", until=1.0)
    assert stopped == {"a", "c", "e"} and progress["b"] == progress["d"] == 1.0


def test_a_curve_that_has_not_bent_is_not_stopped_even_though_it_fits_as_if_saturated_lower():
    # A slow curve (C_mid 0.3, true A 0.8, as high as the best) seen up to half its budget fits as if it saturated
    # lower (A ~0.68, C_mid ~0.24: "past its inflection"); its bootstrap percentile interval alone ended near 0.75
    # and would have stopped it. The profile likelihood keeps the later, higher asymptote possible.
    best = judged(*curve(0.80, seed=1))
    slow = judged(*curve(0.80, C_mid=0.3, B=1.2, upto=0.5, seed=0))
    assert slow.C_mid < 0.5 and slow.A < best.A - 0.1
    assert slow.A_hi >= 0.80 and not slow.identified  # the interval on A reaches the true asymptote
    assert slow.A_upper > best.A
    assert not should_stop(slow, best, max_compute=0.5).stop


def test_a_run_that_has_scored_nothing_yet_is_not_stopped():
    best = judged(*curve(0.80, seed=1))
    c = COMPUTE[COMPUTE <= 0.5]
    assert not should_stop(judged(c, np.zeros(c.size)), best, max_compute=0.5).stop


def test_without_a_profile_bound_a_run_is_never_stopped():
    best = judged(*curve(0.80, seed=1))
    worse = fit_sigmoid(*curve(0.50, upto=0.5, seed=2))  # no upper_level: A_upper is NaN
    assert np.isnan(worse.A_upper)
    assert not should_stop(worse, best, max_compute=0.5).stop
