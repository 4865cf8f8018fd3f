"""Numbers every layer shares: ScaleRL's noise band, missing values, numpy made plain for JSON, table number format."""

import math
from typing import Any

NOISE_BAND = 0.02  # ScaleRL: a difference in asymptote |dA| below this is seed-to-seed noise (3 seeds' spread)


def is_missing(value: Any) -> bool:
    """None, pandas' NA/NaT or a float NaN."""
    return (
        value is None
        or type(value).__name__ in ("NAType", "NaTType")
        or (isinstance(value, float) and math.isnan(value))
    )


def plain(value: Any) -> Any:
    """A numpy scalar as the Python number it holds (0-d arrays too); anything else unchanged."""
    if hasattr(value, "item") and getattr(value, "shape", None) == ():
        return value.item()
    return value


def float_or_none(value: Any) -> float | None:
    """`value` as a finite float, or None when it is missing, NaN or infinite."""
    if is_missing(value):
        return None
    value = float(plain(value))
    return value if math.isfinite(value) else None


def json_safe(value: Any) -> Any:
    """`value` walked, numpy made plain, missing or non-finite numbers None (PostgreSQL's JSON has no NaN)."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    value = plain(value)
    if hasattr(value, "tolist"):  # a numpy array
        return json_safe(value.tolist())
    if is_missing(value) or (isinstance(value, float) and not math.isfinite(value)):
        return None
    return value


def format_number(value: Any, fmt: str = "{:.3f}") -> str:
    """`value` by `fmt` (str.format, or "compact": 12,345 from 1,000 up, else 4 digits); "-" if not a finite number."""
    value = plain(value)
    if is_missing(value):
        return "-"
    try:
        if not math.isfinite(value):
            return "-"
        if fmt == "compact":
            return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
        return fmt.format(value)
    except (TypeError, ValueError):
        return "-"
