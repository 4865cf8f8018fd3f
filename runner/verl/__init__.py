"""The `verl` engine: each run as verl 0.9.1 jobs (`python3 -m verl.trainer.main_ppo`) submitted to a Ray cluster
through Ray's Jobs API. rlscale keeps everything above the job (plan, store, run identity, retries, rungs, fits).

data.py: the task as verl's parquet files; reward.py: the verifier as verl's custom reward function (runs on the
cluster); job.py: a run segment's entrypoint, Hydra overrides and paths; logs.py: verl's file-logger lines ->
rlscale records; engine.py: submit, follow, pause, stop, resume through the Jobs API. A study on the user's own
verl setup: setup.py (their command with the study's and the run's keys), checks.py (their data and reward, checked
on the driver).
"""
