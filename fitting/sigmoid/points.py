"""Record-breaking points (IsoCompute Playbook): the running frontier of a reward curve."""

import numpy as np

# Rewards like 0.3 / 0.01 land at 29.999999999999996; nudge so a value on a bin edge opens that bin.
_EDGE = 1e-9


def fits_record_breaking(study) -> bool:
    """Whether a stored Study's runs are fitted on their record-breaking points (its `fit.points`); a study imported
    without a spec (None) is read as a grid: every evaluation."""
    return study is not None and study.fits_record_breaking


def fitted_points_label(record_breaking: bool) -> str:
    """The points a run's fit used, in words, for titles and reports."""
    return "record-breaking points" if record_breaking else "every evaluation"


def record_breaking_points(compute, reward, bin_width: float = 0.01) -> np.ndarray:
    """Indices (into the inputs) of the points that set a new reward record, in compute order.

    Points are sorted by compute (ties keep their input order); reward is bucketed into bins of
    `bin_width`; a point is kept when it is the first to enter a bin above every earlier point's bin.
    Points with a non-finite compute or reward are skipped.
    """
    compute = np.asarray(compute, dtype=float).ravel()
    reward = np.asarray(reward, dtype=float).ravel()
    if compute.shape != reward.shape:
        raise ValueError(f"compute and reward differ in length: {compute.size} vs {reward.size}")
    if not bin_width > 0:
        raise ValueError(f"bin_width must be > 0, got {bin_width}")
    finite = np.flatnonzero(np.isfinite(compute) & np.isfinite(reward))
    order = finite[np.argsort(compute[finite], kind="stable")]
    bins = np.floor(reward[order] / bin_width + _EDGE)
    # A point breaks the record when its bin beats the best bin of all points before it.
    best_before = np.concatenate(([-np.inf], np.maximum.accumulate(bins)[:-1])) if bins.size else bins
    return order[bins > best_before]
