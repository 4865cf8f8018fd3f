"""The `trl` engine: each run as TRL 1.16.0 GRPOTrainer jobs (`python -m rlscale.runner.trl.train SPEC`) submitted
to a Ray cluster through Ray's Jobs API, with exactly the GRPOConfig `rlscale export --format trl` writes.

data.py: the task as a datasets.Dataset; reward.py: the verifier as a TRL reward function; job.py: a run segment's
GRPOConfig, spec and paths; train.py: the job itself (GRPOTrainer + a callback writing JSONL records); logs.py:
those lines -> rlscale records; engine.py: submit, follow, pause, stop, resume through the Jobs API.
"""
