"""Scheduling a sweep: which run advances next, where it pauses, which runs stop, and the loop keeping runs in flight.
Pure (no Ray, store or clock): the driver and the benchmarks share it; advancing a run is the caller's `start`."""

from abc import ABC
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace

from rlscale.fitting.rules.early_stop import PAST_INFLECTION, asymptote_lower_bound, best_fit_of, should_stop
from rlscale.fitting.sigmoid import SigmoidFit

from rlscale.base.numbers import NOISE_BAND

_EPS = 1e-9  # slack for fractions computed as step / planned steps


@dataclass(frozen=True)
class RunProgress:
    """One run of a study as the scheduler sees it; a stopped (or failed) run is ignored, as if left out."""

    key: Hashable
    fraction: float  # planned compute spent, 0..1 (the driver: last step / planned steps)
    fit: SigmoidFit | None  # on the run's evaluations so far; None until fittable
    finished: bool
    last_reward: float | None = None  # ranks runs without a fit yet
    compute: float | None = None  # the fit's largest x, in its unit, for the inflection test; None: x is `fraction`
    stopped: bool = False
    target: float | None = None  # where its advance in flight heads (0..1); None when none is in flight
    noise_band: float = NOISE_BAND  # the study's, in its reward's units (fitting.sigmoid.points.RewardScale)

    @property
    def busy(self) -> bool:
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
    """The fit to reach: the finished runs' identified fit with the highest asymptote lower bound (None if none)."""
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
    """The next move, or None when every run is finished, stopped or busy; pure, ties go to the earlier run. In order:
    stop hopeless runs, explore to the first rung, run leaders to the end, promote the best at the lowest rung."""
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
    rank = rank or (lambda run: promise(run, noise_band))
    behind = [run for run in idle if run.fraction < rungs[0] - _EPS]
    identified = sum(1 for run in runs if run.done and run.fit is not None and run.fit.identified)
    on_their_way = sum(1 for run in active if run.busy and run.target >= 1.0 - _EPS)
    if slots > 1:  # the first leader is picked from the runs explored so far: a second raises the reference sooner
        leaders += 1
    explored = [run for run in idle if run.fraction >= rungs[0] - _EPS]
    # the leader starts while the last runs explore, timed to finish with them: the reference is ready to promote
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
    """The one early-termination interface: `next_move`, the `stop_check` of a run in flight at its checkpoints, and
    `ended`. none: GridSchedule; asymptote: RungSchedule; hyperband: HyperbandSchedule (Optuna's pruner)."""

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
    """`early_terminate: asymptote`: runs pause at rungs and are judged against the best finished run; by_rungs False
    advances each run to its end in order (a bayes trial), judged only at its checkpoints."""

    rungs: tuple[float, ...] = (0.25, 0.5, 1.0)  # fractions of planned compute where runs pause, ending at 1.0
    min_fraction: float = 0.25  # no run is judged before spending this fraction of its compute
    leaders: int = 1  # runs finished first, most promising first, so the reference is known early
    noise_band: float | None = None  # the margin in reward units; None: the runs' own (their study's noise band)
    past_inflection: float = PAST_INFLECTION
    rank: Callable[[RunProgress], float] | None = None  # how promising a run looks (reward units); None: `promise`
    by_rungs: bool = True

    def band(self, runs: list[RunProgress]) -> float:
        """The margin the runs are judged with: the rule's, else their study's noise band."""
        return self.noise_band if self.noise_band is not None else (runs[0].noise_band if runs else NOISE_BAND)

    @classmethod
    def from_rule(cls, rule, **overrides) -> "RungSchedule":
        """The schedule of a study's `early_terminate` rule (rlscale.planner.study.EarlyTerminate)."""
        return cls(
            **{"rungs": tuple(rule.rungs), "min_fraction": rule.min_fraction, "noise_band": rule.margin, **overrides}
        )

    def next_move(self, runs: list[RunProgress], slots: int = 1) -> Move | None:
        if not self.by_rungs:
            return super().next_move(runs, slots)
        return next_move(
            runs,
            rungs=self.rungs,
            leaders=self.leaders,
            noise_band=self.band(runs),
            past_inflection=self.past_inflection,
            rank=self.rank,
            slots=slots,
        )

    def stop_check(self, runs: list[RunProgress]) -> StopCheck:
        """A reason to stop the advancing run past min_fraction and its inflection whose asymptote's upper bound is
        below the reference's lower bound; the reference is taken once, as only the advancing run changes."""
        reference, band = reference_fit(runs), self.band(runs)

        def check(run: RunProgress) -> str | None:
            if reference is None or run.fraction < self.min_fraction - _EPS:
                return None
            compute = run.fraction if run.compute is None else run.compute
            decision = should_stop(run.fit, reference, compute, noise_band=band, past_inflection=self.past_inflection)
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
    """The Schedule of a study's `early_terminate` rule (by_rungs False: bayes trials, judged at checkpoints only);
    hyperband needs the runs' planned `steps` and `evaluations(key)`."""
    if rule.type == "asymptote":
        return RungSchedule.from_rule(rule, by_rungs=by_rungs)
    if rule.type == "hyperband":
        return HyperbandSchedule(rule, steps=steps, evaluations=evaluations, seed=seed, study=study)
    return GridSchedule()


def run_concurrently(
    schedule,
    progress: Callable[[], list[RunProgress]],
    # advance to `until` x planned compute; check(progress) at its checkpoints
    start: Callable[[Hashable, float, StopCheck], None],
    wait: Callable[[], list[Hashable]],  # blocks until advances end: their keys ([]: the loop asks again)
    stop: Callable[[Hashable, str], None],  # end the run (one in flight: at its next checkpoint)
    *,
    admit: Callable[[Hashable], bool] | None = None,  # reserve the run's devices; False: backfill with the next move
    slots: int = 1,
    max_skips: int = 4,  # a run passed over this often holds the queue until it fits, so none starves
) -> int:
    """Keep up to `slots` advances in flight until every run is finished or stopped; returns the number of moves.
    RuntimeError if a run ends where it started (a job making no progress would loop forever)."""
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


def _overlay(runs: list[RunProgress], in_flight: dict, stopping: set) -> list[RunProgress]:
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
