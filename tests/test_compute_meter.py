"""One compute meter, one record maker and one stop rule for every engine (rlscale.base.compute, runner/jobs_api.py,
runner/engine.py), tested as the pure pieces they are.

tests/data/verl_file_logger.jsonl is a log recorded by verl 0.9.1's own FileLogger, its metrics made by verl's own
functions (compute_data_metrics, compute_timing_metrics, compute_throughout_metrics with 4 GPUs, the v1 trainer's
validation metrics; tests/checkers/verl_engine_check.py's `_log`): 12 steps of 8 to 20 s, validations every 5."""

import json
import math
from pathlib import Path

import pytest
from rlscale.db.logs import read_training_log
from rlscale.planner.planning import plan_study
from rlscale.planner.recipe import Recipe
from rlscale.planner.study import Study
from rlscale.runner.engine import COMPUTE_STEP_CAP, ComputeStop, step_cap
from rlscale.runner.jobs_api import LogTail, RecordMaker, StepTotals
from rlscale.runner.trl.logs import read_line
from rlscale.runner.verl.logs import line_reader, reward_metrics

from rlscale.base.compute import step_tokens, verl_step_device_seconds

RECORDED = Path(__file__).parent / "data" / "verl_file_logger.jsonl"
GSM8K = reward_metrics("openai/gsm8k", 2)


def test_a_recorded_verl_log_gives_the_same_gpu_hours_live_and_imported():
    lines = LogTail(RECORDED).read()
    live = RecordMaker(line_reader(GSM8K), 8).records(lines, job="r-1", devices=4, base_device_seconds=0.0)
    imported = read_training_log(RECORDED)
    assert imported.attrs["compute_unit"] == "gpu_hours"
    by_step = {int(row.step): row.compute for row in imported.itertuples()}  # the evaluated steps: 0, 5, 10
    assert sorted(by_step) == [0, 5, 10]
    for record in live:
        if record["step"] in by_step:
            assert math.isclose(record["gpu_hours"], by_step[record["step"]], rel_tol=1e-12), record["step"]
    # 4 GPUs x verl's own step seconds: steps 1..10 took 9.5 + 0.75 s x step, +4 s at the validations
    assert math.isclose(by_step[10], 4 * (10 * 9.5 + 0.75 * 55 + 2 * 4) / 3600)


def test_a_verl_step_without_its_seconds_falls_back_to_verls_throughput():
    data = {"perf/total_num_tokens": 7200, "perf/throughput": 200.0}
    assert verl_step_device_seconds(data) == 36.0  # tokens / (tokens per second per GPU)
    assert verl_step_device_seconds({**data, "timing_s/step": 10.0}, devices=8) == 80.0  # the devices the job holds
    assert verl_step_device_seconds({"perf/total_num_tokens": 0, "perf/throughput": 0}) == 0.0
    assert verl_step_device_seconds({}) is None


def verl_line(step: int, seconds: float, length: float | None = None, reward: float | None = None) -> dict:
    data = {"timing_s/step": seconds, "actor/entropy": 0.5}
    if length is not None:
        data["response_length/mean"] = length
    if reward is not None:
        data["val-core/openai/gsm8k/reward/mean@2"] = reward
    return {"step": step, "data": data}


def test_the_record_maker_charges_each_job_its_devices_and_continues_the_run_across_jobs():
    maker = RecordMaker(line_reader(GSM8K), 16)
    first = maker.records(
        [verl_line(1, 10.0, 4.0), verl_line(2, 20.0, 6.0, reward=0.5)],
        job="r-1",
        devices=2,
        base_device_seconds=0.0,
    )
    assert [r["gpu_hours"] * 3600 for r in first] == [20.0, 60.0]  # 2 GPUs x the steps' seconds
    assert [r["rollouts"] for r in first] == [16, 32] and [r["tokens"] for r in first] == [64, 160]
    assert first[1]["val_reward"] == 0.5 and first[0]["val_reward"] is None
    assert first[0]["metrics"] == {"entropy": 0.5}
    # the next read of the same job carries its clock on
    more = maker.records([verl_line(3, 5.0, 1.0)], job="r-1", devices=2, base_device_seconds=0.0)
    assert more[0]["gpu_hours"] * 3600 == 70.0 and more[0]["tokens"] == 176
    # a resumed job re-logs step 3 (a checkpoint at 2): its tokens count once, its seconds start from the base
    resumed = maker.records(
        [verl_line(3, 6.0, 9.0), verl_line(4, 6.0, 2.0)], job="r-2", devices=4, base_device_seconds=40.0
    )
    assert [r["gpu_hours"] * 3600 for r in resumed] == [64.0, 88.0]
    assert [r["tokens"] for r in resumed] == [176, 208]


def test_trl_lines_are_charged_from_their_jobs_start():
    maker = RecordMaker(read_line, 8)
    line = {"step": 2, "time": 1_030.0, "val_reward": None, "metrics": {"completions/mean_length": 5.0}}
    (record,) = maker.records([line], job="r-1", devices=3, base_device_seconds=10.0, started=1_000.0)
    assert record["gpu_hours"] * 3600 == pytest.approx(10.0 + 3 * 30.0) and record["tokens"] == 40
    cispo = {"step": 3, "time": 1_031.0, "metrics": {"cispo_clip_ratio": 0.2, "reward": 0.4}}
    (record,) = maker.records([cispo], job="r-1", devices=3, base_device_seconds=10.0, started=1_000.0)
    assert record["metrics"] == {"clip_fraction": 0.2, "train_reward": 0.4}


def test_step_totals_keep_the_first_value_and_a_step_that_comes_late():
    totals = StepTotals()
    for step, value in [(1, 1.0), (2, 2.0), (4, 4.0), (2, 99.0), (3, 3.0)]:
        totals.add(step, value)
    assert [totals.through(step) for step in range(6)] == [0.0, 1.0, 3.0, 6.0, 10.0, 10.0]


def records(per_step: float, steps: int, start: float = 0.0) -> list[dict]:
    return [{"step": step, "gpu_hours": start + per_step * step} for step in range(steps + 1)]


# a plan below half a step still trains one: step 0 only evaluates, its cost a step is not known yet
@pytest.mark.parametrize("target, last", [(4.4, 4), (4.5, 4), (4.6, 5), (0.2, 1)])
def test_the_compute_stop_ends_at_the_step_nearest_the_plan(target, last):
    stop = ComputeStop(target)
    kept = stop.trim(records(1.0, 8)[:3]) + stop.trim(records(1.0, 8)[3:])  # two reads of one run
    assert kept[-1]["step"] == last and stop.reached
    assert stop.trim(records(1.0, 8)) == []  # nothing after the end
    assert ComputeStop(None).trim(records(1.0, 8)) == records(1.0, 8)


def test_a_jobs_start_up_is_charged_but_not_taken_for_a_step():
    # 20 device-hours of start-up before step 0, then 1 a step: the plan 23.4 ends at step 3, not at the start
    stop = ComputeStop(23.4)
    assert stop.trim(records(1.0, 8, start=20.0))[-1]["step"] == 3


def test_every_engine_stops_by_one_rule():
    # builtin's job asks with its clock at each step, the Jobs-API engines trim their records, the driver asks on a
    # restart and on --extend: one ComputeStop, the step cost counted from the run's first record
    assert ComputeStop(4.5, origin=(0, 0.0)).reaches(4, 4.0) and not ComputeStop(4.51, origin=(0, 0.0)).reaches(4, 4.0)
    # a resumed job's view from its origin equals the whole run's: 20 of start-up, then 1 a step
    run = records(1.0, 8, start=20.0)
    whole = ComputeStop(23.4)
    assert [whole.reaches(r["step"], r["gpu_hours"]) for r in run].index(True) == 3
    assert ComputeStop(23.4, origin=(0, 20.0)).reaches(3, 23.0) and not ComputeStop(23.4, origin=(0, 20.0)).reaches(
        2, 22.0
    )
    assert not ComputeStop(None).reaches(8, 1e9)
    recipe = Recipe(steps=30)
    assert step_cap(recipe, None) == 30 and step_cap(recipe, 2.0) == 30 * COMPUTE_STEP_CAP


def test_a_plan_priced_in_tokens_counts_a_step_as_the_decision_does():
    study = Study.model_validate(
        json.loads(
            '{"name": "t", "method": "grid", "compute": {"unit": "tokens", "budget": 1e6, "scope": "per_run"},'
            '"parameters": {"rollouts": {"values": [4, 8]}}, "recipe": {"prompts_per_batch": 16, "max_new_tokens": 32}}'
        )
    )
    for run in plan_study(study).runs:
        per_step = step_tokens(16, run.recipe.rollouts, 32)
        assert run.recipe.steps == int(1e6 // per_step)
