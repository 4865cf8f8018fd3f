"""Scheduling a sweep: which run advances next, where it pauses, which runs stop, and the loop that keeps runs in
flight. The types (RunProgress, Move), the rules (next_move: rungs; the early-termination rules in Schedule) and the
loop (run_concurrently) live here together.

Pure: no Ray, no store, no clock. The sweep driver and the benchmarks (bench/early_termination.py,
bench/cluster_schedule.py) run studies through the same loop; what advancing a run means (resuming an RL job from
its checkpoint, or replaying a recorded curve) is the caller's `start` callback. The statistical rule a run is
stopped by (its asymptote's upper bound below the best run's lower bound) is rlscale.fitting.rules.early_stop's.
"""

from abc import ABC
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace

from rlscale.fitting.rules.early_stop import PAST_INFLECTION, asymptote_lower_bound, best_fit_of, should_stop
from rlscale.fitting.sigmoid import SigmoidFit

from rlscale.base.numbers import NOISE_BAND

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


def next_move(
    runs: list[RunProgress],
    *,
    rungs: tuple[float, ...],
    leaders: int = 1,
    noise_band: float = NOISE_BAND,
    past_inflection: float = PAST_INFLECTION,
    rank: Callable[[RunProgress], float] | None = None,
    slots: int = 1,
) -> Move | None:
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


# check(progress of the advancing run) -> a reason to stop it now, or None
StopCheck = Callable[[RunProgress], str | None]


class Schedule(ABC):
    """The one early-termination interface: what to advance next (`next_move`), the check applied to a run in
    flight at each of its checkpoints (`stop_check`), and what to remember when a run ends for good (`ended`).
    `early_terminate: none` is a Schedule that stops nothing (GridSchedule), `asymptote` one that judges runs at
    rungs (RungSchedule), `hyperband` one that asks Optuna's pruner (HyperbandSchedule)."""

    def next_move(self, runs: list[RunProgress], slots: int = 1) -> Move | None:
        """Advance the first idle unfinished run to its full budget; None when none is left idle."""
        for run in runs:
            if not run.stopped and not run.done and not run.busy:
                return Move("advance", run.key, until=1.0)
        return None

    def stop_check(self, runs: list[RunProgress]) -> StopCheck:
        """The check to apply while one run advances, given every run as it is when the advance starts."""
        return lambda run: None

    def ended(self, key: Hashable, reward: float | None) -> None:
        """A run ended for good: its final reward, None when it failed or was stopped."""


class GridSchedule(Schedule):
    """No early termination: every run goes to its full budget, in the study's order."""


@dataclass(frozen=True)
class RungSchedule(Schedule):
    """`early_terminate: asymptote`: runs pause at rungs and are judged against the best finished run.

    rungs: fractions of each run's planned compute where runs pause, ending at 1.0.
    min_fraction: no run is judged before it has spent this fraction of its compute.
    leaders: runs finished first, most promising first, so the reference is known early.
    rank: how promising a run looks (reward units); default `promise`, the lower bound of its fitted asymptote.
    by_rungs: False advances every run to its end in order (a bayes trial), judging it only at its checkpoints.
    """

    rungs: tuple[float, ...] = (0.25, 0.5, 1.0)
    min_fraction: float = 0.25
    leaders: int = 1
    noise_band: float = NOISE_BAND
    past_inflection: float = PAST_INFLECTION
    rank: Callable[[RunProgress], float] | None = None
    by_rungs: bool = True

    @classmethod
    def from_rule(cls, rule, **overrides) -> "RungSchedule":
        """The schedule of a study's `early_terminate` rule (rlscale.planner.study.EarlyTerminate)."""
        return cls(
            **{"rungs": tuple(rule.rungs), "min_fraction": rule.min_fraction, "noise_band": rule.margin, **overrides}
        )

    def next_move(self, runs: list[RunProgress], slots: int = 1) -> Move | None:
        """What to do next (see next_move), or None when every run is finished, stopped or busy."""
        if not self.by_rungs:
            return super().next_move(runs, slots)
        rank = self.rank or (lambda run: promise(run, self.noise_band))
        return next_move(
            runs,
            rungs=self.rungs,
            leaders=self.leaders,
            noise_band=self.noise_band,
            past_inflection=self.past_inflection,
            rank=rank,
            slots=slots,
        )

    def stop_check(self, runs: list[RunProgress]) -> StopCheck:
        """A reason to stop the advancing run once it has spent min_fraction of its compute, is past its
        inflection and its asymptote's upper bound is below the reference's lower bound. The reference (the best
        finished run's fit) is taken from `runs` once: during an advance only the advancing run changes."""
        reference = reference_fit(runs)

        def check(run: RunProgress) -> str | None:
            if reference is None or run.fraction < self.min_fraction - _EPS:
                return None
            compute = run.fraction if run.compute is None else run.compute
            decision = should_stop(
                run.fit, reference, compute, noise_band=self.noise_band, past_inflection=self.past_inflection
            )
            return decision.reason if decision.stop else None

        return check


class HyperbandSchedule(Schedule):
    """`early_terminate: hyperband`: every run to its end in order; Optuna's HyperbandPruner judges each at its
    checkpoints on its evaluations so far (`evaluations(key)` -> [(step, reward)]), one trial per run."""

    def __init__(
        self,
        rule,
        *,
        steps: int,
        evaluations: Callable[[Hashable], list[tuple[int, float]]],
        seed: int = 0,
        study: str = "rlscale",
    ):
        from rlscale.runner.sweep.hyperband import HyperbandStopper

        self.pruner = HyperbandStopper(steps, rule.min_fraction, rule.eta, seed=seed, study=study)
        self.evaluations = evaluations

    def stop_check(self, runs: list[RunProgress]) -> StopCheck:
        return lambda run: self.pruner.check(run.key, self.evaluations(run.key))

    def ended(self, key: Hashable, reward: float | None) -> None:
        self.pruner.finish(key, reward)


def schedule_for(
    rule, *, by_rungs: bool = True, steps: int = 1, evaluations=None, seed: int = 0, study: str = "rlscale"
) -> Schedule:
    """The Schedule of a study's `early_terminate` rule; `by_rungs` False: runs advance to their end in order and
    are judged at their checkpoints only (bayes trials). hyperband needs the runs' planned `steps` and
    `evaluations(key)`."""
    if rule.type == "asymptote":
        return RungSchedule.from_rule(rule, by_rungs=by_rungs)
    if rule.type == "hyperband":
        return HyperbandSchedule(rule, steps=steps, evaluations=evaluations, seed=seed, study=study)
    return GridSchedule()


def run_concurrently(
    schedule,
    progress: Callable[[], list[RunProgress]],
    start: Callable[[Hashable, float, StopCheck], None],
    wait: Callable[[], list[Hashable]],
    stop: Callable[[Hashable, str], None],
    *,
    admit: Callable[[Hashable], bool] | None = None,
    slots: int = 1,
    max_skips: int = 4,
) -> int:
    """Keep up to `slots` advances in flight, each admitted by `admit`, until every run is finished or stopped;
    returns the number of moves. The one loop behind a sweep, one run at a time or many.

    schedule: the Schedule (next_move, stop_check).
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
            move = schedule.next_move(_overlay(runs, {**in_flight, **dict.fromkeys(blocked, 1.0)}, stopping), slots)
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


def run_by_rungs(
    schedule: RungSchedule,
    progress: Callable[[], list[RunProgress]],
    advance: Callable[[Hashable, float, StopCheck], None],
    stop: Callable[[Hashable, str], None],
) -> int:
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
        out.append(
            run if (target, stopped) == (run.target, run.stopped) else replace(run, target=target, stopped=stopped)
        )
    return out


def _busy(runs: list[RunProgress], key: Hashable) -> bool:
    return next(run for run in runs if run.key == key).busy


def _state(runs: list[RunProgress], key: Hashable) -> tuple:
    run = next(run for run in runs if run.key == key)
    return run.fraction, run.stopped, run.done
