"""Replay recorded reward curves through the sweep's early-termination rules.

Question: does asymptote-based termination (stop a run once the upper bound of its fitted asymptote is
below the best run's lower bound, 0.02 noise band) pick the same best configuration as running the full
grid, and how much compute does it spend? The same replay runs Optuna's Hyperband pruner for comparison.

Curves: ScaleRL-shaped sigmoids R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) for a 12-point grid, observed at
40 evaluations up to the per-run budget with binomial noise (eval pass rate over 2,048 samples: sd <= 0.011, the 1% noise of the fit benchmark), in a random
order per replicate, runs one after another as on a single host. Writes bench/results/early_termination.json.
"""

import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fitting.early_stop import best_fit_of, should_stop  # noqa: E402
from fitting.sigmoid import FitError, fit_sigmoid, sigmoid  # noqa: E402

N_RUNS, N_EVALS, EVAL_SAMPLES, REPLICATES = 12, 40, 2048, 20
MIN_FRACTION = 0.25  # never judge a run before a quarter of its budget


def make_study(rng) -> list[dict]:
    """One study's true curves and their noisy eval records (compute in GPU-hours, budget 1.0 per run)."""
    runs = []
    for _ in range(N_RUNS):
        A = rng.uniform(0.45, 0.85)
        B = rng.uniform(1.0, 2.5)
        C_mid = rng.uniform(0.08, 0.3)
        R0 = rng.uniform(0.1, 0.2)
        compute = np.linspace(1.0 / N_EVALS, 1.0, N_EVALS)
        truth = sigmoid(compute, A, B, C_mid, R0)
        reward = rng.binomial(EVAL_SAMPLES, truth) / EVAL_SAMPLES
        runs.append({"A": A, "compute": compute, "reward": reward})
    return runs


def fit(compute, reward, bootstrap=100):
    try:
        return fit_sigmoid(compute, reward, bootstrap=bootstrap)
    except FitError:
        return None


def full_grid_best(runs) -> int:
    """Index of the run with the highest fitted asymptote on its full curve."""
    fits = [fit(r["compute"], r["reward"], bootstrap=0) for r in runs]
    return int(np.argmax([f.A if f is not None else -1 for f in fits]))


def replay_asymptote(runs, order) -> tuple[int, float]:
    """(chosen best run, compute spent) with the asymptote rule, runs one after another in `order`."""
    finished_fits, spent = {}, 0.0
    for i in order:
        run = runs[i]
        best = best_fit_of(finished_fits)
        stopped = False
        for j in range(N_EVALS):
            if run["compute"][j] < MIN_FRACTION or best is None or (j + 1) % 2:
                continue  # the driver refits every other eval
            mine = fit(run["compute"][: j + 1], run["reward"][: j + 1])
            if should_stop(mine, best, run["compute"][j]).stop:
                spent += run["compute"][j]
                stopped = True
                break
        if not stopped:
            spent += run["compute"][-1]
            finished_fits[i] = fit(run["compute"], run["reward"])
    chosen = max(finished_fits, key=lambda k: finished_fits[k].A if finished_fits[k] is not None else -1)
    return chosen, spent


def replay_hyperband(runs, order, seed) -> tuple[int, float]:
    """(chosen best run, compute spent) with Optuna's HyperbandPruner on the same sequence of runs."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.HyperbandPruner(
        min_resource=4, max_resource=N_EVALS, reduction_factor=3), sampler=optuna.samplers.RandomSampler(seed))
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
            f = fit(run["compute"], run["reward"], bootstrap=0)
            value = f.A if f is not None else float(run["reward"][-1])
            completed[i] = value
            study.tell(trial, value)
    return max(completed, key=completed.get), spent


def main() -> None:
    rng = np.random.default_rng(0)
    started = time.perf_counter()
    rows = []
    for rep in range(REPLICATES):
        runs = make_study(rng)
        order = rng.permutation(N_RUNS)
        truth_best = full_grid_best(runs)
        a_best, a_spent = replay_asymptote(runs, order)
        h_best, h_spent = replay_hyperband(runs, order, seed=rep)
        full = N_RUNS * 1.0
        # "same best" within the noise band: the chosen run's true asymptote is within 0.02 of the grid's pick
        a_gap = runs[truth_best]["A"] - runs[a_best]["A"]
        h_gap = runs[truth_best]["A"] - runs[h_best]["A"]
        rows.append({
            "replicate": rep, "grid_best": truth_best,
            "asymptote_best": int(a_best), "asymptote_same": bool(a_best == truth_best),
            "asymptote_within_noise": bool(a_gap <= 0.02), "asymptote_compute_fraction": a_spent / full,
            "hyperband_best": int(h_best), "hyperband_same": bool(h_best == truth_best),
            "hyperband_within_noise": bool(h_gap <= 0.02), "hyperband_compute_fraction": h_spent / full,
        })
    result = {
        "runs_per_study": N_RUNS, "evals_per_run": N_EVALS, "eval_samples": EVAL_SAMPLES, "replicates": REPLICATES,
        "asymptote": {
            "same_best_fraction": float(np.mean([r["asymptote_same"] for r in rows])),
            "best_within_noise_fraction": float(np.mean([r["asymptote_within_noise"] for r in rows])),
            "median_compute_fraction": float(np.median([r["asymptote_compute_fraction"] for r in rows])),
            "max_compute_fraction": float(np.max([r["asymptote_compute_fraction"] for r in rows])),
        },
        "hyperband": {
            "same_best_fraction": float(np.mean([r["hyperband_same"] for r in rows])),
            "best_within_noise_fraction": float(np.mean([r["hyperband_within_noise"] for r in rows])),
            "median_compute_fraction": float(np.median([r["hyperband_compute_fraction"] for r in rows])),
            "max_compute_fraction": float(np.max([r["hyperband_compute_fraction"] for r in rows])),
        },
        "seconds": round(time.perf_counter() - started, 1),
        "replicate_rows": rows,
    }
    out = Path(__file__).parent / "results" / "early_termination.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    for rule in ("asymptote", "hyperband"):
        r = result[rule]
        print(f"{rule:10s} same best {r['same_best_fraction']:.0%}  within 0.02 {r['best_within_noise_fraction']:.0%}  "
              f"compute median {r['median_compute_fraction']:.0%} max {r['max_compute_fraction']:.0%}")
    print(f"wrote {out} ({result['seconds']} s)")


if __name__ == "__main__":
    main()
