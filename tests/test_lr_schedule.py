"""One learning-rate rule on every engine (planner/frameworks/schedule.py): a schedule that decays over the run's
length decays over the run's planned steps (or the study's setup.lr_decay_steps), whichever step a job ends at.
Checked with each framework's own schedule code: verl's cosine (in .venv-verl) on the keys runner/verl/setup.py
sets, and transformers' schedules built by the TRL job's trainer (runner/trl/setup_train.py)."""

import json
import subprocess
import sys

import pytest
from rlscale.planner.frameworks import schedule
from rlscale.planner.frameworks.verl import ACTOR
from rlscale.planner.recipe import Recipe

PLANNED = 25

# verl's own cosine (verl/utils/torch_functional.py) at every step of a job, for each (job steps, keys) case
VERL_LRS = """
import json, sys, torch
from verl.utils.torch_functional import get_cosine_schedule_with_warmup
out = []
for case in json.load(sys.stdin):
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    lrs = get_cosine_schedule_with_warmup(optimizer, case["warmup"], case["job_steps"], min_lr_ratio=0.1,
                                          num_cycles=case["num_cycles"])
    seen = []
    for _ in range(case["steps"] + 1):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        lrs.step()
    out.append(seen)
print(json.dumps(out))
"""


def test_verls_cosine_decays_over_the_planned_steps_whichever_step_its_job_ends_at():
    from helpers import python_of
    from rlscale.runner.verl.setup import schedule_keys

    recipe = Recipe.model_validate({"engine": "verl", "steps": PLANNED})
    user = {f"{ACTOR}.optim.lr_scheduler_type": "cosine", f"{ACTOR}.optim.lr_warmup_steps_ratio": 0.1}
    cases = []
    for job_steps in (PLANNED, 40, 10 * PLANNED):  # one job to the plan; a rung past it; the compute stop's cap
        keys = schedule_keys(user, {"trainer.total_training_steps": (job_steps, "compute stop")}, recipe)
        warmup = keys[f"{ACTOR}.optim.lr_warmup_steps"][0]
        cycles = keys.get(f"{ACTOR}.optim.num_cycles", (0.5, None))[0]
        assert warmup == 3  # ceil(0.1 x 25): of the planned steps, not of the job's
        cases.append({"job_steps": job_steps, "warmup": warmup, "num_cycles": cycles, "steps": PLANNED})
        if job_steps != PLANNED:
            assert keys[f"{ACTOR}.optim.num_cycles"][1] == schedule.reason("cosine", PLANNED)
    done = subprocess.run(
        [str(python_of(".venv-verl")), "-c", VERL_LRS], input=json.dumps(cases), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lrs = json.loads(done.stdout.strip().splitlines()[-1])
    for seen in lrs[1:]:
        assert seen == pytest.approx(lrs[0], abs=1e-9)  # the same schedule, whatever the job's end
    assert lrs[0][3] == pytest.approx(1.0) and lrs[0][PLANNED] == pytest.approx(0.1)  # peak after warmup, floor at 25


def test_megatrons_decay_goes_over_the_planned_steps_and_a_steady_schedule_is_left_alone():
    from rlscale.runner.verl.setup import schedule_keys

    recipe = Recipe.model_validate({"engine": "verl", "steps": PLANNED})
    owned = {"trainer.total_training_steps": (10 * PLANNED, "compute stop")}
    megatron = schedule_keys({f"{ACTOR}.optim.lr_decay_style": "linear"}, owned, recipe)
    assert megatron == {f"{ACTOR}.optim.lr_decay_steps": (PLANNED, schedule.reason("linear", PLANNED))}
    assert schedule_keys({f"{ACTOR}.optim.lr_scheduler_type": "constant"}, owned, recipe) == {}
    study = schedule_keys({f"{ACTOR}.optim.lr_decay_style": "cosine"}, owned, recipe, study_steps=60)
    assert (
        study[f"{ACTOR}.optim.lr_decay_steps"][0] == 60
        and "the study's 60 lr_decay_steps" in study[f"{ACTOR}.optim.lr_decay_steps"][1]
    )


@pytest.mark.parametrize("schedule_name", ["linear", "cosine_with_min_lr"])
def test_trls_schedule_decays_over_the_planned_steps_in_every_segment(tmp_path, monkeypatch, schedule_name):
    pytest.importorskip("trl")
    if "vllm" not in sys.modules:  # TRL imports an installed vLLM (slow) that a CPU job does not use
        monkeypatch.setitem(sys.modules, "vllm", None)
    import torch
    from helpers import write_setup
    from rlscale.planner.frameworks.setup import setup_plan
    from rlscale.planner.planning import planned_runs
    from rlscale.planner.study_file import load_study
    from rlscale.runner.jobs_api import RunDir
    from rlscale.runner.trl.job import make_setup_job
    from rlscale.runner.trl.setup_train import trainer_class

    kwargs = {"lr_scheduler_kwargs": {"min_lr_rate": 0.1}} if schedule_name == "cosine_with_min_lr" else {}
    study_file, _ = write_setup(tmp_path, grpo={"lr_scheduler_type": schedule_name, **kwargs})
    study = load_study(study_file)
    plan, recipe = setup_plan(study), planned_runs(study)[0].recipe
    curves = []
    for until in (recipe.steps, 3 * recipe.steps):  # a job to the plan; one to past it (the compute stop's cap)
        job = make_setup_job(plan, recipe, RunDir(tmp_path / "run"), "run-1", until_step=until, python="python")
        composed = job.composed
        assert composed.lr_decay_updates == recipe.steps * composed.updates
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        cls = trainer_class(composed.lr_decay_updates)
        trainer = cls.__new__(cls)  # only its scheduler is under test: no model, no data
        trainer.args, trainer.optimizer, trainer.lr_scheduler = composed.parsed[1], optimizer, None
        lrs = trainer.create_scheduler(num_training_steps=composed.keys["max_steps"], optimizer=optimizer)
        curve = []
        for _ in range(composed.lr_decay_updates + 1):
            curve.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            lrs.step()
        curves.append(curve)
        listed = {change.key: change for change in composed.changes}
        if until != recipe.steps:  # the job's max_steps is not the plan's: the dry-run says so
            assert listed["lr_scheduler_type"].why == schedule.reason(schedule_name, recipe.steps)
    assert curves[0] == pytest.approx(curves[1])  # the same schedule, whatever the job's end
    floor = 0.1 if schedule_name == "cosine_with_min_lr" else 0.0
    assert curves[0][0] == pytest.approx(1.0) and curves[0][-1] == pytest.approx(floor, abs=1e-9)
