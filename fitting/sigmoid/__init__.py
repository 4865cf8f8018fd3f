"""One run's curve, fitted: the ScaleRL sigmoid (curve.py), its solver (solver.py), noise models (noise.py),
profile-likelihood interval (profile.py), bootstrap (bootstrap.py), the points a fit uses (points.py) and the fit
itself (fit.py); runs.py fits each run of a frame."""

from rlscale.fitting.sigmoid.fit import (
    N_PARAMS,
    NOISE_MODELS,
    FitError,
    SigmoidFit,
    curve_and_jacobian,
    fit_sigmoid,
    levenberg_marquardt,
    sigmoid,
)

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
