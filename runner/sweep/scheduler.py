"""The rung scheduler of `early_terminate: asymptote`: which run advances next, where it pauses, which runs stop.

Pure: no Ray, no store, no clock. The sweep driver and bench/early_termination.py both run a study through
`run_by_rungs`; what advancing a run means (resuming an RL job from its checkpoint, or replaying a recorded
curve) is the caller's `advance` callback. The rules it applies (next_move, should_stop, reference_fit) are
rlscale.fitting.early_stop's.
"""

from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace

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
    slots: int = 1  # runs in flight at once (the sweep's bound), which times the leader's start

    @classmethod
    def from_rule(cls, rule, **overrides) -> "RungSchedule":
        """The schedule of a study's `early_terminate` rule (rlscale.planner.study.EarlyTerminate)."""
        return cls(**{"rungs": tuple(rule.rungs), "min_fraction": rule.min_fraction, "noise_band": rule.margin,
                      **overrides})

    def next_move(self, runs: list[RunProgress]) -> Move | None:
        """What to do next (see rlscale.fitting.early_stop.next_move), or None when every run is finished or stopped."""
        rank = self.rank or (lambda run: promise(run, self.noise_band))
        return next_move(runs, rungs=self.rungs, leaders=self.leaders, noise_band=self.noise_band,
                         past_inflection=self.past_inflection, rank=rank, slots=self.slots)

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


@dataclass(frozen=True)
class GridSchedule:
    """No early termination by rungs: every run goes to its full budget, in the study's order (a study with
    `early_terminate: none` or `hyperband`, whose pruner the driver asks at each checkpoint itself)."""

    def next_move(self, runs: list[RunProgress]) -> Move | None:
        """Advance the first idle unfinished run to its full budget; None when none is left idle."""
        for run in runs:
            if not run.stopped and not run.done and not run.busy:
                return Move("advance", run.key, until=1.0)
        return None

    def stop_check(self, runs: list[RunProgress]) -> StopCheck:
        return lambda run: None


def run_concurrently(schedule, progress: Callable[[], list[RunProgress]],
                     start: Callable[[Hashable, float, StopCheck], None],
                     wait: Callable[[], list[Hashable]],
                     stop: Callable[[Hashable, str], None], *,
                     admit: Callable[[Hashable], bool] | None = None, slots: int = 1,
                     max_skips: int = 4) -> int:
    """Keep up to `slots` advances in flight, each admitted by `admit`, until every run is finished or stopped;
    returns the number of moves. The one loop behind a sweep, one run at a time or many.

    schedule: RungSchedule or GridSchedule (next_move, stop_check).
    progress(): every run as the scheduler sees it now (runs in flight may carry their target; the loop sets it).
    start(key, until, check): begin advancing run `key` to `until` x its planned compute, calling check(progress)
        at its checkpoints; returns at once (or when done, for a caller that runs one thing at a time).
    wait(): block until advances end; returns their keys ([] if none ended yet: the loop asks again).
    stop(key, reason): end run `key` (in flight: at its next checkpoint; the loop waits for it to end).
    admit(key): reserve the devices run `key` needs, False when they are not free (the loop then tries the next
        move, backfilling; a run passed over `max_skips` times holds the queue until it fits, so none starves).
    RuntimeError if a run ends where it started (a job that makes no progress would loop forever). With nothing in
    flight and runs refused admission (other users hold the devices), the loop keeps asking after each wait():
    the caller checks beforehand that every run fits the empty cluster (Ledger.fits_at_all).
    """
    moves, in_flight, stopping, skipped = 0, {}, set(), {}
    before: dict[Hashable, tuple] = {}
    while True:
        runs = _overlay(progress(), in_flight, stopping)
        blocked: set[Hashable] = set()
        while len(in_flight) < slots:
            move = schedule.next_move(_overlay(runs, {**in_flight, **dict.fromkeys(blocked, 1.0)}, stopping))
            if move is None:
                break
            if move.kind == "stop":
                moves += 1
                stop(move.key, move.reason)
                if move.key in in_flight:
                    stopping.add(move.key)
                runs = _overlay(progress(), in_flight, stopping)
                continue
            if admit is not None and not admit(move.key):
                blocked.add(move.key)
                if skipped.get(move.key, 0) >= max_skips:
                    break  # passed over often enough: nothing more starts ahead of it
                continue
            moves += 1
            for key in blocked:  # runs that wait for devices while this one starts ahead of them
                skipped[key] = skipped.get(key, 0) + 1
            skipped.pop(move.key, None)
            before[move.key] = _state(runs, move.key)
            in_flight[move.key] = move.until
            start(move.key, move.until, schedule.stop_check(runs))
            runs = _overlay(runs, in_flight, stopping)
        if not in_flight and not blocked and not any(run.busy for run in runs):  # busy: waiting to be requeued
            return moves
        for key in wait():
            in_flight.pop(key, None)
            stopping.discard(key)
            now = _overlay(progress(), in_flight, stopping)
            if not _busy(now, key) and _state(now, key) == before.pop(key, None):
                raise RuntimeError(f"run {key} made no progress")


def run_by_rungs(schedule: RungSchedule, progress: Callable[[], list[RunProgress]],
                 advance: Callable[[Hashable, float, StopCheck], None],
                 stop: Callable[[Hashable, str], None]) -> int:
    """One advance at a time (run_concurrently with one slot, each advance run to its end when started); returns
    the number of moves. advance(key, until, check) runs `key` on to `until` x its planned compute, calling
    check(its progress) at each checkpoint and stopping the run there if it returns a reason."""
    ended: list[Hashable] = []

    def start(key, until, check):
        advance(key, until, check)
        ended.append(key)

    def wait():
        done, ended[:] = list(ended), []
        return done

    return run_concurrently(schedule, progress, start, wait, stop, slots=1)


def _overlay(runs: list[RunProgress], in_flight: dict, stopping: set) -> list[RunProgress]:
    """`runs` with the loop's own view: runs in flight carry their target, runs being stopped read as stopped."""
    out = []
    for run in runs:
        target = in_flight.get(run.key, run.target)
        stopped = run.stopped or run.key in stopping
        out.append(run if (target, stopped) == (run.target, run.stopped) else replace(run, target=target, stopped=stopped))
    return out


def _busy(runs: list[RunProgress], key: Hashable) -> bool:
    return next(run for run in runs if run.key == key).busy


def _state(runs: list[RunProgress], key: Hashable) -> tuple:
    run = next(run for run in runs if run.key == key)
    return run.fraction, run.stopped, run.done
