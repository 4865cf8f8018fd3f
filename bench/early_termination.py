"""Replay recorded reward curves through the sweep's early-termination rules.

Question (issue 6): does asymptote-based termination pick the same best configuration as running the full
grid while spending at most half its compute, and how does Optuna's Hyperband pruner do on the same curves?

Curves: ScaleRL-shaped sigmoids R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) for a 12-point grid, observed at
step 0 (compute 0, as the driver records) and at 40 evaluations up to the per-run budget, with binomial noise
(eval pass rate over 2,048 samples: sd <= 0.011, the 1% noise of the fit benchmark); A ~ U(0.45, 0.85),
B ~ U(1, 2.5), R0 ~ U(0.1, 0.2). The full grid's pick is the run with the highest fitted asymptote on its whole
curve. Compute fraction = compute spent / the full grid's (12 budgets).

How far past their inflection the runs are planned decides what any asymptote rule can save: a run cannot be
judged before its curve bends. So the studies are replayed in three regimes of C_mid as a fraction of the
per-run budget (REGIMES): "late" (C_mid 8-30% of the budget: runs end at 3.3-12x C_mid), "mid" (4-15%) and
"early" (2-8%: runs planned to 12-50x C_mid, as a study planned to extrapolate from well past the bend would be).

Asymptote rule: the sweep driver's loop itself. Each study goes through `run_by_rungs` (below): `run_concurrently`
(runner/sweep/scheduler.py), the loop SweepDriver runs, with one slot: every run's progress and its sigmoid fit so far
(bootstrap 100, and the profile-likelihood upper bound on A at early_stop.UPPER_LEVEL) go in, `next_move`
(runner/sweep/scheduler.py) says what to do next; an "advance" replays that run's evals up to the move's fraction of
its budget (rung boundaries fall on evaluations), asking the scheduler's stop check every other eval (it judges
from a quarter of the budget on, against `reference_fit`, the best finished run), so a run can also stop
mid-rung. The pick is the finished run with the highest fitted asymptote. "floor": the same check with the
final reference known from the start, each other run stopped at its first check that fires: what a scheduler
that guessed the best run right away would spend (the scheduler can come in a little under it when a partial
fit stops the run whose full curve ends with the highest lower bound).

Hyperband: Optuna's HyperbandPruner (min resource 4 evals, eta 3) on the same studies, runs one after another
in a random order per replicate, as on a single host; the pick is the completed trial with the highest fitted
asymptote.

Writes bench/results/early_termination.json (one entry per regime); `--variants N` measures instead the variants
in VARIANTS on N studies of the "late" regime (stored under "variants", beside the regimes' results).
"""

import argparse
import json
import time
from collections.abc import Callable, Hashable
from pathlib import Path

import numpy as np
from rlscale.fitting.rules import early_stop
from rlscale.fitting.rules.early_stop import best_fit_of
from rlscale.fitting.sigmoid import FitError, fit_sigmoid, sigmoid
from rlscale.planner.study import EarlyTerminate
from rlscale.runner.sweep.scheduler import RungSchedule, RunProgress, StopCheck, run_concurrently

N_RUNS, N_EVALS, EVAL_SAMPLES, REPLICATES = 12, 40, 2048, 100
# C_mid drawn uniformly from this range, as a fraction of the per-run budget (see the module docstring)
REGIMES = {"late": (0.08, 0.3), "mid": (0.04, 0.15), "early": (0.02, 0.08)}
RULE = EarlyTerminate(type="asymptote")  # a study's defaults, as the driver applies them
SCHEDULE = RungSchedule.from_rule(RULE)
MIN_FRACTION = RULE.min_fraction  # no run is judged before this fraction of its budget
CHECK_EVERY = 2  # evals between the stop checks during an advance (the driver checks at each checkpoint)
WITHIN = 0.02  # "best within noise": the pick's true asymptote is within this of the grid pick's


def by_asymptote(run) -> float:
    """Rank runs by their fitted asymptote's point estimate, else their latest evaluation."""
    if run.fit is not None:
        return float(run.fit.A)
    return by_last_reward(run)


def by_last_reward(run) -> float:
    """Rank runs by their latest evaluation."""
    return float(run.last_reward) if run.last_reward is not None else float("-inf")


# Variants of the default schedule: RungSchedule fields (rank: how runs are ranked), plus "upper_level" (the
# profile bound's level) and "check_every" (evals between the checks during an advance).
CHOSEN = "default: rungs 25/50/100, 1 leader, rank by A lower bound, profile bound 0.99, 2 x C_mid"
VARIANTS = {
    CHOSEN: {},
    "profile bound at one-sided 0.975": {"upper_level": 0.975},
    "profile bound at one-sided 0.995": {"upper_level": 0.995},
    "no past-inflection check (the profile bound alone)": {"past_inflection": 0.0},
    "past inflection 1 x C_mid": {"past_inflection": 1.0},
    "rank by A point estimate": {"rank": by_asymptote},
    "rank by latest reward": {"rank": by_last_reward},
    "0 leaders": {"leaders": 0},
    "2 leaders": {"leaders": 2},
    "rungs 25/100": {"rungs": (0.25, 1.0)},
    "rungs 25/50/75/100": {"rungs": (0.25, 0.5, 0.75, 1.0)},
    "check every eval": {"check_every": 1},
    "check every 5th eval (driver defaults: eval 10, checkpoint 50 steps)": {"check_every": 5},
    "noise band 0.01 (weaker)": {"noise_band": 0.01},
}


def make_study(rng, c_mid_range=REGIMES["late"], n_runs=N_RUNS) -> list[dict]:
    """One study's true curves and their noisy eval records (compute in GPU-hours, budget 1.0 per run): the eval
    at step 0 (compute 0), which the driver records and fits too, then N_EVALS up to the budget."""
    runs = []
    for _ in range(n_runs):
        A = rng.uniform(0.45, 0.85)
        B = rng.uniform(1.0, 2.5)
        C_mid = rng.uniform(*c_mid_range)
        R0 = rng.uniform(0.1, 0.2)
        compute = np.linspace(1.0 / N_EVALS, 1.0, N_EVALS)
        truth = sigmoid(compute, A, B, C_mid, R0)
        reward = rng.binomial(EVAL_SAMPLES, truth) / EVAL_SAMPLES
        step0 = rng.binomial(EVAL_SAMPLES, R0) / EVAL_SAMPLES
        runs.append({"A": A, "compute": compute, "reward": reward, "step0_reward": step0})
    return runs


def fit(run, n, bootstrap=100, upper_level=None):
    """The sigmoid fit of a run's step-0 eval and its first n evals, as the driver makes it."""
    try:
        return fit_sigmoid(
            np.r_[0.0, run["compute"][:n]],
            np.r_[run["step0_reward"], run["reward"][:n]],
            bootstrap=bootstrap,
            upper_level=upper_level,
        )
    except FitError:
        return None


def full_grid_best(runs) -> int:
    """Index of the run with the highest fitted asymptote on its full curve."""
    fits = [fit(r, N_EVALS, bootstrap=0) for r in runs]
    return int(np.argmax([f.A if f is not None else -1 for f in fits]))


class FitCache:
    """Fits of run i on its first n evals (bootstrap 100, the profile bound at `upper_level`), each computed once."""

    def __init__(self, runs, upper_level=early_stop.UPPER_LEVEL):
        self.runs, self.upper_level, self.fits = runs, upper_level, {}

    def __call__(self, i, n):
        if n < 2:
            return None
        if (i, n) not in self.fits:
            self.fits[(i, n)] = fit(self.runs[i], n, upper_level=self.upper_level)
        return self.fits[(i, n)]


def run_by_rungs(
    schedule: RungSchedule,
    progress: Callable[[], list[RunProgress]],
    advance: Callable[[Hashable, float, StopCheck], None],
    stop: Callable[[Hashable, str], None],
) -> int:
    """run_concurrently with one slot, each advance run to its end when started; returns the number of moves.
    advance(key, until, check): to `until` x planned compute, check at each checkpoint, stop there on a reason."""
    ended: list[Hashable] = []

    def start(key, until, check):
        advance(key, until, check)
        ended.append(key)

    def wait():
        done, ended[:] = list(ended), []
        return done

    return run_concurrently(schedule, progress, start, wait, stop, slots=1)


def replay_asymptote(runs, order, fits: FitCache, check_every=CHECK_EVERY, **schedule) -> tuple[int, float, int]:
    """(chosen best run, compute spent, moves): the study run through the sweep's rung scheduler
    (`run_by_rungs`: run_concurrently, the loop the driver runs); `order` is the driver's list of runs.

    Advancing a run replays its evals up to the move's fraction, asking the scheduler's check every
    `check_every` evals (the driver asks at each checkpoint). The compute axis is the fraction of the budget
    (budget 1.0), so RunProgress.compute is left at None."""
    plan = RungSchedule.from_rule(RULE, **schedule)
    seen = {i: 0 for i in order}  # evals observed per run
    stopped = set()

    def view(i) -> RunProgress:
        n = seen[i]
        return RunProgress(
            key=i,
            fraction=float(runs[i]["compute"][n - 1]) if n else 0.0,
            fit=fits(i, n),
            finished=n == N_EVALS,
            last_reward=float(runs[i]["reward"][n - 1]) if n else None,
            stopped=i in stopped,
        )

    def advance(i, until, check):
        target = int(np.searchsorted(runs[i]["compute"], until + 1e-9))  # evals with compute <= until
        for j in range(seen[i], target):
            seen[i] = j + 1
            if (j + 1) % check_every == 0 and check(view(i)):
                stopped.add(i)
                return

    moves = run_by_rungs(plan, lambda: [view(i) for i in order], advance, lambda i, reason: stopped.add(i))
    spent = sum(float(runs[i]["compute"][seen[i] - 1]) for i in order if seen[i])
    finished = [i for i in order if seen[i] == N_EVALS]
    chosen = max(finished, key=lambda k: fits(k, N_EVALS).A if fits(k, N_EVALS) is not None else -1)
    return chosen, spent, moves


def floor_asymptote(runs, fits: FitCache) -> float:
    """Compute spent if the final reference were known from the start and every other run stopped at its
    first check (the scheduler's, every CHECK_EVERY evals) that fires against it."""
    full = {i: fits(i, N_EVALS) for i in range(N_RUNS)}
    best = best_fit_of(full)
    check = SCHEDULE.stop_check([RunProgress(key=i, fraction=1.0, fit=f, finished=True) for i, f in full.items()])
    spent = 0.0
    for i, run in enumerate(runs):
        stop_at = N_EVALS
        if full[i] is not best:
            for n in range(CHECK_EVERY, N_EVALS + 1, CHECK_EVERY):
                if check(RunProgress(key=i, fraction=float(run["compute"][n - 1]), fit=fits(i, n), finished=False)):
                    stop_at = n
                    break
        spent += float(run["compute"][stop_at - 1])
    return spent


def replay_hyperband(runs, order, seed) -> tuple[int, float]:
    """(chosen best run, compute spent) with Optuna's HyperbandPruner on the same sequence of runs."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # Hyperband assigns trials to brackets by a hash of the study name: a fixed name makes the replay repeat.
    study = optuna.create_study(
        study_name=f"replay-{seed}",
        direction="maximize",
        pruner=optuna.pruners.HyperbandPruner(min_resource=4, max_resource=N_EVALS, reduction_factor=3),
        sampler=optuna.samplers.RandomSampler(seed),
    )
    spent, completed = 0.0, {}
    for i in order:
        run = runs[i]
        trial = study.ask()
        pruned = False
        for j in range(N_EVALS):
            trial.report(float(run["reward"][j]), step=j + 1)
            if trial.should_prune():
                spent += run["compute"][j]
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                pruned = True
                break
        if not pruned:
            spent += run["compute"][-1]
            f = fit(run, N_EVALS, bootstrap=0)
            value = f.A if f is not None else float(run["reward"][-1])
            completed[i] = value
            study.tell(trial, value)
    return max(completed, key=completed.get), spent


def run_asymptote(runs, order, fits, options) -> tuple[int, float, int]:
    """replay_asymptote with one variant's options (an "upper_level" option fits with that level of profile bound)."""
    options = dict(options)
    level = options.pop("upper_level", None)
    if level is not None:
        fits = FitCache(runs, upper_level=level)
    return replay_asymptote(runs, order, fits, **options)


def summary(rows, prefix) -> dict:
    fractions = [r[f"{prefix}_compute_fraction"] for r in rows]
    out = {
        "mean_compute_fraction": float(np.mean(fractions)),
        "median_compute_fraction": float(np.median(fractions)),
        "max_compute_fraction": float(np.max(fractions)),
    }
    if f"{prefix}_same" in rows[0]:
        out = {
            "same_best_fraction": float(np.mean([r[f"{prefix}_same"] for r in rows])),
            "best_within_noise_fraction": float(np.mean([r[f"{prefix}_within_noise"] for r in rows])),
            **out,
        }
    return out


def line(name, r) -> str:
    picks = (
        f"same best {r['same_best_fraction']:4.0%}  within 0.02 {r['best_within_noise_fraction']:4.0%}  "
        if "same_best_fraction" in r
        else " " * 37
    )
    return (
        f"{name:52.52s} {picks}compute mean {r['mean_compute_fraction']:.0%} "
        f"median {r['median_compute_fraction']:.0%} max {r['max_compute_fraction']:.0%}"
    )


def describe(options) -> dict:
    """A variant's options as JSON values."""
    return {k: (list(v) if isinstance(v, tuple) else v.__name__ if callable(v) else v) for k, v in options.items()}


def replay_regime(c_mid_range, replicates, variants) -> tuple[list[dict], dict]:
    """Per-replicate rows (the default schedule, its floor, Hyperband) and each variant's rows, for studies whose
    C_mid is drawn from `c_mid_range` (fraction of the per-run budget). Seeded: the same studies every time."""
    rng = np.random.default_rng(0)
    rows, variant_rows = [], {name: [] for name in variants}
    full = N_RUNS * 1.0
    for rep in range(replicates):
        runs = make_study(rng, c_mid_range)
        order = [int(i) for i in rng.permutation(N_RUNS)]
        truth_best = full_grid_best(runs)
        fits = FitCache(runs)
        for name, options in variants.items():
            best, spent, moves = run_asymptote(runs, order, fits, options)
            variant_rows[name].append(
                {
                    "asymptote_best": int(best),
                    "asymptote_same": bool(best == truth_best),
                    "asymptote_within_noise": bool(runs[truth_best]["A"] - runs[best]["A"] <= WITHIN),
                    "asymptote_compute_fraction": spent / full,
                    "asymptote_moves": moves,
                }
            )
        h_best, h_spent = replay_hyperband(runs, order, seed=rep)
        rows.append(
            {
                "replicate": rep,
                "grid_best": truth_best,
                **variant_rows[CHOSEN][-1],
                "floor_compute_fraction": floor_asymptote(runs, fits) / full,
                "hyperband_best": int(h_best),
                "hyperband_same": bool(h_best == truth_best),
                "hyperband_within_noise": bool(runs[truth_best]["A"] - runs[h_best]["A"] <= WITHIN),
                "hyperband_compute_fraction": h_spent / full,
            }
        )
    return rows, variant_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicates", type=int, default=REPLICATES, help="studies per regime")
    parser.add_argument(
        "--variants",
        type=int,
        default=0,
        metavar="N",
        help="instead of the regimes, measure every schedule variant in VARIANTS on N studies of the "
        "late regime (written under 'variants'; the regimes' results are kept)",
    )
    args = parser.parse_args()
    out = Path(__file__).parent / "results" / "early_termination.json"
    previous = json.loads(out.read_text()) if out.exists() else {}
    started = time.perf_counter()
    if args.variants:
        _, variant_rows = replay_regime(REGIMES["late"], args.variants, VARIANTS)
        variant_summary = {
            name: {**describe(options), **summary(variant_rows[name], "asymptote"), "replicates": args.variants}
            for name, options in VARIANTS.items()
        }
        for name in VARIANTS:
            print(line(name, variant_summary[name]))
        result = {**previous, "variants": variant_summary, "variants_seconds": round(time.perf_counter() - started, 1)}
    else:
        regimes = {}
        for regime, c_mid_range in REGIMES.items():
            rows, _ = replay_regime(c_mid_range, args.replicates, {CHOSEN: VARIANTS[CHOSEN]})
            regimes[regime] = {
                "c_mid_fraction_of_budget": list(c_mid_range),
                "asymptote": {"schedule": CHOSEN, **summary(rows, "asymptote")},
                "asymptote_floor": summary(rows, "floor"),
                "hyperband": summary(rows, "hyperband"),
                "replicate_rows": rows,
            }
            lo, hi = c_mid_range
            print(
                f"{regime}: C_mid {lo:.0%}-{hi:.0%} of the per-run budget, {args.replicates} studies of {N_RUNS} runs"
            )
            print(line("  asymptote (rung scheduler)", regimes[regime]["asymptote"]))
            print(line("  asymptote floor (best known)", regimes[regime]["asymptote_floor"]))
            print(line("  hyperband", regimes[regime]["hyperband"]))
        result = {
            "runs_per_study": N_RUNS,
            "evals_per_run": N_EVALS,
            "eval_samples": EVAL_SAMPLES,
            "replicates": args.replicates,
            "check_every_evals": CHECK_EVERY,
            "min_fraction": MIN_FRACTION,
            "regimes": regimes,
            "variants": previous.get("variants", {}),
            "seconds": round(time.perf_counter() - started, 1),
        }
        if "variants_seconds" in previous:
            result["variants_seconds"] = previous["variants_seconds"]
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out} ({round(time.perf_counter() - started, 1)} s)")


if __name__ == "__main__":
    main()
