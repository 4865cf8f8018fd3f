"""The rung scheduler (runner/sweep/scheduler.py) driven directly: synthetic reward curves in, the moves and
the compute spent out. No Ray and no store: the same loop SweepDriver and bench/early_termination.py run."""

import numpy as np
import pytest
from helpers import bench_module
from rlscale.fitting.rules.early_stop import UPPER_LEVEL
from rlscale.fitting.sigmoid import FitError, fit_sigmoid, sigmoid
from rlscale.planner.study import EarlyTerminate
from rlscale.runner.sweep.scheduler import RungSchedule, RunProgress

run_by_rungs = bench_module("early_termination").run_by_rungs  # run_concurrently with one slot
EVALS = 40
COMPUTE = np.linspace(1 / EVALS, 1.0, EVALS)  # one eval every 1/40 of each run's budget


class ReplayedStudy:
    """Runs with known sigmoid curves (binomial noise over 2,048 samples), advanced eval by eval, fitted as the
    driver fits them (bootstrap, and the profile bound on A); the stop check is asked every `check_every` evals."""

    def __init__(self, asymptotes: dict, C_mid: float = 0.05, check_every: int = 2, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.asymptotes = asymptotes
        self.reward = {
            key: rng.binomial(2048, sigmoid(COMPUTE, A, 2.0, C_mid, 0.15)) / 2048 for key, A in asymptotes.items()
        }
        self.seen = dict.fromkeys(asymptotes, 0)
        self.stopped: dict = {}  # key -> reason
        self.check_every = check_every
        self.advances: list[tuple] = []  # (key, from fraction, until)
        self.stop_moves: list = []
        self._fits: dict = {}

    def fit(self, key, n):
        if n < 4:
            return None
        if (key, n) not in self._fits:
            try:
                self._fits[key, n] = fit_sigmoid(
                    np.r_[0.0, COMPUTE[:n]], np.r_[0.15, self.reward[key][:n]], bootstrap=50, upper_level=UPPER_LEVEL
                )
            except FitError:
                self._fits[key, n] = None
        return self._fits[key, n]

    def view(self, key) -> RunProgress:
        n = self.seen[key]
        return RunProgress(
            key=key,
            fraction=float(COMPUTE[n - 1]) if n else 0.0,
            fit=self.fit(key, n),
            finished=n == EVALS,
            last_reward=float(self.reward[key][n - 1]) if n else None,
            stopped=key in self.stopped,
        )

    def progress(self):
        return [self.view(key) for key in self.asymptotes]

    def advance(self, key, until, check):
        self.advances.append((key, self.view(key).fraction, until))
        target = int(np.searchsorted(COMPUTE, until + 1e-9))
        for j in range(self.seen[key], target):
            self.seen[key] = j + 1
            if (j + 1) % self.check_every == 0 and (reason := check(self.view(key))):
                self.stopped[key] = reason
                return

    def stop(self, key, reason):
        self.stop_moves.append(key)
        self.stopped[key] = reason

    def spent(self) -> float:
        return sum(float(COMPUTE[n - 1]) for n in self.seen.values() if n)


def test_a_study_finishes_its_best_run_and_stops_the_clearly_worse_ones_for_far_less_compute():
    study = ReplayedStudy({"a": 0.50, "b": 0.62, "best": 0.80, "close": 0.79, "d": 0.45})
    moves = run_by_rungs(RungSchedule(), study.progress, study.advance, study.stop)
    # every run reaches the first rung (a quarter of its compute) before any goes further
    assert sorted(key for key, _, until in study.advances[:5]) == sorted(study.asymptotes)
    assert all(until == 0.25 for _, _, until in study.advances[:5])
    assert study.seen["best"] == EVALS and "best" not in study.stopped
    assert "close" not in study.stopped  # within the 0.02 noise band of the best: never judged worse
    assert set(study.stopped) == {"a", "b", "d"}
    assert all("best run's lower bound" in reason for reason in study.stopped.values())
    assert study.spent() < 0.6 * len(study.asymptotes)  # against the full grid's 5 budgets
    assert moves == len(study.advances) + len(study.stop_moves)  # a stop during an advance is not a move of its own


def test_a_run_can_be_stopped_mid_rung_by_the_check_during_its_advance():
    # C_mid 0.15: at the first rung (0.25) no run is past its inflection (2 x C_mid), so none can be judged yet
    study = ReplayedStudy({"best": 0.80, "low": 0.45}, C_mid=0.15, check_every=1)
    run_by_rungs(RungSchedule(rungs=(0.25, 1.0)), study.progress, study.advance, study.stop)
    # after the leader finished, `low` advances from 0.25 towards 1.0 and is stopped on the way, past 0.3
    assert study.advances[-1][0] == "low" and study.advances[-1][2] == 1.0 and not study.stop_moves
    assert 0.3 <= COMPUTE[study.seen["low"] - 1] < 0.5 and "low" in study.stopped


def test_the_check_judges_nobody_before_a_run_has_finished_or_before_min_fraction():
    schedule = RungSchedule(min_fraction=0.5)
    study = ReplayedStudy({"best": 0.80, "low": 0.40})
    study.seen = {"best": EVALS, "low": 16}  # low at 0.4 of its budget, already far below the best
    check = schedule.stop_check(study.progress())
    assert check(study.view("low")) is None  # before min_fraction (0.5)
    study.seen["low"] = 24
    assert "best run's lower bound" in check(study.view("low"))
    nothing_finished = schedule.stop_check([study.view("low")])
    assert nothing_finished(study.view("low")) is None  # no reference yet


def test_an_advance_that_makes_no_progress_is_an_error_not_an_endless_loop():
    study = ReplayedStudy({"a": 0.6, "b": 0.7})
    with pytest.raises(RuntimeError, match="made no progress"):
        run_by_rungs(RungSchedule(), study.progress, lambda key, until, check: None, study.stop)


def test_the_schedule_of_a_study_rule_uses_its_rungs_min_fraction_and_margin():
    rule = EarlyTerminate(type="asymptote", min_fraction=0.125, margin=0.03)
    schedule = RungSchedule.from_rule(rule)
    assert schedule.rungs == (0.125, 0.25, 0.5, 1.0) and schedule.min_fraction == 0.125
    assert schedule.noise_band == 0.03
    assert RungSchedule.from_rule(rule, leaders=2).leaders == 2


class ConcurrentReplay(ReplayedStudy):
    """The same runs advanced side by side: each tick of wait() every run in flight observes one more eval (a
    run stopped while in flight ends at its next check), as jobs on a cluster progress together."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.flight: dict = {}  # key -> (until, check)
        self.most_in_flight = 0
        self.requested_stops: dict = {}

    def start(self, key, until, check):
        self.advances.append((key, self.view(key).fraction, until))
        self.flight[key] = (until, check)
        self.most_in_flight = max(self.most_in_flight, len(self.flight))

    def stop(self, key, reason):
        self.stop_moves.append(key)
        if key in self.flight:
            self.requested_stops[key] = reason
        else:
            self.stopped[key] = reason

    def wait(self):
        ended = []
        for key, (until, check) in list(self.flight.items()):
            self.seen[key] += 1
            j = self.seen[key]
            checked = j % self.check_every == 0
            if checked and key in self.requested_stops:
                self.stopped[key] = self.requested_stops.pop(key)
            elif checked and (reason := check(self.view(key))):
                self.stopped[key] = reason
            if key in self.stopped or COMPUTE[j - 1] >= until - 1e-9:
                ended.append(key)
                del self.flight[key]
        return ended


def test_concurrent_rungs_fill_the_slots_finish_the_best_and_stop_only_clearly_worse_runs():
    from rlscale.runner.sweep.scheduler import run_concurrently

    study = ConcurrentReplay({"a": 0.50, "b": 0.62, "best": 0.80, "close": 0.79, "d": 0.45, "e": 0.55})
    run_concurrently(RungSchedule(), study.progress, study.start, study.wait, study.stop, slots=3)
    assert study.most_in_flight == 3  # the slots are used, never exceeded
    assert study.seen["best"] == EVALS and "best" not in study.stopped
    assert "close" not in study.stopped and study.seen["close"] == EVALS  # within the noise band: never judged worse
    assert set(study.stopped) <= {"a", "b", "d", "e"} and len(study.stopped) >= 3
    assert all("best run's lower bound" in reason for reason in study.stopped.values())
    assert all(study.seen[key] == EVALS or key in study.stopped for key in study.asymptotes)  # every run ends
    assert study.spent() < 0.7 * len(study.asymptotes)


def test_admission_backfills_small_runs_but_never_starves_a_large_one():
    from rlscale.runner.sweep.admission import Ledger
    from rlscale.runner.sweep.scheduler import GridSchedule, run_concurrently

    keys = ["small0", "big", *(f"small{i}" for i in range(1, 12))]
    study = ConcurrentReplay(dict.fromkeys(keys, 0.7))
    devices = {key: [{"GPU": 8.0 if key == "big" else 2.0}] for key in keys}
    ledger = Ledger(nodes=[{"GPU": 8.0}])
    started, most_gpus = [], [0.0]

    def admit(key):
        if not ledger.admit(key, devices[key]):
            return False
        started.append(key)
        most_gpus[0] = max(most_gpus[0], ledger.busy("GPU"))
        return True

    def wait():
        ended = study.wait()
        for key in ended:
            ledger.release(key)
        return ended

    run_concurrently(
        GridSchedule(), study.progress, study.start, wait, lambda key, reason: None, admit=admit, slots=8, max_skips=2
    )
    assert sorted(started) == sorted(keys) and all(study.seen[key] == EVALS for key in keys)
    assert most_gpus[0] <= 8.0  # never more than the cluster
    # the 8-GPU run waited while 2-GPU runs backfilled, then held the queue until the cluster drained for it
    assert 1 < started.index("big") < len(keys) - 1
