"""The rung scheduler of `early_terminate: asymptote`: which run advances next, where it pauses, which runs stop.

Pure: no Ray, no store, no clock. The sweep driver and bench/early_termination.py both run a study through
`run_by_rungs`; what advancing a run means (resuming an RL job from its checkpoint, or replaying a recorded
curve) is the caller's `advance` callback. The rules it applies (next_move, should_stop, reference_fit) are
rlscale.fitting.early_stop's.
"""

from collections.abc import Callable, Hashable
from dataclasses import dataclass

from rlscale.fitting.early_stop import (NOISE_BAND, PAST_INFLECTION, Move, RunProgress, next_move, promise,
                                        reference_fit, should_stop)

_EPS = 1e-9  # slack for fractions computed as step / planned steps

# check(progress of the advancing run) -> a reason to stop it now, or None
StopCheck = Callable[[RunProgress], str | None]


@dataclass(frozen=True)
class RungSchedule:
    """The knobs of the schedule (a study's `early_terminate` gives rungs, min_fraction and noise_band).

    rungs: fractions of each run's planned compute where runs pause, ending at 1.0.
    min_fraction: no run is judged before it has spent this fraction of its compute.
    leaders: runs finished first, most promising first, so the reference is known early.
    rank: how promising a run looks (reward units); default `promise`, the lower bound of its fitted asymptote.
    """

    rungs: tuple[float, ...] = (0.25, 0.5, 1.0)
    min_fraction: float = 0.25
    leaders: int = 1
    noise_band: float = NOISE_BAND
    past_inflection: float = PAST_INFLECTION
    rank: Callable[[RunProgress], float] | None = None

    @classmethod
    def from_rule(cls, rule, **overrides) -> "RungSchedule":
        """The schedule of a study's `early_terminate` rule (rlscale.planner.study.EarlyTerminate)."""
        return cls(**{"rungs": tuple(rule.rungs), "min_fraction": rule.min_fraction, "noise_band": rule.margin,
                      **overrides})

    def next_move(self, runs: list[RunProgress]) -> Move | None:
        """What to do next (see rlscale.fitting.early_stop.next_move), or None when every run is finished or stopped."""
        rank = self.rank or (lambda run: promise(run, self.noise_band))
        return next_move(runs, rungs=self.rungs, leaders=self.leaders, noise_band=self.noise_band,
                         past_inflection=self.past_inflection, rank=rank)

    def stop_check(self, runs: list[RunProgress]) -> StopCheck:
        """The check to apply while one run advances: a reason to stop it once it has spent min_fraction of its
        compute, is past its inflection and its asymptote's upper bound is below the reference's lower bound.

        The reference (the best finished run's fit) is taken from `runs` once: during an advance only the
        advancing run changes, and it is not finished until the advance ends."""
        reference = reference_fit(runs)

        def check(run: RunProgress) -> str | None:
            if reference is None or run.fraction < self.min_fraction - _EPS:
                return None
            compute = run.fraction if run.compute is None else run.compute
            decision = should_stop(run.fit, reference, compute, noise_band=self.noise_band,
                                   past_inflection=self.past_inflection)
            return decision.reason if decision.stop else None

        return check


def run_by_rungs(schedule: RungSchedule, progress: Callable[[], list[RunProgress]],
                 advance: Callable[[Hashable, float, StopCheck], None],
                 stop: Callable[[Hashable, str], None]) -> int:
    """Apply the schedule's moves until every run is finished or stopped; returns the number of moves.

    progress(): every run as the scheduler sees it now (RunProgress; a run stopped or failed has stopped=True).
    advance(key, until, check): run `key` on until `until` x its planned compute (0..1), then pause it; at each
        checkpoint on the way, call check(its progress) and stop the run there if it returns a reason.
    stop(key, reason): end run `key` now (it then reads as stopped in progress()).
    RuntimeError if an advance leaves a run where it was (a job that makes no progress would loop forever).
    """
    moves, runs = 0, progress()
    while (move := schedule.next_move(runs)) is not None:
        moves += 1
        if move.kind == "stop":
            stop(move.key, move.reason)
            runs = progress()
            continue
        before = _state(runs, move.key)
        advance(move.key, move.until, schedule.stop_check(runs))
        runs = progress()
        if _state(runs, move.key) == before:
            raise RuntimeError(f"run {move.key} made no progress towards {move.until:.0%} of its compute")
    return moves


def _state(runs: list[RunProgress], key: Hashable) -> tuple:
    run = next(run for run in runs if run.key == key)
    return run.fraction, run.stopped, run.done
