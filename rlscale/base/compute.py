"""A run's compute: devices held x wall seconds, stored as `gpu_hours` (device-hours; CPU cores on a CPU-only host)."""

import math

SECONDS_PER_HOUR = 3600.0
# what verl logs every step (verl/trainer/ppo/metric_utils.py: compute_timing_metrics, compute_throughout_metrics)
VERL_STEP_SECONDS = "timing_s/step"  # the step's wall seconds: generation, reward, update, validation, save
VERL_TIME_PER_STEP = "perf/time_per_step"  # the same seconds, beside the throughput
VERL_TOKENS = "perf/total_num_tokens"  # prompt and response tokens of the step
VERL_THROUGHPUT = "perf/throughput"  # tokens / (step seconds x verl's GPU count)


def device_hours(device_seconds: float) -> float:
    """Device-seconds in the store's unit, device-hours (`gpu_hours`)."""
    return device_seconds / SECONDS_PER_HOUR


def held(devices: float, seconds: float) -> float:
    """Device-seconds of `devices` held for `seconds` of wall time (time before the start counts 0)."""
    return devices * max(0.0, seconds)


def verl_step_seconds(data: dict) -> float | None:
    """The wall seconds of one step verl logged (timing_s/step, else perf/time_per_step); None if it logged neither."""
    for name in (VERL_STEP_SECONDS, VERL_TIME_PER_STEP):
        value = data.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
            return float(value)
    return None


def verl_step_device_seconds(data: dict, devices: float | None = None) -> float | None:
    """Device-seconds of one verl step: wall seconds x `devices`, else tokens / throughput; None if unreadable."""
    seconds = verl_step_seconds(data)
    if devices is not None and seconds is not None:
        return held(devices, seconds)
    tokens, throughput = data.get(VERL_TOKENS), data.get(VERL_THROUGHPUT)
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (tokens, throughput)):
        return None
    if tokens <= 0:
        return 0.0
    return float(tokens) / float(throughput) if throughput > 0 else None


def step_rollouts(prompts_per_batch: int, rollouts: int) -> int:
    return prompts_per_batch * rollouts


def step_tokens(prompts_per_batch: int, rollouts: int, tokens_per_rollout: float) -> float:
    """B_p x n x `tokens_per_rollout` (the plan's max_new_tokens, an upper bound, or the mean a run measured)."""
    return step_rollouts(prompts_per_batch, rollouts) * tokens_per_rollout
