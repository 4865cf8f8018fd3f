"""Asymptote-based early termination (ScaleRL practice): stop a run once its fitted curve shows it cannot reach the
best run's asymptote. Pure rules on fits; rlscale.runner.sweep.scheduler applies them."""

from dataclasses import dataclass

import numpy as np

from rlscale.base.numbers import NOISE_BAND


@dataclass(frozen=True)
class StopDecision:
    stop: bool
    reason: str


def asymptote_lower_bound(fit, noise_band: float = NOISE_BAND) -> float:
    """The lower end of a fit's asymptote, never tighter than the noise band (reward units)."""
    lo = fit.A_lo if np.isfinite(fit.A_lo) else fit.A
    return min(lo, fit.A - noise_band)


def asymptote_upper_bound(fit, noise_band: float = NOISE_BAND) -> float:
    """The upper end of a fit's asymptote (reward units): its profile bound A_upper, never tighter than the noise band;
    +inf without one, so a run is never stopped on less than the UPPER_LEVEL profile bound."""
    hi = fit.A_upper
    return max(hi, fit.A + noise_band) if np.isfinite(hi) else float("inf")


# The one-sided level of the profile bound the driver asks fit_sigmoid for (upper_level).
UPPER_LEVEL = 0.99
# Judged only past this x C_mid: just past it a steep curve's bound can exclude its true A (bench/early_termination.py).
PAST_INFLECTION = 2.0


def should_stop(
    run_fit, best_fit, max_compute: float, *, noise_band: float = NOISE_BAND, past_inflection: float = PAST_INFLECTION
) -> StopDecision:
    """Stop `run_fit`'s run once past its inflection (max_compute >= past_inflection x C_mid) with its asymptote's upper
    bound below the best run's lower bound, both at least the noise band wide."""
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
