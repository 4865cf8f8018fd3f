"""The TRL job's record lines ({"step", "time", "val_reward", "metrics"} per rlscale step, written by callback.py) ->
rlscale records; the driver reads the file while the job runs (jobs_api.LogTail)."""

from rlscale.runner.jobs_api import Reading
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


def read_line(line: dict) -> Reading:
    """What a record line says (jobs_api.Reading): step, time written (epoch s), mean completion length, val reward and
    TRL's health metrics under the store's names (CISPO's clip fraction where TRL logs it apart)."""
    logs = line.get("metrics") or {}
    metrics = {name: value for name, source in TRL_HEALTH.items() if (value := _number(logs.get(source))) is not None}
    if "clip_fraction" not in metrics and (value := _number(logs.get(CISPO_CLIP))) is not None:
        metrics["clip_fraction"] = value
    return Reading(
        step=int(line["step"]),
        time=float(line["time"]),
        tokens_per_rollout=_number(logs.get(MEAN_LENGTH)),
        val_reward=_number(line.get("val_reward")),
        metrics=metrics,
    )
