"""IsoCompute grids: the Playbook's grid exactly, equal compute per point, the budget respected."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rlscale.planner.cost import SCALERL_8B, Profile, run_gpu_hours, step_gpu_hours
from rlscale.planner.grid import allocate, isocompute_plan, parse_axis

from rlscale.base.errors import UserError

# the IsoCompute Playbook's axes: B_p in 2^5..2^10, n in 2^3..2^11, B_p * n <= B_max (studies/isocompute_playbook.yaml)
PLAYBOOK_PROMPTS = tuple(2**k for k in range(5, 11))
PLAYBOOK_ROLLOUTS = tuple(2**k for k in range(3, 12))
PLAYBOOK_MAX_BATCH = 65536
PLAYBOOK_GRID = {(2**a, 2**b) for a in range(5, 11) for b in range(3, 12) if 2 ** (a + b) <= 65536}


def test_playbook_axes_give_exactly_the_playbook_grid():
    budget = 3_000_000.0  # enough GPU-hours that even 1024 x 64 rollouts per step gets steps
    plan = isocompute_plan(
        budget, PLAYBOOK_PROMPTS, PLAYBOOK_ROLLOUTS, profile=SCALERL_8B, max_batch=PLAYBOOK_MAX_BATCH
    )
    grid = {(p.prompts_per_batch, p.rollouts) for p in plan.points}
    assert grid == PLAYBOOK_GRID
    assert len(grid) == 39
    # every point at the same compute, within one step of it, and the sweep within the budget
    assert plan.per_run_gpu_hours == pytest.approx(budget / 39)
    for p in plan.points:
        step = step_gpu_hours(SCALERL_8B, p.prompts_per_batch, p.rollouts)
        assert 0 <= plan.per_run_gpu_hours - p.gpu_hours < step
        assert p.total_rollouts == p.prompts_per_batch * p.rollouts * p.steps
    assert plan.total_gpu_hours <= budget
    # what fell outside B_max is listed, and only that
    assert {(d.prompts_per_batch, d.rollouts) for d in plan.dropped} == {
        (bp, n) for bp in PLAYBOOK_PROMPTS for n in PLAYBOOK_ROLLOUTS
    } - PLAYBOOK_GRID


def test_scalerl_profile_reproduces_the_published_run():
    # ScaleRL: 100k GPU-hours for ~7,400 steps of 48 x 16 rollouts
    assert run_gpu_hours(SCALERL_8B, 48, 16, 7400) == pytest.approx(100_000)
    assert SCALERL_8B.gpu_hours_per_rollout == pytest.approx(0.0176, rel=0.01)
    plan = isocompute_plan(100_000, [48], [16], profile=SCALERL_8B)
    assert plan.points[0].steps == 7400


def test_isocompute_steps_scale_inversely_with_batch():
    # no overhead: steps * B_p * n is the same rollout budget for every point
    profile = Profile(name="linear", gpu_hours_per_rollout=0.01)
    plan = isocompute_plan(4 * 1024 * 10 * 0.01, [32, 64], [8, 16], profile=profile)
    assert {p.total_rollouts for p in plan.points} == {10 * 1024}
    assert {(p.prompts_per_batch, p.rollouts, p.steps) for p in plan.points} == {
        (32, 8, 40),
        (32, 16, 20),
        (64, 8, 20),
        (64, 16, 10),
    }


def test_points_below_min_steps_are_dropped_and_their_budget_redistributed():
    profile = Profile(name="unit", gpu_hours_per_rollout=1.0)
    plan = isocompute_plan(30.0, [1], [1, 2, 100], profile=profile, min_steps=5)
    # all three would get 10 GPU-hours each and n=100 could not take one step; the other two share 30
    assert [(p.rollouts, p.steps) for p in plan.points] == [(1, 15), (2, 7)]
    assert plan.per_run_gpu_hours == 15
    [dropped] = plan.dropped
    assert dropped.rollouts == 100 and "5 step(s)" in dropped.reason


# a hand-made profile (the built-in tiny-cpu one is re-calibrated from measurements): 1 device-second per
# step plus 1/32 s per rollout, 60 s to start
HAND = Profile(
    name="hand", gpu_hours_per_rollout=1 / 32 / 3600, step_overhead_gpu_hours=1 / 3600, startup_gpu_hours=60 / 3600
)


def test_per_run_budget_is_one_points_compute():
    plan = isocompute_plan(0.05, [8, 16], [4, 8], profile=HAND, per_run=True, min_steps=10)
    assert plan.per_run_gpu_hours == 0.05
    assert plan.budget_gpu_hours == pytest.approx(4 * 0.05)
    # 180 s minus 60 s of start-up: 8 x 4 steps cost 2 s, 8 x 8 and 16 x 4 cost 3 s, 16 x 8 costs 5 s
    assert sorted(p.steps for p in plan.points) == [24, 40, 40, 60]


def test_budget_too_small_for_any_point_is_a_user_error():
    with pytest.raises(UserError, match="--budget"):
        isocompute_plan(0.001, [8], [4], profile=HAND)  # 3.6 s does not even pay the start-up


@pytest.mark.parametrize("budget", [0.0, -16000.0, float("nan"), float("inf")])
def test_non_positive_budget_is_rejected(budget):
    with pytest.raises(UserError, match="--budget"):
        isocompute_plan(budget, profile=SCALERL_8B)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("32,64,128", [32, 64, 128]),
        ("8,16,...,2048", [2**k for k in range(3, 12)]),
        ("3, 5, 7", [3, 5, 7]),
        ("1,3,...,81", [1, 3, 9, 27, 81]),
        ("48", [48]),
    ],
)
def test_parse_axis(text, expected):
    assert parse_axis(text, option="--rollouts") == expected


@pytest.mark.parametrize("text", ["", " , ", "0,8", "-8,16", "8,x", "8,8", "8,12,...,64", "8,...,64", "16,8,...,2"])
def test_bad_axes_are_user_errors_naming_the_option(text):
    with pytest.raises(UserError) as err:
        parse_axis(text, option="--prompts")
    assert err.value.field == "--prompts"


axis = st.lists(st.integers(1, 4096), min_size=1, max_size=6, unique=True)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prompts=axis,
    rollouts=axis,
    max_batch=st.none() | st.integers(1, 1 << 22),
    per_rollout=st.floats(1e-7, 1.0),
    overhead=st.floats(0, 10),
    startup=st.floats(0, 100),
    budget=st.floats(1e-3, 1e7),
    per_run=st.booleans(),
    min_steps=st.integers(1, 50),
)
def test_plan_invariants(prompts, rollouts, max_batch, per_rollout, overhead, startup, budget, per_run, min_steps):
    profile = Profile(
        name="p", gpu_hours_per_rollout=per_rollout, step_overhead_gpu_hours=overhead, startup_gpu_hours=startup
    )
    try:
        plan = isocompute_plan(
            budget,
            sorted(prompts),
            sorted(rollouts),
            profile=profile,
            max_batch=max_batch,
            per_run=per_run,
            min_steps=min_steps,
        )
    except UserError:
        return  # nothing fits: the budget is too small or max_batch excludes everything
    seen = [(p.prompts_per_batch, p.rollouts) for p in plan.points] + [
        (d.prompts_per_batch, d.rollouts) for d in plan.dropped
    ]
    assert sorted(seen) == sorted((bp, n) for bp in prompts for n in rollouts)
    share = plan.per_run_gpu_hours
    for p in plan.points:
        assert p.steps >= min_steps
        assert max_batch is None or p.prompts_per_batch * p.rollouts <= max_batch
        slack = 1e-9 * share  # float rounding only
        assert -slack <= share - p.gpu_hours < step_gpu_hours(profile, p.prompts_per_batch, p.rollouts) + slack
    assert plan.total_gpu_hours <= plan.budget_gpu_hours * (1 + 1e-9)
    if not per_run:
        assert plan.budget_gpu_hours == budget
        assert share == pytest.approx(budget / len(plan.points))


def test_allocate_never_splits_a_tie():
    # two equally costly points either both run or both drop
    share, steps = allocate([1.0, 2.0, 2.0], 9.0, per_run=False, min_steps=3)
    assert steps == [9, None, None] and share == 9.0
