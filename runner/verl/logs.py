"""verl's file-logger lines -> rlscale records: verl's FileLogger (verl/utils/tracking.py) writes one line
`{"step": N, "data": {metric: value}}` per logged step to VERL_FILE_LOGGER_PATH, read while the job runs (LogTail)."""

from dataclasses import dataclass
from fnmatch import fnmatchcase

from rlscale.db.logs import VERL_HEALTH
from rlscale.runner.jobs_api import Reading
from rlscale.runner.jobs_api import finite_number as _number

from rlscale.base.compute import verl_step_seconds

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
    """verl 0.9.1's validation reward (val-core/<ds>/reward/mean@n, or val-aux/... when the reward also returns `acc`:
    trainer/ppo/v1/trainer_base.py, _val_metrics_update) of `samples` responses per prompt for `data_source`."""
    return ValReward(tuple(f"{section}/{data_source}/reward/mean@{samples}" for section in ("val-core", "val-aux")))


def line_reader(val_metric: ValReward):
    """What a file-logger line says (jobs_api.Reading): step, wall seconds as verl timed them (rlscale.base.compute),
    mean response length, the val reward (`val_metric`) and verl's health metrics under the store's names."""

    def read(line: dict) -> Reading:
        data = line.get("data") or {}
        return Reading(
            step=int(line["step"]),
            step_seconds=verl_step_seconds(data),
            tokens_per_rollout=_number(data.get(RESPONSE_LENGTH)),
            val_reward=val_metric.value(data),
            metrics={
                name: value for name, source in VERL_HEALTH.items() if (value := _number(data.get(source))) is not None
            },
        )

    return read
