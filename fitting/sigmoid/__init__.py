"""One run's curve, fitted: the sigmoid (curve.py), solver, noise models, profile likelihood, bootstrap, the points a
fit uses (points.py) and the fit itself (fit.py); runs.py fits each run of a frame."""

from rlscale.fitting.sigmoid.curve import N_PARAMS, curve_and_jacobian, sigmoid
from rlscale.fitting.sigmoid.fit import FitError, SigmoidFit, fit_sigmoid
from rlscale.fitting.sigmoid.noise import NOISE_MODELS
from rlscale.fitting.sigmoid.solver import levenberg_marquardt

__all__ = [
    "NOISE_MODELS",
    "N_PARAMS",
    "FitError",
    "SigmoidFit",
    "curve_and_jacobian",
    "fit_sigmoid",
    "levenberg_marquardt",
    "sigmoid",
]
