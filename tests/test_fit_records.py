"""Record-breaking points on hand-made sequences."""

import numpy as np
import pytest
from rlscale.fitting.sigmoid.points import record_breaking_points


def test_keeps_first_point_entering_each_higher_bin():
    compute = [1, 2, 3, 4, 5, 6]
    reward = [0.10, 0.105, 0.12, 0.115, 0.13, 0.131]
    # bins of 0.01: 10, 10, 12, 11, 13, 13 -> records at 0.10, 0.12, 0.13
    assert record_breaking_points(compute, reward).tolist() == [0, 2, 4]


def test_sorts_by_compute_and_returns_input_indices():
    compute = [30.0, 10.0, 20.0]
    reward = [0.5, 0.2, 0.4]
    assert record_breaking_points(compute, reward).tolist() == [1, 2, 0]


def test_bin_width_is_a_parameter():
    compute = np.arange(5)
    reward = [0.10, 0.14, 0.19, 0.21, 0.26]
    assert record_breaking_points(compute, reward, bin_width=0.1).tolist() == [0, 3]
    assert record_breaking_points(compute, reward, bin_width=0.05).tolist() == [0, 2, 3, 4]


def test_value_on_a_bin_edge_opens_that_bin():
    # 0.3 / 0.01 is 29.999999999999996 in floating point; it still belongs to bin 30.
    assert record_breaking_points([1, 2], [0.295, 0.30]).tolist() == [0, 1]


def test_drops_and_dips_never_count_and_non_finite_points_are_skipped():
    compute = [1, 2, 3, np.nan, 5, 6]
    reward = [0.5, 0.2, np.inf, 0.9, 0.49, 0.52]
    assert record_breaking_points(compute, reward).tolist() == [0, 5]


def test_empty_input_and_bad_arguments():
    assert record_breaking_points([], []).tolist() == []
    with pytest.raises(ValueError, match="differ in length"):
        record_breaking_points([1, 2], [0.1])
    with pytest.raises(ValueError, match="bin_width"):
        record_breaking_points([1], [0.1], bin_width=0)
