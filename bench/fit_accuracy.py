"""Accuracy, interval coverage and speed of the per-run sigmoid fit on synthetic ScaleRL curves, under
several noise models, all fitted at the one default setting (noise="auto", 200 bootstrap resamples).

Simulated runs: A ~ U[0.4, 0.9], B ~ U[0.8, 3], R0 ~ U[0.05, 0.3]; a 16,000 GPU-hour run evaluated every
100 GPU-hours (160 evals), of which only the first half (C <= 8,000) is observed; C_mid is set so the
observed half passes the inflection: 8,000 / C_mid ~ log-uniform[2, 8].
Noise models (the same curves under each):
  binomial:       each eval a pass rate over k = 2,500 answers, reward ~ Binomial(k, R) / k (sd <= 0.01)
  multiplicative: reward = R (1 + 0.01 z), z standard normal (1% relative error)
  constant:       reward = R + 0.01 z
  ar1:            reward = R + e, e an AR(1) series along the evals, rho 0.5, marginal sd 0.01 (noise that
                  carries from one evaluation to the next, as in real training curves)
  drift:          reward = R + e, e half independent (evaluation noise) and half AR(1) with rho 0.85 (a policy
                  that drifts), marginal sd 0.01: noise that fades slower than AR(1) with the same lag-1 value (~0.4),
                  as the residuals of long real runs do (bench/data/public/deep_grpo_*); no target in issue 17
The reference frac_abs_err_A_le_0.02_at_cramer_rao_bound is what an unbiased estimator at the Cramer-Rao bound
would reach on the same curves (no unbiased fit can do better on average). One set of 1,000 curves measures a share
near 90% to about +-1 point, so the accuracy and its reference are also measured on further sets of curves
(`--accuracy-seeds`, point fits: the fitted A does not depend on the bootstrap).
Targets (issue 17): |A_fit - A_true| <= 0.02 on >= 90% of curves and 95% coverage of A_true in 90-98% for
the first three; coverage in 85-98% for ar1; one fit <= 5 ms median; 1,000 runs x 200 resamples <= 60 s (issue 33:
<= 15 s, bench/fit_speed.py times it beside older code).

Usage: nice .venv/bin/python bench/fit_accuracy.py [--runs 1000] [--resamples 200] [--seed 0] [--noise ...]
       [--accuracy-seeds 3]
Prints the numbers and writes bench/results/fit_accuracy.json (only when every noise model was run).
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rlscale.fitting.sigmoid import curve_and_jacobian, fit_sigmoid, sigmoid  # noqa: E402
from scipy.stats import norm  # noqa: E402

FULL_GPU_HOURS = 16_000.0
EVAL_EVERY = 100.0
EVALS_PER_PASS = 2_500
NOISE_SD = 0.01
AR_RHO = 0.5
DRIFT_RHO, DRIFT_SHARE = 0.85, 0.5
TOLERANCE_A = 0.02  # ScaleRL's noise level for |dA|
NOISE_MODELS = {
    "binomial": f"reward ~ Binomial({EVALS_PER_PASS}, R(C)) / {EVALS_PER_PASS} (sd <= 0.01)",
    "multiplicative": f"reward = R(C) (1 + {NOISE_SD} z), z ~ N(0, 1)",
    "constant": f"reward = R(C) + {NOISE_SD} z, z ~ N(0, 1)",
    "ar1": f"reward = R(C) + e, e AR(1) along the evals with rho {AR_RHO}, marginal sd {NOISE_SD}",
    "drift": f"reward = R(C) + e, e independent + AR(1) with rho {DRIFT_RHO} ({DRIFT_SHARE:.0%} of the variance), "
    f"marginal sd {NOISE_SD}",
}
TARGETS = {
    "frac_abs_err_A_le_0.02": ">= 0.90 (not for ar1, drift)",
    "coverage_95_A": "0.90-0.98 (ar1: 0.85-0.98; drift: none set)",
    "median_ms_per_fit_no_bootstrap": "<= 5",
    "seconds_for_runs_with_bootstrap": "<= 15 (issue 33; issue 17: <= 60) for 1000 runs, 200 resamples",
}


def simulate(n_runs: int, seed: int, noise: str, observed: float = FULL_GPU_HOURS / 2):
    """Yields (truth dict, compute, reward) for n_runs synthetic runs observed up to `observed` GPU-hours (by
    default half their compute), C_mid placed so the observed part passes the inflection. The curves depend on
    the seed only, so every noise model sees the same ones."""
    rng = np.random.default_rng(seed)
    noise_rng = np.random.default_rng([seed, list(NOISE_MODELS).index(noise)])
    compute = np.arange(EVAL_EVERY, observed + 1, EVAL_EVERY)
    for _ in range(n_runs):
        truth = {
            "A": rng.uniform(0.4, 0.9),
            "B": rng.uniform(0.8, 3.0),
            "R0": rng.uniform(0.05, 0.3),
            "C_mid": compute[-1] / np.exp(rng.uniform(np.log(2.0), np.log(8.0))),
        }
        mean = sigmoid(compute, truth["A"], truth["B"], truth["C_mid"], truth["R0"])
        z = noise_rng.standard_normal(compute.size)
        if noise == "binomial":
            reward = noise_rng.binomial(EVALS_PER_PASS, mean) / EVALS_PER_PASS
        elif noise == "multiplicative":
            reward = mean * (1.0 + NOISE_SD * z)
        elif noise == "constant":
            reward = mean + NOISE_SD * z
        elif noise == "ar1":
            reward = mean + NOISE_SD * ar1(z, AR_RHO)
        else:
            white = noise_rng.standard_normal(compute.size)
            reward = mean + NOISE_SD * (np.sqrt(DRIFT_SHARE) * ar1(z, DRIFT_RHO) + np.sqrt(1 - DRIFT_SHARE) * white)
        yield truth, compute, np.clip(reward, 0.0, 1.0)


def ar1(z: np.ndarray, rho: float) -> np.ndarray:
    """A stationary AR(1) series of unit variance from standard normal innovations z."""
    e = np.empty_like(z)
    e[0] = z[0]
    for t in range(1, z.size):
        e[t] = rho * e[t - 1] + np.sqrt(1.0 - rho**2) * z[t]
    return e


def efficient_frac_within(truth, compute, noise) -> float:
    """P(|A_hat - A| <= 0.02) for an unbiased estimator at the Cramer-Rao bound, A_hat ~ N(A, sd_A^2), sd_A from
    the Fisher information J' Sigma^-1 J of the true curve under the true noise covariance Sigma: what the
    data can tell about A, whatever the fit."""
    theta = np.array([[truth["A"], np.log(truth["B"]), np.log(truth["C_mid"]), truth["R0"]]])
    mean, jac = curve_and_jacobian(theta, np.log(compute))
    mean, jac = mean[0], jac[0]
    if noise == "binomial":
        sigma = np.diag(mean * (1 - mean) / EVALS_PER_PASS)
    elif noise == "multiplicative":
        sigma = np.diag((NOISE_SD * mean) ** 2)
    elif noise == "constant":
        sigma = NOISE_SD**2 * np.eye(compute.size)
    else:
        lags = np.abs(np.subtract.outer(np.arange(compute.size), np.arange(compute.size)))
        if noise == "ar1":
            sigma = NOISE_SD**2 * AR_RHO**lags
        else:
            sigma = NOISE_SD**2 * (DRIFT_SHARE * DRIFT_RHO**lags + (1 - DRIFT_SHARE) * np.eye(compute.size))
    sd_a = np.sqrt(np.linalg.inv(jac.T @ np.linalg.solve(sigma, jac))[0, 0])
    return float(2 * norm.cdf(TOLERANCE_A / sd_a) - 1)


def accuracy_on_seed(noise: str, n_runs: int, seed: int) -> dict:
    """Share of curves with |A_fit - A_true| <= 0.02 (point fits: A does not depend on the bootstrap) on the curves of
    `seed`, beside what an unbiased fit at the Cramer-Rao bound would reach on the same curves."""
    within, efficient = [], []
    for truth, compute, reward in simulate(n_runs, seed, noise):
        within.append(abs(fit_sigmoid(compute, reward, bootstrap=0).A - truth["A"]) <= TOLERANCE_A)
        efficient.append(efficient_frac_within(truth, compute, noise))
    return {
        "frac_abs_err_A_le_0.02": float(np.mean(within)),
        "frac_abs_err_A_le_0.02_at_cramer_rao_bound": float(np.mean(efficient)),
    }


def run_noise_model(noise: str, n_runs: int, resamples: int, seed: int) -> dict:
    """Accuracy, coverage and timing of the default fit on n_runs curves with `noise`."""
    runs = list(simulate(n_runs, seed, noise))
    # Speed of one point fit (no bootstrap): median over the first 200 runs, after one warm-up fit.
    # The machine is shared, so CPU time (this process only) is reported beside wall time.
    fit_sigmoid(runs[0][1], runs[0][2], bootstrap=0)
    point_ms, point_cpu_ms = [], []
    for _, compute, reward in runs[:200]:
        start, cpu = time.perf_counter(), time.process_time()
        fit_sigmoid(compute, reward, bootstrap=0)
        point_ms.append(1e3 * (time.perf_counter() - start))
        point_cpu_ms.append(1e3 * (time.process_time() - cpu))

    errors, covered, widths, identified, chosen, rhos = [], [], [], [], [], []
    start, cpu = time.perf_counter(), time.process_time()
    for i, (truth, compute, reward) in enumerate(runs):
        fit = fit_sigmoid(compute, reward, bootstrap=resamples, seed=seed + i)
        errors.append(fit.A - truth["A"])
        covered.append(fit.A_lo <= truth["A"] <= fit.A_hi)
        widths.append(fit.A_hi - fit.A_lo)
        identified.append(fit.identified)
        chosen.append(fit.noise)
        rhos.append(fit.rho)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    errors, identified = np.abs(np.array(errors)), np.array(identified)
    return {
        "noise_model": NOISE_MODELS[noise],
        "frac_abs_err_A_le_0.02": float(np.mean(errors <= TOLERANCE_A)),
        "frac_abs_err_A_le_0.02_at_cramer_rao_bound": float(
            np.mean([efficient_frac_within(truth, compute, noise) for truth, compute, _ in runs])
        ),
        "median_abs_err_A": float(np.median(errors)),
        "coverage_95_A": float(np.mean(covered)),
        "median_interval_width_A": float(np.median(widths)),
        "frac_identified": float(np.mean(identified)),
        "frac_abs_err_A_le_0.02_when_identified": float(np.mean(errors[identified] <= TOLERANCE_A))
        if identified.any()
        else float("nan"),
        "noise_chosen_by_auto": {name: chosen.count(name) / len(chosen) for name in sorted(set(chosen))},
        "median_rho": float(np.median(rhos)),
        "median_ms_per_fit_no_bootstrap": float(np.median(point_ms)),
        "median_cpu_ms_per_fit_no_bootstrap": float(np.median(point_cpu_ms)),
        "seconds_for_runs_with_bootstrap": float(seconds),
        "cpu_seconds_for_runs_with_bootstrap": float(cpu_seconds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--resamples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--noise", default=",".join(NOISE_MODELS), help="comma-separated subset of " + ", ".join(NOISE_MODELS)
    )
    parser.add_argument(
        "--accuracy-seeds",
        type=int,
        default=3,
        help="further seeds (curve sets) on which the accuracy and its Cramer-Rao reference are measured",
    )
    args = parser.parse_args()
    chosen = args.noise.split(",")
    results = {
        "runs": args.runs,
        "resamples": args.resamples,
        "seed": args.seed,
        "fit": "fit_sigmoid defaults (noise='auto')",
        "observed": f"C <= {FULL_GPU_HOURS / 2:g} of {FULL_GPU_HOURS:g} GPU-hours, every {EVAL_EVERY:g}",
        "noise_models": {},
    }
    for noise in chosen:
        print(f"-- {noise}: {NOISE_MODELS[noise]}")
        row = run_noise_model(noise, args.runs, args.resamples, args.seed)
        # One set of 1,000 curves decides a 90% goal to about +-1 point: the same measure on other sets of curves
        row["accuracy_on_further_seeds"] = {
            str(seed): accuracy_on_seed(noise, args.runs, seed)
            for seed in range(args.seed + 1, args.seed + 1 + args.accuracy_seeds)
        }
        results["noise_models"][noise] = row
        for key, value in row.items():
            if key == "accuracy_on_further_seeds":
                for seed, acc in value.items():
                    print(
                        f"   seed {seed}: A within 0.02 on {acc['frac_abs_err_A_le_0.02']:.3f} (Cramer-Rao "
                        f"reference {acc['frac_abs_err_A_le_0.02_at_cramer_rao_bound']:.3f})"
                    )
                continue
            print(f"   {key:40s} {value:.4g}" if isinstance(value, float) else f"   {key:40s} {value}")
    results["load_average_1min_at_end"] = os.getloadavg()[0]
    results["cpu_count"] = os.cpu_count()
    results["note"] = (
        "timed on a machine shared with other jobs: wall-clock times are upper bounds; "
        "cpu_* are this process's own CPU time"
    )
    results["targets"] = TARGETS
    if set(chosen) != set(NOISE_MODELS):
        print("(not all noise models run: results file left as it is)")
        return
    out = Path(__file__).resolve().parent / "results" / "fit_accuracy.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
