"""The decision rules: reasons, standing (runs at a compute), recommend (the allocation), allocation (the next one),
best_run, compare (variants), early_stop and decision (the study's one Decision)."""
