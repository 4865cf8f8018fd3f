"""A `model` axis: planned at equal compute, fitted across sizes in the report, the size for a budget recommended."""

import json

import numpy as np
import pandas as pd
import pytest
from helpers import run_cli
from rlscale.fitting.laws.model_size import MAX_BEYOND, choose_size, fit_size_law, winner_changes
from rlscale.fitting.laws.powerlaw import crossover_resource
from rlscale.fitting.rules.reasons import Refusal
from rlscale.planner.cost import Profile

# ln L = -k ln C + E: the small model starts lower but learns slower; they cross at C* = exp(0.8 / 0.15) ~ 207
LINES = {"/m/small": (0.5e9, 0.20, -0.5), "/m/large": (4e9, 0.35, 0.3)}
CROSSOVER = float(np.exp((0.3 + 0.5) / (0.35 - 0.20)))
STUDY = """\
name: sizes
method: grid
compute: {unit: gpu_hours, budget: 2000}
recipe: {prompts_per_batch: 16, rollouts: 4}
parameters:
  model: {values: [/m/small, /m/large]}
models:
  /m/small: {parameters: 0.5e9, profile: small-gpu}
  /m/large: {parameters: 4.0e9, profile: large-gpu}
"""


def frame(lines=LINES, noise=0.01, seed=0, computes=np.geomspace(5, 2000, 30)):
    rng = np.random.default_rng(seed)
    rows = []
    for model, (n, k, E) in lines.items():
        loss = np.exp(-k * np.log(computes) + E + noise * rng.standard_normal(computes.size))
        rows += [
            {"model": model, "parameters": n, "run": model, "compute": c, "loss": value}
            for c, value in zip(computes, loss)
        ]
    return pd.DataFrame(rows)


def test_the_crossover_budget_is_where_the_two_sizes_predicted_losses_cross():
    law = fit_size_law(frame(), bootstrap=60)
    ((below, above, at),) = winner_changes(law.k, law.E)
    assert (law.models[below], law.models[above]) == ("/m/small", "/m/large")
    assert at == pytest.approx(CROSSOVER, rel=0.1)
    losses = np.exp(-law.k * np.log(at) + law.E)
    assert losses[0] == pytest.approx(losses[1], rel=1e-9)
    assert choose_size(law, at / 2).model == "/m/small"  # a tight budget: the smaller model trained longer
    choice = choose_size(law, at * 2)
    assert choice.model == "/m/large"
    c = choice.crossovers[0]
    assert c["budget_lo"] < CROSSOVER < c["budget_hi"] and c["budget_hi"] / c["budget_lo"] < 2 and c["identified"]


def test_crossover_resource_is_analytic_and_nan_for_parallel_lines():
    assert crossover_resource(0.2, -0.5, 0.35, 0.3) == pytest.approx(CROSSOVER)
    assert np.isnan(crossover_resource(0.2, -0.5, 0.2, 0.3))


def test_refuses_when_a_size_does_not_learn_or_the_budget_is_far_past_the_data():
    flat = frame({**LINES, "/m/large": (4e9, 0.0, -1.0)}, noise=0.05)
    with pytest.raises(Refusal) as refused:
        choose_size(fit_size_law(flat, bootstrap=40), 100.0)
    assert refused.value.codes == ["size_not_learning"] and refused.value.reasons[0]["model"] == "/m/large"
    with pytest.raises(Refusal) as refused:
        choose_size(fit_size_law(frame(), bootstrap=20), 1e6)
    past = refused.value.reasons[0]
    assert refused.value.codes == ["size_budget_past_data"] and past["model"] == "/m/small"
    assert (
        past["budget"] == 1e6 and past["factor"] == pytest.approx(1e6 / past["reach"]) and past["factor"] > MAX_BEYOND
    )


@pytest.fixture
def sizes_study(workdir):
    from rlscale.planner.profiles import save_profile

    # per-rollout cost proportional to the parameter count: equal compute buys the 8x smaller model 8x the steps
    save_profile(Profile(name="small-gpu", gpu_hours_per_rollout=0.05))
    save_profile(Profile(name="large-gpu", gpu_hours_per_rollout=0.4))
    (workdir / "sizes.yaml").write_text(STUDY)
    return workdir / "sizes.yaml"


def test_a_model_axis_plans_each_size_at_equal_compute_by_its_own_profile(sizes_study):
    from rlscale.planner.planning import plan_study
    from rlscale.planner.study_file import load_study

    runs = {run.recipe.model: run for run in plan_study(load_study(sizes_study)).runs}
    assert runs["/m/small"].recipe.steps == 625 and runs["/m/large"].recipe.steps == 78  # 2000 / (64 x cost)
    assert runs["/m/small"].gpu_hours == pytest.approx(runs["/m/large"].gpu_hours, rel=0.01)


def _store_runs(study_path, url):
    from rlscale.db.store import Store
    from rlscale.planner.planning import plan_study
    from rlscale.planner.study_file import load_study

    study = load_study(study_path)
    store = Store(url)
    store.upsert_study(study.name, study.to_spec())
    rng = np.random.default_rng(1)
    for run in plan_study(study).runs:
        _, k, E = LINES[run.recipe.model]
        run_id = store.ensure_run(study.name, run.name, run.recipe.to_json(), seed=run.seed)
        steps = np.unique(np.geomspace(1, run.recipe.steps, 25).astype(int))
        hours = run.gpu_hours * steps / steps[-1]
        reward = 1 - np.exp(-k * np.log(hours) + E + 0.01 * rng.standard_normal(hours.size))
        store.add_records(
            run_id,
            [{"step": int(s), "gpu_hours": float(h), "val_reward": float(r)} for s, h, r in zip(steps, hours, reward)],
        )
        store.set_run_status(run_id, "done")
    store.close()
    return study.name


def test_a_study_with_a_model_axis_reports_the_law_and_recommends_the_size(sizes_study, workdir, capsys, monkeypatch):
    url = f"sqlite:///{workdir / 'rl.db'}"
    name = _store_runs(sizes_study, url)
    code, out, err = run_cli(
        monkeypatch, capsys, "report", name, "--db", url, "--out", "rep", "--bootstrap", "20", "--json"
    )
    assert code == 0, err
    sizes = json.loads(out)["sizes"]
    assert [row["model"] for row in sizes["sizes"]] == ["/m/small", "/m/large"]
    assert sizes["sizes"][1]["k"] == pytest.approx(0.35, abs=0.02)
    assert "Across model sizes" in (workdir / "rep" / "report.md").read_text()
    for budget, model in ((CROSSOVER / 3, "/m/small"), (CROSSOVER * 3, "/m/large")):
        code, out, err = run_cli(
            monkeypatch,
            capsys,
            "recommend",
            "--study",
            name,
            "--db",
            url,
            "--budget",
            str(budget),
            "--bootstrap",
            "40",
            "--json",
        )
        assert code == 0, err
        choice = json.loads(out)
        assert choice["model"] == model
        assert choice["crossovers"][0]["budget"] == pytest.approx(CROSSOVER, rel=0.15)
    code, out, err = run_cli(
        monkeypatch, capsys, "recommend", "--study", name, "--db", url, "--budget", "1e7", "--json"
    )
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert [reason["code"] for reason in json.loads(out)["reasons"]] == ["size_budget_past_data"]


@pytest.mark.parametrize(
    "edit, field",
    [
        ("  /m/large: {parameters: 4.0e9, profile: large-gpu}\n", "parameters.model.values.1"),
        ("profile: large-gpu", "models./m/large.profile"),
        ("parameters: 0.5e9", "models./m/small.parameters"),
    ],
)
def test_bad_model_axis_input_exits_2_naming_the_file_and_field(sizes_study, capsys, monkeypatch, edit, field):
    broken = {
        "parameters.model.values.1": "",
        "models./m/large.profile": "profile: no-such-profile",
        "models./m/small.parameters": "parameters: -3",
    }[field]
    sizes_study.write_text(STUDY.replace(edit, broken))
    code, out, err = run_cli(monkeypatch, capsys, "plan", str(sizes_study))
    assert code == 2
    assert f"sizes.yaml: {field}" in err and len(err.strip().splitlines()) == 1


def test_k_max_and_n0_are_recovered_across_sizes_and_a_falling_k_is_not_identified():
    from rlscale.fitting.laws.powerlaw import learning_efficiency

    sizes = [0.5e9, 2e9, 8e9, 32e9]
    rising = {f"/m/{n:g}": (n, float(learning_efficiency(n, 0.4, 3e9)), 0.1 * np.log(n / 1e9)) for n in sizes}
    law = fit_size_law(frame(rising, noise=0.002), bootstrap=10)
    assert law.across_identified, law.across_reason
    assert law.across.K_max == pytest.approx(0.4, rel=0.05) and law.across.N0 == pytest.approx(3e9, rel=0.15)
    falling = {name: (n, 0.5 - k, E) for name, (n, k, E) in rising.items()}
    law = fit_size_law(frame(falling, noise=0.002), bootstrap=10)
    assert not law.across_identified and "does not rise with N" in law.across_reason
