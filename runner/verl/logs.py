"""verl's file-logger lines -> rlscale records.

verl's FileLogger (verl/utils/tracking.py) writes one line `{"step": N, "data": {metric: value}}` per logged step to
VERL_FILE_LOGGER_PATH, unbuffered. A job's file is read while the job runs, from the byte offset read so far, whole
lines only (a line still being written waits for the next read: rlscale.runner.jobs_api.LogTail).
"""

from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from rlscale.db.logs import VERL_HEALTH
from rlscale.runner.jobs_api import finite_number as _number

STEP_SECONDS = "timing_s/step"  # verl's wall seconds of one training step (generation, reward, update, eval, save)
RESPONSE_LENGTH = "response_length/mean"  # mean response tokens over the step's B_p x n rollouts
ANY_SOURCE = "*"  # stands for any data source in a ValReward name


@dataclass(frozen=True)
class ValReward:
    """Which logged verl metric is a study's val reward: `names` in order of preference, the first a line logs wins;
    `*` in a name matches any data source, and several sources matched are averaged (each source counts once)."""

    names: tuple[str, ...]

    def value(self, data: dict) -> float | None:
        """The val reward a file-logger line's `data` holds (None: the line has no validation)."""
        for name in self.names:
            if ANY_SOURCE not in name:
                if (value := _number(data.get(name))) is not None:
                    return value
                continue
            found = [v for key, value in data.items() if fnmatchcase(key, name) and (v := _number(value)) is not None]
            if found:
                return sum(found) / len(found)
        return None


def reward_metrics(data_source: str, samples: int) -> ValReward:
    """verl 0.9.1's validation reward of `samples` responses per prompt (val_kwargs.n) for `data_source` (or
    ANY_SOURCE): the summed token reward the trainer optimises, logged as val-core/<ds>/reward/mean@n, or as
    val-aux/... when the reward function also returns an `acc` (a float-returning function does: verl then files
    `acc` = the score under val-core; trainer/ppo/v1/trainer_base.py, _val_metrics_update)."""
    return ValReward(tuple(f"{section}/{data_source}/reward/mean@{samples}" for section in ("val-core", "val-aux")))


@dataclass
class RecordMaker:
    """A run's records from its jobs' lines, in the order the jobs ran.

    gpu_hours at a step = (GPU-seconds of the run's earlier jobs, whole wall time from start to end as the Jobs API
    reports it + GPUs held x the seconds of this job's steps so far, verl's timing_s/step summed per job) / 3600.
    rollouts: B_p x n x step. tokens: generated response tokens so far, response_length/mean x B_p x n summed over
    steps.
    A step logged by two jobs (a job resumed from a checkpoint before its predecessor's last step) keeps the first.
    """

    recipe: object
    val_metric: ValReward
    tokens_by_step: dict = field(default_factory=dict)
    step_seconds: dict = field(default_factory=dict)  # job -> its timing_s/step summed over the lines read so far

    def records(
        self, lines: list[dict], *, job: str, devices: int, base_device_seconds: float, started: float = 0.0
    ) -> list[dict]:
        """Records of `lines`, the next lines of job `job` (`started`, its start, is not needed: verl times its
        steps itself)."""
        batch = self.recipe.prompts_per_batch * self.recipe.rollouts
        gpus, base_gpu_seconds, job_seconds = devices, base_device_seconds, self.step_seconds.get(job, 0.0)
        out = []
        for line in lines:
            step, data = int(line["step"]), line.get("data") or {}
            seconds = _number(data.get(STEP_SECONDS))
            job_seconds += seconds or 0.0
            length = _number(data.get(RESPONSE_LENGTH))
            if length is not None:
                self.tokens_by_step.setdefault(step, length * batch)
            out.append(
                {
                    "step": step,
                    "gpu_hours": (base_gpu_seconds + gpus * job_seconds) / 3600.0,
                    "rollouts": step * batch,
                    "tokens": round(sum(tokens for s, tokens in self.tokens_by_step.items() if s <= step)),
                    "val_reward": self.val_metric.value(data),
                    "metrics": {
                        name: value
                        for name, source in VERL_HEALTH.items()
                        if (value := _number(data.get(source))) is not None
                    },
                }
            )
        self.step_seconds[job] = job_seconds
        return out
