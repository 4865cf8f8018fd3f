"""Fitting: record-breaking points, per-run sigmoid fits with intervals, the optimal-n law,
recommendations and reports. Never imports the runner."""

from fitting.frame import fit_runs
from fitting.plots import plot_study
from fitting.powerlaw import PowerLawFit, fit_power_law
from fitting.records import record_breaking_points
# `sigmoid` (the curve) is not re-exported: it would shadow the fitting.sigmoid module.
from fitting.sigmoid import FitError, SigmoidFit, fit_sigmoid

__all__ = ["FitError", "PowerLawFit", "SigmoidFit", "fit_power_law", "fit_runs", "fit_sigmoid", "plot_study",
           "record_breaking_points"]
