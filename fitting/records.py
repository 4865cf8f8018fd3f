"""Record-breaking points (IsoCompute Playbook): the running frontier of a reward curve."""

import numpy as np

# Rewards like 0.3 / 0.01 land at 29.999999999999996; nudge so a value on a bin edge opens that bin.
_EDGE = 1e-9


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
