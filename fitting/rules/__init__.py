"""The decision rules: structured reasons (reasons.py), the runs at a compute (standing.py), the allocation
(recommend.py), the next allocation (allocation.py), the best run (best_run.py), variant comparison (compare.py),
early termination (early_stop.py), and the study's one decision (decision.py)."""
