"""The shared number helpers (rlscale/base/numbers.py): what a table cell and a JSON value show for every kind of
number the fits and the store hand over."""

import json
import math

import numpy as np
import pandas as pd

from rlscale.base.numbers import float_or_none, format_number, is_missing, json_safe


def test_table_cells_show_a_dash_for_anything_that_is_not_a_finite_number():
    for missing in (None, float("nan"), float("inf"), np.float64("nan"), pd.NA, "n/a"):
        assert format_number(missing) == "-"
    assert format_number(np.float32(0.25)) == "0.250"
    assert format_number(0.000123456, "{:.4g}") == "0.0001235"
    assert format_number(7, "{}") == "7"
    assert [format_number(v, "compact") for v in (16000.4, 999.94, 0.0123456)] == ["16,000", "999.9", "0.01235"]


def test_json_values_are_plain_and_strict():
    payload = {
        "A": np.float64(0.8),
        "n": np.int64(3),
        "lo": float("nan"),
        "hi": np.inf,
        "draws": np.array([1.0, np.nan]),
        "when": pd.NA,
        1: (np.bool_(True), None),
    }
    safe = json_safe(payload)
    assert safe == {"A": 0.8, "n": 3, "lo": None, "hi": None, "draws": [1.0, None], "when": None, "1": [True, None]}
    assert json.loads(json.dumps(safe, allow_nan=False)) == safe  # strict JSON: no NaN or Infinity
    assert type(safe["A"]) is float and type(safe["n"]) is int


def test_missing_and_float_or_none_agree():
    assert all(is_missing(v) for v in (None, math.nan, pd.NA, pd.NaT))
    assert not any(is_missing(v) for v in (0, 0.0, "", False))
    assert [float_or_none(v) for v in (None, math.nan, math.inf, np.float32(2.5), "3")] == [None, None, None, 2.5, 3.0]
