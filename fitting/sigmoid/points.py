"""Record-breaking points (IsoCompute Playbook): the running frontier of a reward curve."""

import numpy as np

# Rewards like 0.3 / 0.01 land at 29.999999999999996; nudge so a value on a bin edge opens that bin.
_EDGE = 1e-9


def fits_record_breaking(study) -> bool:
    """Whether a stored Study's runs are fitted on record-breaking points (`fit.points`); False for None (no spec)."""
    return study is not None and study.fits_record_breaking


BIN_WIDTH = 0.01  # IsoCompute's reward bins, for pass rates in [0, 1]
MIN_BINS = 20  # a study whose rewards span less than MIN_BINS x BIN_WIDTH gets bins this many to its spread


def record_bin_width(rewards) -> float:
    """The reward bin width of a study's record-breaking points: BIN_WIDTH, or its rewards' spread over MIN_BINS
    when that is narrower (a reward scale far below pass rates would otherwise keep one point a run)."""
    values = np.asarray(rewards, dtype=float)
    values = values[np.isfinite(values)]
    spread = float(values.max() - values.min()) if values.size else 0.0
    return min(BIN_WIDTH, spread / MIN_BINS) if spread > 0 else BIN_WIDTH


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
