"""Fitting: record-breaking points, per-run sigmoid fits with intervals, the optimal-n law,
recommendations and reports. Never imports the runner."""
