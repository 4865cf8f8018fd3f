"""Fitting: per-run sigmoid fits with intervals (sigmoid/), the laws across runs (laws/), and the decision rules
(rules/). Returns numbers and codes; words and plots are rlscale.views'. Never imports the runner."""

from rlscale.fitting.laws.powerlaw import PowerLawFit, fit_power_law
from rlscale.fitting.sigmoid import FitError, SigmoidFit, fit_sigmoid
from rlscale.fitting.sigmoid.points import record_breaking_points
from rlscale.fitting.sigmoid.runs import fit_runs

__all__ = [
    "FitError",
    "PowerLawFit",
    "SigmoidFit",
    "fit_power_law",
    "fit_runs",
    "fit_sigmoid",
    "record_breaking_points",
]
