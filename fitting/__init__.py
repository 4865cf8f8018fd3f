"""Fitting: record-breaking points, per-run sigmoid fits with intervals, the optimal-n law,
recommendations and reports. Never imports the runner."""

from rlscale.fitting.frame import fit_runs
from rlscale.fitting.plots import plot_study
from rlscale.fitting.powerlaw import PowerLawFit, fit_power_law
from rlscale.fitting.records import record_breaking_points

# `sigmoid` (the curve) is not re-exported: it would shadow the fitting.sigmoid module.
from rlscale.fitting.sigmoid import FitError, SigmoidFit, fit_sigmoid

__all__ = [
    "FitError",
    "PowerLawFit",
    "SigmoidFit",
    "fit_power_law",
    "fit_runs",
    "fit_sigmoid",
    "plot_study",
    "record_breaking_points",
]
