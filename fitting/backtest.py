"""ScaleRL-style backtest: fit each run's first part of compute, extrapolate to its end, score against what it reached,
and the pick a study would have made at the cut (cut_pick). Pure: records in, plain data out."""

import math
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from rlscale.fitting.laws.predict import DEFAULT_LEVEL, Calibration, predict_at
from rlscale.fitting.sigmoid import FitError, fit_sigmoid, sigmoid
from rlscale.fitting.sigmoid.bootstrap import percentile_interval

from rlscale.base.numbers import NOISE_BAND, json_safe

# The end of a run is judged on its last 10% of compute: one evaluation is too noisy to score a prediction.
END_WINDOW = 0.1
# Gain from the part's end to the run's end that marks a run still rising (ScaleRL: |dA| < 0.02 is seed noise).
RISE = NOISE_BAND


@dataclass(frozen=True)
class RunBacktest:
    """One run's backtest (rewards in its metric, compute in the records' unit, NaN unless `fitted`): error = predicted
    - observed over the end window, predicted_lo/hi its 95% band, leader the part's; pi_*, sd_*...: laws/predict.py."""

    run: str
    fitted: bool
    reason: str
    n_points: int
    n_part: int = 0
    cut_compute: float = float("nan")
    last_compute: float = float("nan")
    predicted: float = float("nan")
    predicted_lo: float = float("nan")
    predicted_hi: float = float("nan")
    observed: float = float("nan")
    error: float = float("nan")
    carry_forward: float = float("nan")
    carry_forward_error: float = float("nan")
    A_part: float = float("nan")
    A_part_lo: float = float("nan")
    A_part_hi: float = float("nan")
    A_full: float = float("nan")
    A_full_identified: bool | None = None
    A_inside: bool | None = None
    rising: bool | None = None
    identified: bool = False
    level: float = DEFAULT_LEVEL
    pi_lo: float = float("nan")
    pi_hi: float = float("nan")
    pi_inside: bool | None = None
    pi_score: float = float("nan")
    sd_parameters: float = float("nan")
    sd_noise: float = float("nan")
    sd_drift: float = float("nan")
    sigma: float = float("nan")
    gain_left: float = float("nan")
    distance: float = float("nan")
    leader: float = float("nan")

    def to_dict(self) -> dict:
        """JSON-ready: NaN and inf become None."""
        return json_safe(asdict(self))


@dataclass(frozen=True)
class BacktestSummary:
    """A backtest's totals: MAE of part-fit vs carry-forward (rising runs and all), A-interval and PI coverage.
    A_no_interval: fitted runs too small for an A interval (under two points per parameter), left unchecked."""

    fraction: float
    runs: int
    fitted: int
    rising: int
    mae_fit_rising: float
    mae_carry_forward_rising: float
    fit_beats_carry_forward_rising: bool | None
    mae_fit: float
    mae_carry_forward: float
    A_checked: int
    A_inside: int
    A_inside_share: float
    A_no_interval: int
    A_checked_identified: int
    A_inside_identified_share: float
    level: float = DEFAULT_LEVEL
    pi_checked: int = 0
    pi_inside: int = 0
    pi_coverage: float = float("nan")
    pi_median_width: float = float("nan")
    pi_mean_score: float = float("nan")

    def to_dict(self) -> dict:
        """JSON-ready: NaN and inf become None."""
        return json_safe(asdict(self))


def in_end_window(compute: np.ndarray, last: float) -> np.ndarray:
    """Mask of the points in the last END_WINDOW of compute up to `last` (where a run's end reward is read)."""
    return compute >= (1.0 - END_WINDOW) * last


def interval_score(lo: float, hi: float, observed: float, level: float) -> float:
    """Gneiting and Raftery's (2007) interval score of [lo, hi] at `level` for `observed`, in reward units: the width
    plus 2 / (1 - level) x the distance `observed` falls outside (lower is better; coverage cannot be bought)."""
    alpha = 1.0 - level
    return float((hi - lo) + 2.0 / alpha * (max(lo - observed, 0.0) + max(observed - hi, 0.0)))


def backtest_run(
    compute,
    reward,
    *,
    run: str = "all",
    fraction: float = 0.5,
    level: float = DEFAULT_LEVEL,
    calibration: Calibration | None = None,
    **fit_kwargs,
) -> RunBacktest:
    """One run's backtest: fit its points at compute <= fraction x its last compute, score against its end window.
    Never raises for data that cannot be fitted (`fitted=False` and why); `fit_kwargs` go to `fit_sigmoid`."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    x = np.asarray(compute, dtype=float).ravel()
    y = np.asarray(reward, dtype=float).ravel()
    keep = np.isfinite(x) & np.isfinite(y) & (x >= 0)
    x, y = x[keep], y[keep]
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    nan = float("nan")
    empty = dict(run=str(run), n_points=len(x))  # the fields known so far; the rest NaN until known
    if len(x) == 0 or not x[-1] > 0:
        return RunBacktest(fitted=False, reason="no point with compute > 0", **empty)
    last = float(x[-1])
    cut = fraction * last
    part = x <= cut
    end = in_end_window(x, last)
    empty.update(n_part=int(part.sum()), cut_compute=cut, last_compute=last)
    if not np.any(end & ~part):
        return RunBacktest(
            fitted=False, **empty, reason=f"no evaluation after the first {fraction:.0%} of compute to check against"
        )
    end &= ~part  # with a fraction above 0.9 the end window is what lies beyond the part
    observed = float(np.mean(y[end]))
    carry = float(y[part][-1]) if part.any() else nan
    part_end = part & in_end_window(x, cut)
    leader = float(np.mean(y[part_end])) if part_end.any() else carry
    rising = bool(observed - leader > RISE) if part_end.any() else None
    empty.update(
        observed=observed, carry_forward=carry, carry_forward_error=carry - observed, rising=rising, leader=leader
    )
    try:
        fit = fit_sigmoid(x[part], y[part], **fit_kwargs)
    except FitError as err:
        return RunBacktest(fitted=False, reason=f"first {fraction:.0%}: {err}", **empty)
    predicted = float(np.mean(fit.predict(x[end])))
    lo, hi = _mean_band(fit, x[end])
    pi = predict_at(
        fit,
        x[part],
        y[part],
        last,
        level=level,
        window_compute=x[end],
        calibration=calibration,
        bounded=fit_kwargs.get("bounded", True),
    )
    has_pi = math.isfinite(pi.lo) and math.isfinite(pi.hi)
    pi_inside = bool(pi.lo <= observed <= pi.hi) if has_pi else None
    try:
        full = fit_sigmoid(x, y, **fit_kwargs)
        A_full, A_full_identified = full.A, full.identified
    except FitError:
        A_full, A_full_identified = nan, None
    inside = None  # not checked: no full-run A, or a part-fit too small for an interval
    if math.isfinite(A_full) and math.isfinite(fit.A_lo) and math.isfinite(fit.A_hi):
        inside = bool(fit.A_lo <= A_full <= fit.A_hi)
    empty.update(
        predicted=predicted,
        predicted_lo=lo,
        predicted_hi=hi,
        error=predicted - observed,
        A_part=fit.A,
        A_part_lo=fit.A_lo,
        A_part_hi=fit.A_hi,
        A_full=float(A_full),
        A_full_identified=A_full_identified,
        A_inside=inside,
        identified=fit.identified,
        level=float(level),
        pi_lo=pi.lo,
        pi_hi=pi.hi,
        pi_inside=pi_inside,
        pi_score=interval_score(pi.lo, pi.hi, observed, level) if has_pi else nan,
        sd_parameters=pi.sd_parameters,
        sd_noise=pi.sd_noise,
        sd_drift=pi.sd_drift,
        sigma=pi.sigma,
        gain_left=pi.gain_left,
        distance=pi.distance,
    )
    return RunBacktest(fitted=True, reason=fit.reason, **empty)


def backtest_runs(
    records: pd.DataFrame, *, fraction: float = 0.5, run_col="run", compute_col="compute", reward_col="reward", **kwargs
) -> list[RunBacktest]:
    """`backtest_run` for every run of `records` (in order of first appearance; one run "all" without a run column)."""
    for col in (compute_col, reward_col):
        if col not in records.columns:
            raise KeyError(f"records have no column {col!r} (columns: {', '.join(map(str, records.columns))})")
    groups = records.groupby(run_col, sort=False, dropna=False) if run_col in records.columns else [("all", records)]
    return [
        backtest_run(
            group[compute_col].to_numpy(dtype=float, na_value=np.nan),
            group[reward_col].to_numpy(dtype=float, na_value=np.nan),
            run=str(run),
            fraction=fraction,
            **kwargs,
        )
        for run, group in groups
    ]


def summarize(results: list[RunBacktest], fraction: float = 0.5) -> BacktestSummary:
    fitted = [r for r in results if r.fitted]
    rising = [r for r in fitted if r.rising]
    checked = [r for r in fitted if r.A_inside is not None]
    inside = sum(bool(r.A_inside) for r in checked)
    checked_identified = [r for r in checked if r.A_full_identified]
    inside_identified = sum(bool(r.A_inside) for r in checked_identified)

    def mae(rows, key):
        values = [abs(getattr(r, key)) for r in rows if math.isfinite(getattr(r, key))]
        return float(np.mean(values)) if values else float("nan")

    with_pi = [r for r in fitted if r.pi_inside is not None]
    pi_inside = sum(bool(r.pi_inside) for r in with_pi)
    level = with_pi[0].level if with_pi else DEFAULT_LEVEL
    mae_fit_rising, mae_cf_rising = mae(rising, "error"), mae(rising, "carry_forward_error")
    both = rising and math.isfinite(mae_fit_rising) and math.isfinite(mae_cf_rising)
    beats = bool(mae_fit_rising < mae_cf_rising) if both else None
    return BacktestSummary(
        fraction=float(fraction),
        runs=len(results),
        fitted=len(fitted),
        rising=len(rising),
        mae_fit_rising=mae_fit_rising,
        mae_carry_forward_rising=mae_cf_rising,
        fit_beats_carry_forward_rising=beats,
        mae_fit=mae(fitted, "error"),
        mae_carry_forward=mae(fitted, "carry_forward_error"),
        A_checked=len(checked),
        A_inside=inside,
        A_inside_share=inside / len(checked) if checked else float("nan"),
        A_no_interval=sum(1 for r in fitted if math.isfinite(r.A_full) and not math.isfinite(r.A_part_lo)),
        A_checked_identified=len(checked_identified),
        A_inside_identified_share=inside_identified / len(checked_identified) if checked_identified else float("nan"),
        level=float(level),
        pi_checked=len(with_pi),
        pi_inside=pi_inside,
        pi_coverage=pi_inside / len(with_pi) if with_pi else float("nan"),
        pi_median_width=float(np.median([r.pi_hi - r.pi_lo for r in with_pi])) if with_pi else float("nan"),
        pi_mean_score=float(np.mean([r.pi_score for r in with_pi])) if with_pi else float("nan"),
    )


def _mean_band(fit, compute) -> tuple[float, float]:
    draws = fit.samples
    if draws is None or len(draws) < 2:
        return float("nan"), float("nan")
    curves = sigmoid(compute[None, :], draws[:, 0, None], draws[:, 1, None], draws[:, 2, None], draws[:, 3, None])
    lo, hi = percentile_interval(curves.mean(axis=1), 0.95)
    return float(lo), float(hi)


def backtest_table(records: pd.DataFrame, *, fraction: float = 0.5, **kwargs) -> dict:
    """{"fraction", "runs", "summary", "decision"} as to_dict() (decision None: no pick); kwargs go to backtest_runs."""
    results = backtest_runs(records, fraction=fraction, **kwargs)
    decision = cut_pick(results, fraction)
    return {
        "fraction": fraction,
        "runs": [r.to_dict() for r in results],
        "summary": summarize(results, fraction).to_dict(),
        "decision": None if decision is None else decision.to_dict(),
    }


# `prediction` picks the best leader among the runs no other run surely beats (`surely_beaten`); the rest are baselines.
PICK_METHODS = ("prediction", "prediction_point", "leader", "A")


@dataclass(frozen=True)
class CutPick:
    """One study's picks (per PICK_METHODS) at `fraction` and their regret vs the best end, both {method: run/value};
    the rest {run: value}: an unfitted run scores its leader value, one without a finite interval an unbounded one."""

    fraction: float
    end: dict
    best: str
    predicted: dict
    predicted_lo: dict
    predicted_hi: dict
    leader: dict
    A: dict
    picks: dict
    regret: dict

    def to_dict(self) -> dict:
        """JSON-ready: NaN and inf become None."""
        return json_safe(asdict(self))


def surely_beaten(run: str, predicted: dict, lo: dict, hi: dict) -> bool:
    """Whether another run's prediction exceeds `run`'s by more than the hypot of the facing half-widths (independent
    errors). An unbounded interval (a run with no prediction) is never beaten and beats none."""
    up = hi[run] - predicted[run]
    for other in predicted:
        down = predicted[other] - lo[other]
        if other != run and predicted[other] - predicted[run] > math.hypot(down, up):
            return True
    return False


def _cut_pick(fraction, end, predicted, lo, hi, leader, asymptote) -> CutPick:
    best = max(end, key=end.get)

    def top(score, among=None):
        return max(among or score, key=lambda run: score[run] if math.isfinite(score[run]) else -math.inf)

    contenders = [run for run in end if not surely_beaten(run, predicted, lo, hi)]
    picks = {
        "prediction": top(leader, contenders),
        "prediction_point": top(predicted),
        "leader": top(leader),
        "A": top(asymptote),
    }
    regret = {method: end[best] - end[run] for method, run in picks.items()}
    return CutPick(
        fraction=float(fraction),
        end=end,
        best=best,
        predicted=predicted,
        predicted_lo=lo,
        predicted_hi=hi,
        leader=leader,
        A=asymptote,
        picks=picks,
        regret=regret,
    )


def cut_pick(results: list[RunBacktest], fraction: float) -> CutPick | None:
    """The pick rules.decision.decide would make from a backtest's runs taken as one study, with their fits (their
    prediction over the observed end window); None with fewer than two runs that reached past the cut."""
    scored = [r for r in results if math.isfinite(r.observed) and math.isfinite(r.leader)]
    if len(scored) < 2:
        return None
    sure = {r.run: r.fitted and math.isfinite(r.pi_lo) and math.isfinite(r.pi_hi) for r in scored}
    return _cut_pick(
        fraction,
        {r.run: r.observed for r in scored},
        {r.run: r.predicted if r.fitted else r.leader for r in scored},
        {r.run: r.pi_lo if sure[r.run] else -math.inf for r in scored},
        {r.run: r.pi_hi if sure[r.run] else math.inf for r in scored},
        {r.run: r.leader for r in scored},
        {r.run: r.A_part if r.fitted else r.leader for r in scored},
    )
