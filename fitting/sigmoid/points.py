"""Record-breaking points (IsoCompute Playbook): the running frontier of a reward curve."""

from dataclasses import dataclass

import numpy as np
from rlscale.fitting.sigmoid.fit import MAX_CI_WIDTH

from rlscale.base.numbers import NOISE_BAND

# Rewards like 0.3 / 0.01 land at 29.999999999999996; nudge so a value on a bin edge opens that bin.
_EDGE = 1e-9


def fits_record_breaking(study) -> bool:
    """Whether a stored Study's runs are fitted on record-breaking points (`fit.points`); False for None (no spec)."""
    return study is not None and study.fits_record_breaking


BIN_WIDTH = 0.01  # IsoCompute's reward bins, for pass rates in [0, 1]
MIN_BINS = 20  # a study whose rewards span less than MIN_BINS x BIN_WIDTH gets bins this many to its spread


def record_bin_width(rewards, span: float = 1.0) -> float:
    """The reward bin width of a study's record-breaking points: BIN_WIDTH of the rewards' `span` (their RewardScale),
    or their spread over MIN_BINS when that is narrower (else one point a run would be kept)."""
    spread = reward_spread(rewards)
    return min(BIN_WIDTH * span, spread / MIN_BINS) if spread > 0 else BIN_WIDTH * span


def reward_spread(rewards) -> float:
    """max - min of the finite rewards; 0 for none."""
    values = _finite(rewards)
    return float(values.max() - values.min()) if values.size else 0.0


def _finite(rewards) -> np.ndarray:
    values = np.asarray(rewards, dtype=float)
    return values[np.isfinite(values)]


def fitted_points_label(record_breaking: bool, bin_width: float = BIN_WIDTH) -> str:
    """The points a run's fit used, in words, for titles and reports."""
    if not record_breaking:
        return "every evaluation"
    return "record-breaking points" + ("" if bin_width == BIN_WIDTH else f" (reward bins of {bin_width:.3g})")


def record_breaking_points(compute, reward, bin_width: float = BIN_WIDTH) -> np.ndarray:
    """Indices of the points that set a new reward record, in compute order (ties keep input order): each first to
    enter a `bin_width` reward bin above every earlier point's bin; non-finite points are skipped."""
    compute = np.asarray(compute, dtype=float).ravel()
    reward = np.asarray(reward, dtype=float).ravel()
    if compute.shape != reward.shape:
        raise ValueError(f"compute and reward differ in length: {compute.size} vs {reward.size}")
    if not bin_width > 0:
        raise ValueError(f"bin_width must be > 0, got {bin_width}")
    finite = np.flatnonzero(np.isfinite(compute) & np.isfinite(reward))
    order = finite[np.argsort(compute[finite], kind="stable")]
    bins = np.floor(reward[order] / bin_width + _EDGE)
    best_before = np.concatenate(([-np.inf], np.maximum.accumulate(bins)[:-1])) if bins.size else bins
    return order[bins > best_before]


def is_pass_rate(rewards) -> bool:
    """Whether a study's rewards read as pass rates (every finite one in [0, 1]): their fits then keep A and R0 in
    [0, 1]; any other metric (a sum of reward functions, a negative score) is fitted unbounded."""
    values = _finite(rewards)
    return bool(values.size == 0 or ((values >= 0.0) & (values <= 1.0)).all())


@dataclass(frozen=True)
class RewardScale:
    """How a study's rewards are read: as pass rates (`bounded`: fits keep A and R0 in [0, 1]) or any other metric.
    `span` is what the reward tolerances (noise band, A's interval width, reward bins) are fractions of: 1 for pass
    rates, else the range of the study's rewards and 0, so that a metric's unit (a positive factor) changes no
    verdict."""

    bounded: bool = True
    span: float = 1.0
    bin_width: float = BIN_WIDTH  # the record-breaking points' reward bins

    @property
    def noise_band(self) -> float:
        return NOISE_BAND * self.span

    @property
    def max_ci_width(self) -> float:
        return MAX_CI_WIDTH * self.span


def reward_scale(rewards, bounded: bool | None = None) -> RewardScale:
    """The RewardScale of a study's (or a file's) rewards, every run's evaluations together; `bounded` None: whether
    they read as pass rates."""
    values = _finite(rewards)  # read once: the checks below take the finite values as they are
    bounded = is_pass_rate(values) if bounded is None else bool(bounded)
    # the range of the rewards and 0, as [0, 1] is a pass rate's: a positive factor (%, a sum of K rewards) scales it
    span = float(max(values.max(), 0.0) - min(values.min(), 0.0)) if values.size else 0.0
    span = 1.0 if bounded or not span > 0 else span
    return RewardScale(bounded, span, record_bin_width(values, span))


def scaled_fit_options(rewards, options: dict) -> dict:
    """fit_sigmoid's `options` for a frame's `rewards`, with A's interval width at their RewardScale unless given."""
    scale = reward_scale(rewards, options.get("bounded", True))
    return {"max_ci_width": scale.max_ci_width, **options}
