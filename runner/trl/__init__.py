"""The `trl` engine: each run as TRL 1.16.0 GRPOTrainer jobs (`python -m rlscale.runner.trl.train SPEC`) submitted
to a Ray cluster through Ray's Jobs API, with exactly the GRPOConfig `rlscale export --format trl` writes."""
