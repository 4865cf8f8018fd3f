"""The `verl` engine: each run as verl 0.9.1 jobs (`python3 -m verl.trainer.main_ppo`) submitted to a Ray cluster
through Ray's Jobs API. rlscale keeps everything above the job (plan, store, run identity, retries, rungs, fits)."""
