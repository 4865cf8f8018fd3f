"""Study files: the shipped studies validate and plan; malformed studies fail with the field path."""

import copy
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rlscale.planner.planning import plan_study, planned_runs
from rlscale.planner.recipe import Recipe
from rlscale.planner.study import Study
from rlscale.planner.study_file import load_study, parse_study

from rlscale.base.errors import UserError

STUDIES = sorted((Path(__file__).parent.parent / "studies").glob("*.yaml"))
PLAYBOOK_GRID = {(2**a, 2**b) for a in range(5, 11) for b in range(3, 12) if 2 ** (a + b) <= 65536}

BAYES = {
    "name": "lr_search",
    "method": "bayes",
    "n_trials": 20,
    "compute": {"unit": "rollouts", "budget": 20000, "scope": "per_run"},
    "recipe": {"model": "tiny", "prompts_per_batch": 16, "rollouts": 8},
    "parameters": {
        "lr": {"min": 1.0e-5, "max": 1.0e-3, "distribution": "log_uniform"},
        "rollouts": {"min": 4, "max": 32, "distribution": "int_uniform"},
        "loss": {"values": ["cispo", "gspo"]},
    },
    "early_terminate": {"type": "hyperband", "min_fraction": 0.25, "eta": 3},
}


def test_the_shipped_studies_are_there():
    assert {p.stem for p in STUDIES} >= {"quickstart", "loss_ablation", "scalerl_loo", "isocompute_playbook"}


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.stem)
def test_every_shipped_study_validates_and_plans(path):
    study = load_study(path)
    assert study.name == path.stem
    assert path.read_text().startswith("#"), "each study opens with a comment saying what it answers"
    runs = planned_runs(study)
    assert runs and len({(r.name, r.seed) for r in runs}) == len(runs)
    for run in runs:
        assert run.recipe.steps >= (study.compute.min_steps if study.compute else 1)
        assert run.recipe.seed == run.seed
        assert run.gpu_hours > 0


def test_quickstart_fits_in_ten_minutes_of_two_cores():
    plan = plan_study(load_study(STUDIES[0].parent / "quickstart.yaml"))
    assert plan.profile.name == "tiny-cpu"
    devices = 2
    wall_seconds = plan.gpu_hours / devices * 3600
    assert wall_seconds < 6 * 60  # training time, measured profile; engine start and evals come on top
    assert all(r.recipe.steps >= 100 for r in plan.runs)  # enough steps to see each curve bend
    planned = [r.gpu_hours for r in plan.runs]
    assert max(planned) / min(planned) < 1.01  # IsoCompute: every run gets the same compute (whole steps aside)
    # n over four values, so the optimal-n law has a frontier to bend
    assert {(r.recipe.prompts_per_batch, r.recipe.rollouts) for r in plan.runs} == {(16, 2), (16, 4), (16, 8), (16, 16)}


def test_playbook_study_is_the_playbook_grid():
    study = load_study(STUDIES[0].parent / "isocompute_playbook.yaml")
    plan = plan_study(study)
    assert {(r.recipe.prompts_per_batch, r.recipe.rollouts) for r in plan.runs} == PLAYBOOK_GRID
    assert len(plan.dropped) == 6 * 9 - 39
    assert all(0 <= study.compute.budget - r.gpu_hours < r.gpu_hours / r.recipe.steps for r in plan.runs)


def test_loo_reverts_exactly_one_component_per_run():
    study = load_study(STUDIES[0].parent / "scalerl_loo.yaml")
    runs = {r.name: r.recipe.to_json() for r in planned_runs(study) if r.seed == 0}
    base = runs.pop("baseline")
    assert base["loss"] == "cispo" and base["async"] == "pipeline"
    reverted = {}
    for name, config in runs.items():
        changed = {k for k in config if config[k] != base[k]}
        assert len(changed) == 1, name
        reverted.update({k: config[k] for k in changed})
    assert reverted == {
        "loss": "dapo",
        "loss_agg": "sample",
        "adv_norm": "group",
        "fp32_head": False,
        "zero_variance_filter": False,
        "no_positive_resampling": None,
        "async": "ppo_off_policy",
    }


def test_loss_ablation_compares_the_three_losses_at_equal_compute():
    runs = planned_runs(load_study(STUDIES[0].parent / "loss_ablation.yaml"))
    assert {r.recipe.loss for r in runs} == {"dapo", "gspo", "cispo"}
    assert len({r.recipe.steps for r in runs}) == 1
    assert len(runs) == 3 * 3


def test_bayes_study_has_no_planned_runs_but_carries_the_search_space():
    study = parse_study(copy.deepcopy(BAYES), file="bayes.yaml")
    assert planned_runs(study) == []
    assert study.n_trials == 20
    assert study.parameters["lr"].is_range and study.parameters["lr"].distribution == "log_uniform"
    assert Study.model_validate(study.to_spec()) == study  # the spec stored with the study round-trips


def test_seeds_as_count_or_list():
    base = {"name": "s", "method": "grid", "parameters": {"loss": {"values": ["dapo"]}}}
    assert parse_study({**base, "seeds": 3}, file="s.yaml").seeds == [0, 1, 2]
    assert parse_study({**base, "seeds": [7, 11]}, file="s.yaml").seeds == [7, 11]
    assert parse_study(base, file="s.yaml").seeds == [0]


def test_total_scope_splits_the_budget_over_points_and_seeds():
    study = parse_study(
        {
            "name": "t",
            "method": "grid",
            "seeds": 2,
            "compute": {"unit": "rollouts", "budget": 4 * 2 * 100 * 128, "scope": "total"},
            "recipe": {"prompts_per_batch": 16, "rollouts": 8},
            "parameters": {"loss": {"values": ["dapo", "gspo", "cispo", "grpo"]}},
        },
        file="t.yaml",
    )
    runs = planned_runs(study)
    assert len(runs) == 8 and {r.recipe.steps for r in runs} == {100}


def test_study_without_compute_uses_the_recipe_steps():
    study = parse_study(
        {
            "name": "g",
            "method": "grid",
            "recipe": {"steps": 77},
            "parameters": {"adv_norm": {"values": ["batch", "none"]}},
        },
        file="g.yaml",
    )
    assert [r.recipe.steps for r in planned_runs(study)] == [77, 77]


def _write(tmp_path, data) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


GRID = {
    "name": "g",
    "method": "grid",
    "compute": {"budget": 0.05, "profile": "tiny-cpu"},
    "recipe": {"model": "tiny"},
    "parameters": {"loss": {"values": ["dapo", "cispo"]}},
}


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        (lambda d: d["recipe"].update(lossx="dapo"), "recipe.lossx", "unknown key"),
        (lambda d: d.update(metrics="val_reward"), "metrics", "unknown key"),
        (lambda d: d["compute"].update(budgett=1), "compute.budgett", "unknown key"),
        (lambda d: d["parameters"]["loss"].update(value=["dapo"]), "parameters.loss.value", "unknown key"),
        (
            lambda d: d["parameters"]["loss"]["values"].append("ppo"),
            "parameters.loss.values.2",
            "'cispo', 'gspo', 'dapo' or 'grpo'",
        ),
        (lambda d: d["parameters"].update(los={"values": ["dapo"]}), "parameters.los", "not a recipe key"),
        (lambda d: d["parameters"]["loss"].update(values=[]), "parameters.loss.values", "at least 1 item"),
        (lambda d: d["parameters"]["loss"].update(values=["dapo", "dapo"]), "parameters.loss.values.1", "duplicate"),
        (lambda d: d["compute"].update(budget=-16000), "compute.budget", "greater than 0"),
        (lambda d: d["compute"].update(unit="flops"), "compute.unit", "'gpu_hours', 'rollouts' or 'tokens'"),
        (lambda d: d["compute"].update(profile="h100"), "compute.profile", "unknown cost profile"),
        (lambda d: d.update(method="random"), "method", "'grid', 'isocompute', 'loo' or 'bayes'"),
        (lambda d: d.update(seeds="three"), "seeds", "valid list"),
        (lambda d: d.update(seeds=[1, 1]), "seeds", "distinct"),
        (lambda d: d["recipe"].update(prompts_per_batch=0), "recipe.prompts_per_batch", "greater than or equal to 1"),
        (lambda d: d["recipe"].update(steps=100), "recipe.steps", "set by compute.budget"),
        (lambda d: d["recipe"].update(verifier="os.system('rm -rf /')"), "recipe.verifier", "package.module:function"),
        (lambda d: d["parameters"].update(seed={"values": [1, 2]}), "parameters.seed", "seeds"),
        (lambda d: d["parameters"].update(lr={"min": 1e-5, "max": 1e-3}), "parameters.lr", "bayes"),
        (lambda d: d.update(method="isocompute"), "parameters", "prompts_per_batch or rollouts"),
        (
            lambda d: d.update(leave_one_out=[{"name": "x", "overrides": {"loss": "dapo"}}]),
            "leave_one_out",
            "only for method loo",
        ),
        (
            lambda d: d.update(early_terminate={"type": "median"}),
            "early_terminate.type",
            "'asymptote', 'hyperband' or 'none'",
        ),
        (lambda d: d.update(n_trials=5), "n_trials", "only for method bayes"),
        (lambda d: d.update(fit={"points": "best"}), "fit.points", "'record_breaking' or 'all'"),
        (
            lambda d: d.update(
                method="loo", parameters={}, leave_one_out=[{"name": "same", "overrides": {"loss": "cispo"}}]
            ),
            "leave_one_out.0.overrides.loss",
            "change nothing",
        ),
        (
            lambda d: d.update(
                method="loo", parameters={}, leave_one_out=[{"name": "v", "overrides": {"verifier": "a b"}}]
            ),
            "leave_one_out.0.overrides.verifier",
            "package.module:function",
        ),
    ],
)
def test_malformed_study_names_file_field_and_expectation(tmp_path, change, field, message):
    data = copy.deepcopy(GRID)
    change(data)
    path = _write(tmp_path, data)
    with pytest.raises(UserError) as err:
        load_study(path)
    assert err.value.file == str(path)
    assert err.value.field == field
    assert message in err.value.detail


def test_custom_verifier_is_a_name_never_evaluated():
    data = copy.deepcopy(GRID)
    data["recipe"]["verifier"] = "my_tasks.math:verify"
    assert parse_study(data, file="s.yaml").recipe.verifier == "my_tasks.math:verify"


def test_invalid_yaml_names_the_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nmethod: [grid\n")
    with pytest.raises(UserError) as err:
        load_study(path)
    assert err.value.field.startswith("line ")


# ---- fuzzing: every mutation of a valid study is rejected with a field path ---------------------------------

VALID = [yaml.safe_load(p.read_text()) for p in STUDIES] + [BAYES]
ENUMS = {
    "method",
    "unit",
    "scope",
    "type",
    "distribution",
    "loss",
    "loss_agg",
    "adv_norm",
    "async",
    "length_control",
    "lr_scaling",
}
# a mapping anywhere rejects a scalar field; a string rejects a container field (and no field accepts both)
WRONG_FOR_SCALAR = {"nested": [1, 2]}
WRONG_FOR_CONTAINER = "not-a-container"


def _nodes(data, path=()):
    """(path, value) of every node below the root."""
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else []
    for key, value in items:
        yield (*path, key), value
        yield from _nodes(value, (*path, key))


def _set(data, path, value):
    for key in path[:-1]:
        data = data[key]
    data[path[-1]] = value


def _dotted(path) -> str:
    return ".".join(str(p) for p in path)


@st.composite
def malformed(draw):
    """(data, expected field-path prefix) of a valid study broken in one place."""
    data = copy.deepcopy(draw(st.sampled_from(VALID)))
    nodes = list(_nodes(data))
    kind = draw(st.sampled_from(["unknown_key", "wrong_type", "bad_enum", "bad_budget", "empty_axis", "bad_count"]))
    if kind == "unknown_key":
        mappings = [((), data)] + [(p, v) for p, v in nodes if isinstance(v, dict)]
        path, mapping = draw(st.sampled_from(mappings))
        key = "x_" + draw(st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8))
        mapping[key] = draw(st.sampled_from([1, "dapo", None, True, [1], {"values": [1]}]))
        return data, _dotted((*path, key))
    if kind == "wrong_type":
        path, value = draw(st.sampled_from(nodes))
        if path[-1] in ("description",):
            path, value = ("name",), data["name"]
        _set(data, path, WRONG_FOR_CONTAINER if isinstance(value, (dict, list)) else WRONG_FOR_SCALAR)
        return data, _dotted(path)
    if kind == "bad_enum":
        enums = [(p, v) for p, v in nodes if p and p[-1] in ENUMS and isinstance(v, str)]
        enums += [((*p, i), x) for p, v in nodes if p[-1] == "values" and p[-2] in ENUMS for i, x in enumerate(v)]
        if not enums:
            enums = [(("method",), data["method"])]
        path, _ = draw(st.sampled_from(enums))
        _set(data, path, draw(st.sampled_from(["ppo", "GRPO", "random", "", "cispo ", "gpu-hours"])))
        return data, _dotted(path)
    if kind == "bad_budget":
        data.setdefault("compute", {"unit": "gpu_hours"})
        data["compute"]["budget"] = draw(st.sampled_from([0, -1, -16000, -0.5, float("nan"), float("-inf")]))
        return data, "compute.budget"
    if kind == "empty_axis":
        if data.get("parameters"):
            key = draw(st.sampled_from(sorted(data["parameters"])))
            data["parameters"][key] = {"values": []}
            return data, f"parameters.{key}"
        data["parameters"] = {"loss": {"values": []}}
        return data, "parameters"
    counts = [
        p
        for p, v in _nodes(data.get("recipe", {}), ("recipe",))
        if p[-1] in ("prompts_per_batch", "rollouts", "eval_every", "eval_samples", "generator_devices")
    ]
    path = draw(st.sampled_from(counts or [("recipe", "rollouts")]))
    data.setdefault("recipe", {})
    _set(data, path, draw(st.integers(-1000, 0)))
    return data, _dotted(path)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=malformed())
def test_fuzzed_malformed_studies_are_always_rejected_with_a_field_path(case):
    data, expected = case
    # through YAML, as a file would give it
    data = yaml.safe_load(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(UserError) as err:
        parse_study(data, file="fuzz.yaml")
    assert str(err.value).startswith("fuzz.yaml: ")
    assert err.value.field, str(err.value)
    assert err.value.field.startswith(expected) or expected.startswith(err.value.field), (expected, str(err.value))


def test_recipe_defaults_are_not_copied():
    # the study's base recipe is the Recipe itself: its defaults come from planner/recipe.py only
    study = parse_study({"name": "d", "method": "grid", "parameters": {"loss": {"values": ["dapo"]}}}, file="d.yaml")
    assert study.recipe == Recipe()


def test_early_evaluations_are_evenly_spaced_in_log_steps():
    recipe = Recipe(eval_every=25, eval_early_per_decade=6)
    assert [step for step in range(101) if recipe.is_eval_step(step)] == [0, 1, 2, 3, 5, 7, 10, 15, 22, 25, 50, 75, 100]
    assert [step for step in range(60) if Recipe(eval_every=25).is_eval_step(step)] == [0, 25, 50]
