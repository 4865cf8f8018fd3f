"""Asymptote-based early termination (ScaleRL practice): stop a run once its fitted curve shows it
cannot reach the best run's asymptote, and a rung scheduler that decides which run of a study to advance
next so the best run is known early and the others are judged against it. Pure decision rules; the loop that
applies them is rlscale.runner.sweep.scheduler (the sweep driver and bench/early_termination.py both run it)."""

from collections.abc import Callable, Hashable
from dataclasses import dataclass

import numpy as np

from rlscale.base.numbers import NOISE_BAND
from rlscale.fitting.sigmoid import SigmoidFit


@dataclass(frozen=True)
class StopDecision:
    stop: bool
    reason: str


def asymptote_lower_bound(fit, noise_band: float = NOISE_BAND) -> float:
    """The lower end of a fit's asymptote, never tighter than the noise band (reward units)."""
    lo = fit.A_lo if np.isfinite(fit.A_lo) else fit.A
    return min(lo, fit.A - noise_band)


def asymptote_upper_bound(fit, noise_band: float = NOISE_BAND) -> float:
    """The upper end of a fit's asymptote (reward units): its profile-likelihood bound A_upper, never tighter than
    the noise band; +inf when the fit has no profile bound (fit_sigmoid without upper_level): a run is never
    stopped on less than the one-sided UPPER_LEVEL profile bound."""
    hi = fit.A_upper
    return max(hi, fit.A + noise_band) if np.isfinite(hi) else float("inf")


# The one-sided level of the profile bound the driver asks fit_sigmoid for (upper_level).
UPPER_LEVEL = 0.99
# Observed compute must reach this multiple of C_mid (the point estimate) before a run is judged: a steep curve seen
# just past its fitted C_mid can have a profile bound that excludes its true asymptote (bench/early_termination.py).
PAST_INFLECTION = 2.0


def should_stop(run_fit, best_fit, max_compute: float, *, noise_band: float = NOISE_BAND,
                past_inflection: float = PAST_INFLECTION) -> StopDecision:
    """Stop `run_fit`'s run when it is past its inflection (max_compute >= past_inflection x C_mid) and the upper
    bound of its asymptote (the profile bound, see asymptote_upper_bound) is below the lower bound of the best
    run's; both bounds are at least the noise band wide."""
    if run_fit is None or best_fit is None or run_fit is best_fit:
        return StopDecision(False, "")
    if not best_fit.identified:
        return StopDecision(False, "")
    if max_compute < past_inflection * run_fit.C_mid:
        return StopDecision(False, "")  # before the inflection A is not identified
    upper = asymptote_upper_bound(run_fit, noise_band)
    lower = asymptote_lower_bound(best_fit, noise_band)
    if upper < lower:
        return StopDecision(True, f"asymptote at most {upper:.3f} < best run's lower bound {lower:.3f}")
    return StopDecision(False, "")


def best_fit_of(fits: dict) -> object | None:
    """The identified fit with the highest asymptote lower bound, or None (fits: key -> SigmoidFit | None)."""
    candidates = [f for f in fits.values() if f is not None and f.identified]
    if not candidates:
        return None
    return max(candidates, key=asymptote_lower_bound)


# The rung scheduler -------------------------------------------------------------------------------------------

_EPS = 1e-9  # slack for fractions computed as step / planned steps


@dataclass(frozen=True)
class RunProgress:
    """One run of a study as the scheduler sees it.

    fraction: planned compute spent so far, 0..1: the driver uses last step / planned steps.
    fit: sigmoid fit on the run's evaluations so far (compute on the x axis), None when not fittable yet.
    finished: the run reached its planned compute; fraction >= 1 counts as finished too.
    last_reward: the latest evaluation; ranks runs that have no fit yet.
    compute: the largest compute in `fit`, in the fit's unit (the driver: the run's GPU-hours so far); tells
        whether the run is past its inflection. None means the fit's x axis is the fraction itself.
    stopped: the run was stopped or failed; it is ignored, as if left out of the list.
    target: where the run's advance in flight is heading (0..1), None when no job of it runs: a sweep with several
        runs in flight never hands a busy run another move, and counts one heading to 1.0 as a leader on its way.
    """

    key: Hashable
    fraction: float
    fit: SigmoidFit | None
    finished: bool
    last_reward: float | None = None
    compute: float | None = None
    stopped: bool = False
    target: float | None = None

    @property
    def busy(self) -> bool:
        """An advance of this run is in flight."""
        return self.target is not None

    @property
    def done(self) -> bool:
        """Finished and not stopped: its fit can be the reference the others must reach."""
        return not self.stopped and (self.finished or self.fraction >= 1.0 - _EPS)


@dataclass(frozen=True)
class Move:
    """What the sweep does next: "advance" runs `key` until `until` x its planned compute (0..1);
    "stop" ends run `key`, and `reason` says why in one line for the user."""

    kind: str
    key: Hashable
    until: float = 1.0
    reason: str = ""


def reference_fit(runs: list[RunProgress]) -> SigmoidFit | None:
    """The fit the unfinished runs must reach: among finished runs, the identified fit with the highest asymptote
    lower bound (None when no finished run has an identified fit). The checks during an advance use it too."""
    return best_fit_of({run.key: run.fit for run in runs if run.done})


def promise(run: RunProgress, noise_band: float = NOISE_BAND) -> float:
    """How good a run looks so far (reward units): the lower bound of its fitted asymptote, else its latest
    reward, else -inf. The lower bound, not A: a curve before its inflection often fits A near 1."""
    if run.fit is not None:
        return float(asymptote_lower_bound(run.fit, noise_band))
    return float(run.last_reward) if run.last_reward is not None else float("-inf")


def next_move(runs: list[RunProgress], *, rungs: tuple[float, ...], leaders: int = 1,
              noise_band: float = NOISE_BAND, past_inflection: float = PAST_INFLECTION,
              rank: Callable[[RunProgress], float] | None = None, slots: int = 1) -> Move | None:
    """The next thing the sweep should do, or None when every run is finished, stopped or busy (in flight).

    In this order:
    1. stop an unfinished run that `should_stop` says cannot reach `reference_fit(runs)`;
    2. explore: advance the least advanced run that is below the first rung to that rung;
    3. leader: while fewer than `leaders` runs have finished with an identified fit, run the most
       promising one (by `rank`, default `promise`) to its full budget, so the reference is known, and tight, early;
    4. advance, to its next rung, the most promising of the runs at the lowest rung (breadth first:
       at each rung the best-looking run goes ahead first, and once all survivors sit at the last rung
       before 1.0 they finish one by one, best first, each raising the reference for the rest).
    With `slots` > 1 (runs in flight at once) rule 3 takes one leader more and comes before rule 2 once the runs
    still to explore take no longer on the other slots than a leader takes to finish.
    Runs in flight (`busy`) are judged by rule 1 like the others (the sweep stops them at their next checkpoint)
    but get no advance, and one heading to its full budget counts as a leader in rule 3; the sweep asks again
    each time a slot frees, as ASHA promotes asynchronously.
    Pure: the same progress always gives the same move; ties go to the earlier run in `runs`.
    """
    active = [run for run in runs if not run.stopped and not run.done]
    best = reference_fit(runs)
    for run in active:
        compute = run.fraction if run.compute is None else run.compute
        decision = should_stop(run.fit, best, compute, noise_band=noise_band, past_inflection=past_inflection)
        if decision.stop:
            return Move("stop", run.key, reason=decision.reason)
    idle = [run for run in active if not run.busy]  # a run in flight gets no second move
    if not idle:
        return None
    if rank is None:
        def rank(run):
            return promise(run, noise_band)

    behind = [run for run in idle if run.fraction < rungs[0] - _EPS]
    identified = sum(1 for run in runs if run.done and run.fit is not None and run.fit.identified)
    on_their_way = sum(1 for run in active if run.busy and run.target >= 1.0 - _EPS)
    if slots > 1:  # the first leader is picked from the runs explored so far: a second raises the reference sooner
        leaders += 1
    explored = [run for run in idle if run.fraction >= rungs[0] - _EPS]
    # with several slots the leader starts while the last runs are explored, timed to finish as they do, so the
    # reference is there when the promotions begin: exploring `behind` on the other slots takes
    # len(behind) x rungs[0] / (slots - 1) runs' time, the leader (1 - rungs[0]) of one
    early = slots > 1 and len(behind) * rungs[0] <= (slots - 1) * (1.0 - rungs[0])
    if identified + on_their_way < leaders and explored and (not behind or early):
        return Move("advance", max(explored, key=rank).key, until=1.0)
    if behind:
        return Move("advance", min(behind, key=lambda run: run.fraction).key, until=rungs[0])
    if identified + on_their_way < leaders:
        return Move("advance", max(idle, key=rank).key, until=1.0)

    def rungs_reached(run):
        return sum(1 for rung in rungs if rung <= run.fraction + _EPS)

    lowest = min(rungs_reached(run) for run in idle)
    leader = max((run for run in idle if rungs_reached(run) == lowest), key=rank)
    until = min((rung for rung in rungs if rung > leader.fraction + _EPS), default=1.0)
    return Move("advance", leader.key, until=until)
