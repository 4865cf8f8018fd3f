"""The TRL job's record lines -> rlscale records.

The job's callback (callback.py) writes {"step", "time", "val_reward", "metrics"} per rlscale step; the driver reads
the file while the job runs (rlscale.runner.jobs_api.LogTail: whole lines only, from the offset read so far).
"""

from dataclasses import dataclass, field

from rlscale.runner.jobs_api import finite_number as _number

# rlscale's health metric -> TRL 1.16's logged name (GRPOTrainer._metrics, Trainer's grad_norm)
TRL_HEALTH = {
    "train_reward": "reward",
    "entropy": "entropy",
    "kl": "kl",
    "grad_norm": "grad_norm",
    "truncation_rate": "completions/clipped_ratio",
    "clip_fraction": "clip_ratio/region_mean",
}
CISPO_CLIP = "cispo_clip_ratio"  # TRL's CISPO logs the fraction of tokens whose weight hit its cap here instead
MEAN_LENGTH = "completions/mean_length"  # mean completion tokens over the step's B_p x n rollouts


@dataclass
class RecordMaker:
    """A run's records from its jobs' lines, in the order the jobs ran.

    gpu_hours at a step = (device-seconds of the run's earlier jobs, whole wall time as the Jobs API reports it +
    devices held x wall seconds from this job's start to the line) / 3600. rollouts: B_p x n x step. tokens:
    generated completion tokens so far, completions/mean_length x B_p x n summed over steps (the first job to log a
    step counts it).
    """

    recipe: object
    batch: int | None = None  # completions per step (a setup study's generation batch); None: the recipe's B_p x n
    tokens_by_step: dict = field(default_factory=dict)

    def records(
        self, lines: list[dict], *, job: str, devices: int, base_device_seconds: float, started: float
    ) -> list[dict]:
        """Records of `lines`, the next lines of job `job`, which started at epoch second `started`."""
        batch = self.batch or self.recipe.total_batch
        out = []
        for line in lines:
            step, logs = int(line["step"]), line.get("metrics") or {}
            length = _number(logs.get(MEAN_LENGTH))
            if length is not None:
                self.tokens_by_step.setdefault(step, length * batch)
            metrics = {
                name: value for name, source in TRL_HEALTH.items() if (value := _number(logs.get(source))) is not None
            }
            if "clip_fraction" not in metrics and (value := _number(logs.get(CISPO_CLIP))) is not None:
                metrics["clip_fraction"] = value
            seconds = max(0.0, float(line["time"]) - started)
            out.append(
                {
                    "step": step,
                    "gpu_hours": (base_device_seconds + devices * seconds) / 3600.0,
                    "rollouts": step * batch,
                    "tokens": round(sum(tokens for s, tokens in self.tokens_by_step.items() if s <= step)),
                    "val_reward": _number(line.get("val_reward")),
                    "metrics": metrics,
                }
            )
        return out
