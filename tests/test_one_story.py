"""One story in every view (#40): the decision, the variants table, the frontier behind optimal_n.png and the report
name the same best n and the same runs within the noise band, on a study where the measures they used to read
disagreed (each run's observed end at its own compute, the frontier past the compute every run reached)."""

import json

import numpy as np
import pytest
from helpers import run_cli
from rlscale.fitting.sigmoid.curve import sigmoid
from rlscale.planner.recipe import Recipe

C = 0.035  # the compute every run reached: the decision's
# n -> (A, C_mid, last compute): n4 leads at C, n8 within 0.02 of it, n2 beyond; n8 ran on to 2 C, n2 to 1.1 C
RUNS = {2: (0.86, 0.004, 1.1 * C), 4: (0.905, 0.005, C), 8: (0.92, 0.008, 2 * C)}


def seed_study(url: str) -> None:
    from rlscale.db.store import Store
    from rlscale.planner.study_file import parse_study

    spec = parse_study(
        {
            "name": "story",
            "method": "isocompute",
            "compute": {"unit": "gpu_hours", "budget": C, "profile": "tiny-cpu"},
            "parameters": {"prompts_per_batch": {"values": [16]}, "rollouts": {"values": sorted(RUNS)}},
            "recipe": {"engine": "trl"},
            "fit": {"points": "all"},
        },
        file="test",
    ).to_spec()
    rng = np.random.default_rng(0)
    with Store(url) as store:
        store.upsert_study("story", spec)
        for n, (A, c_mid, end) in RUNS.items():
            recipe = Recipe(prompts_per_batch=16, rollouts=n, engine="trl")
            run_id = store.ensure_run("story", f"n{n}", recipe.to_json())
            hours = np.linspace(0.0, end, int(round(40 * end / C)) + 1)
            reward = rng.binomial(16384, sigmoid(hours, A, 1.5, c_mid, 0.3)) / 16384
            store.add_records(
                run_id,
                [
                    {"step": i, "gpu_hours": float(h), "val_reward": float(r), "metrics": {"truncation_rate": 0.01}}
                    for i, (h, r) in enumerate(zip(hours, reward))
                ],
            )
            store.set_run_status(run_id, "done")


@pytest.fixture
def story(workdir, capsys, monkeypatch):
    url = f"sqlite:///{workdir / 'story.db'}"
    seed_study(url)
    code, out, err = run_cli(
        monkeypatch, capsys, "report", "story", "--db", url, "--out", "rep", "--bootstrap", "20", "--json"
    )
    assert code == 0, err
    return url, json.loads(out), (workdir / "rep" / "report.md").read_text()


def test_the_measures_the_views_used_to_read_disagree_on_this_study(story):
    _, report, _ = story
    ends = {row["variant"]: row["end_mean"] for row in report["comparison"]["rows"]}
    assert ends["n8"] - ends["n4"] >= 0.02  # each run's observed end, at its own compute: n8 "separated" above n4
    assert report["law"]["frontier"][-1]["rollouts"] == 8  # past C only n2 and n8 compete: the old plot's end


def test_every_view_names_the_same_best_n_and_the_same_runs_within_the_band(story, capsys, monkeypatch):
    url, report, markdown = story
    decision = report["decision"]
    assert decision["budget"] == pytest.approx(C) and decision["compute"] == pytest.approx(C)
    rec = decision["recommendation"]
    assert (rec["rollouts"], rec["predicted_from"], rec["basis"]["code"]) == (4, "n4", "within_data")
    best, band = "n4", ["n4", "n8"]
    assert (decision["standing"]["best"], decision["standing"]["within_band"]) == (best, band)
    assert rec["standing"]["within_band"] == band
    # the variants table reads the same fitted rewards at the same compute, with the same rule
    comparison = report["comparison"]
    assert comparison["compute"] == pytest.approx(C) and comparison["rows"][0]["variant"] == best
    assert [row["variant"] for row in comparison["rows"] if row["within_band"]] == band
    assert comparison["verdict"]["values"]["within_band"] == band
    # the frontier behind optimal_n.png: n* at C is the decision's n, and the plot marks it
    law = report["law"]
    assert (law["at_compute"]["rollouts"], law["at_compute"]["within_band"]) == (4, band)
    inside = [segment for segment in law["frontier"] if segment["compute_from"] <= C * (1 + 1e-9)]
    assert inside[-1]["rollouts"] == 4
    # `rlscale recommend` at the same budget decides the same
    code, out, err = run_cli(
        monkeypatch,
        capsys,
        "recommend",
        "--study",
        "story",
        "--db",
        url,
        "--budget",
        str(C),
        "--bootstrap",
        "20",
        "--json",
    )
    assert code == 0, err
    again = json.loads(out)
    assert (again["rollouts"], again["predicted_from"], again["standing"]["within_band"]) == (4, "n4", band)
    # the report opens with that decision; the export it names is the study's own framework (trl)
    assert markdown.index("## Decision") < markdown.index("## Runs at") < markdown.index("## Variants across seeds")
    assert decision["export_format"] == "trl"
    assert decision["commands"]["export"].startswith("rlscale export --format trl --study story --budget 0.035")
    assert decision["kind"] == "allocation" and decision["refusal"] is None
    # and that command exports the decided n
    code, out, err = run_cli(monkeypatch, capsys, *decision["commands"]["export"].split()[1:])
    assert code == 0, err
    assert "num_generations: 4" in out.splitlines()


def test_the_report_gives_the_compute_each_run_needs_to_reach_the_best_runs_reward(story):
    _, report, markdown = story
    targets = report["targets"]
    best = report["decision"]["standing"]["runs"][0]
    assert targets["target"] == pytest.approx(best["reward"]) and targets["level"] == 0.9
    reach = {row["run"]: row["reach"] for row in targets["runs"]}
    assert reach["n4"]["code"] == "reached" and reach["n4"]["values"]["compute"] == pytest.approx(C, rel=1e-6)
    assert reach["n8"]["code"] == "reached" and reach["n8"]["values"]["compute"] > C  # slower, within the band
    assert reach["n2"]["code"] == "not_reached"  # its A (0.86) is below the target
    assert "## Compute to reach a reward of" in markdown
