"""`rlscale recommend`: the Playbook's allocation from a stored IsoCompute study, and its refusals."""

import json

import numpy as np
import pandas as pd
import pytest
from helpers import bench, run_cli, seed_isocompute
from rlscale.fitting.laws.optimal_n import RolloutsLaw
from rlscale.fitting.rules.reasons import Reason
from rlscale.fitting.rules.recommend import Refusal, recommend
from rlscale.planner.cost import TINY_CPU, step_gpu_hours, steps_within


def _law(identified=True, hi=6.0):
    front = pd.DataFrame(
        {
            "compute": [1.0, 100.0],
            "reward": [0.3, 0.7],
            "rollouts": [4, 64],
            "prompts_per_batch": [32, 32],
            "run": ["a", "b"],
        }
    )
    verdict = (
        Reason("law_identified")
        if identified
        else Reason("frontier_few_n", {"rollouts": [4, 64], "compute_lo": 1.0, "compute_hi": 100.0, "min_distinct": 3})
    )
    return RolloutsLaw(
        lo=2.0,
        hi=hi,
        k=3.0,
        c0=np.log(10.0),
        identified=identified,
        verdict=verdict,
        compute_range=(1.0, 100.0),
        frontier=front,
    )


def _curves(rows):
    base = {
        "status": "done",
        "B": 1.5,
        "C_mid": 10.0,
        "R0": 0.1,
        "r2": 0.99,
        "n_points": 20,
        "reason": "",
        "c_min": 1.0,
        "c_max": 100.0,
        "truncation_rate": 0.01,
        "identified": True,
        "run_id": None,
    }
    out = []
    for run, bp, n, A, extra in rows:
        out.append(
            {
                **base,
                "run": run,
                "prompts_per_batch": bp,
                "rollouts": n,
                "A": A,
                "A_lo": A - 0.01,
                "A_hi": A + 0.01,
                **extra,
            }
        )
    return pd.DataFrame(out)


def _steps(budget, bp, n, run):
    return int(budget // (bp * n))


def test_takes_the_smallest_prompts_per_batch_within_the_noise_band():
    curves = _curves(
        [
            ("bp16", 16, 64, 0.785, {}),
            ("bp32", 32, 64, 0.80, {}),
            ("bp64", 64, 64, 0.79, {}),
            ("bp8", 8, 64, 0.70, {}),
            ("n4", 32, 4, 0.5, {}),
        ]
    )
    rec = recommend(curves, _law(), budget=1e5, steps_for=_steps)
    assert (rec.prompts_per_batch, rec.rollouts) == (16, 64)  # 0.785 is within 0.02 of 0.80; 0.70 is not
    assert rec.steps == int(1e5 // (16 * 64))
    assert rec.predicted_from == "bp16"
    assert [row["run"] for row in rec.evidence if row["chosen"]] == ["bp16"]


def test_skips_runs_that_trained_unstably():
    curves = _curves(
        [("bp16", 16, 64, 0.80, {"truncation_rate": 0.12}), ("bp32", 32, 64, 0.79, {}), ("n4", 32, 4, 0.5, {})]
    )
    rec = recommend(curves, _law(), budget=1e5, steps_for=_steps)
    assert rec.prompts_per_batch == 32
    assert not next(r for r in rec.evidence if r["run"] == "bp16")["stable"]


def test_refuses_when_the_law_is_not_identified():
    curves = _curves([("bp32", 32, 64, 0.8, {}), ("n4", 32, 4, 0.5, {})])
    with pytest.raises(Refusal) as refused:
        recommend(curves, _law(identified=False), budget=1e5, steps_for=_steps)
    assert refused.value.codes == ["law_not_identified"]
    assert refused.value.reasons[0]["law"].code == "frontier_few_n"


def test_refuses_when_the_fits_at_the_recommended_n_are_unidentified():
    curves = _curves(
        [
            ("bp32", 32, 64, 0.8, {"identified": False, "reason": "has not passed the inflection"}),
            ("n4", 32, 4, 0.5, {}),
        ]
    )
    with pytest.raises(Refusal) as refused:
        recommend(curves, _law(), budget=1e5, steps_for=_steps)
    assert refused.value.codes == ["no_trusted_run_at_n"]
    reason = refused.value.reasons[0]
    assert reason["rollouts"] == 64 and reason["identified_required"]
    assert reason["runs"] == [{"run": "bp32", "why": "has not passed the inflection"}]


def test_refuses_when_the_budget_buys_no_step():
    curves = _curves([("bp32", 32, 64, 0.8, {}), ("n4", 32, 4, 0.5, {})])
    with pytest.raises(Refusal) as refused:
        recommend(curves, _law(), budget=10.0, steps_for=_steps)
    assert refused.value.codes == ["budget_buys_no_step"]
    assert refused.value.reasons[0].values == {"budget": 10.0, "prompts_per_batch": 32, "rollouts": 64}


# --- the command, on a stored synthetic study --------------------------------------------------------------


def _cli(args, capsys, monkeypatch):
    return run_cli(monkeypatch, capsys, *args)


def test_recommend_command_recovers_n_star_and_prices_the_steps(workdir, capsys, monkeypatch):
    url = f"sqlite:///{workdir / 'rl.db'}"
    truth, c_obs = bench.CASES["saturates_64"]
    seed_isocompute(url, "iso", truth, c_obs)
    budget = 4 * c_obs
    code, out, err = _cli(
        [
            "recommend",
            "--budget",
            str(budget),
            "--study",
            "iso",
            "--db",
            url,
            "--profile",
            "tiny-cpu",
            "--bootstrap",
            "20",
            "--json",
        ],
        capsys,
        monkeypatch,
    )
    assert code == 0, err
    rec = json.loads(out)
    n_true = bench.true_optimal_rollouts(truth, budget)
    assert abs(np.log2(rec["rollouts"]) - np.log2(n_true)) <= 1
    assert rec["prompts_per_batch"] == 16  # B_p 16 gives up 0.01 of asymptote (within noise): the smallest wins
    cost = step_gpu_hours(TINY_CPU, rec["prompts_per_batch"], rec["rollouts"])
    assert rec["steps"] == steps_within(budget, cost, TINY_CPU.startup_gpu_hours)
    lo, hi = rec["predicted_interval"]
    assert lo <= rec["predicted_reward"] <= hi
    assert (
        rec["predicted_level"] == 0.9
    )  # the prediction interval of the reward at the budget (fitting/laws/predict.py)
    assert any(row["chosen"] for row in rec["evidence"])

    code, out, _ = _cli(
        [
            "recommend",
            "--budget",
            str(budget),
            "--study",
            "iso",
            "--db",
            url,
            "--profile",
            "tiny-cpu",
            "--bootstrap",
            "0",
        ],
        capsys,
        monkeypatch,
    )
    assert code == 0 and "recommendation" in out and "evidence" in out


def test_recommend_command_refuses_with_the_reason_and_exit_2(workdir, capsys, monkeypatch):
    url = f"sqlite:///{workdir / 'rl.db'}"
    truth, c_obs = bench.CASES["still_rising"]
    seed_isocompute(url, "rising", truth, c_obs)
    code, out, err = _cli(
        ["recommend", "--budget", "120", "--db", url, "--bootstrap", "0", "--json"], capsys, monkeypatch
    )
    assert code == 2
    refusal = json.loads(out)
    assert refusal["refused"] is True and refusal["reasons"][0]["code"] == "law_not_identified"
    # the frontier has not bent: n* still moves at the largest compute observed
    assert refusal["reasons"][0]["values"]["law"]["code"] in ("n_still_moving", "plateau_unseen")
    assert err.startswith("error") and "\n" not in err.strip()


@pytest.mark.parametrize("fit, expected", [(None, "record-breaking points"), ({"points": "all"}, "every evaluation")])
def test_the_study_says_which_points_each_run_is_fitted_on(workdir, capsys, monkeypatch, fit, expected):
    # IsoCompute fits each run's record-breaking points unless the study's `fit.points` says every evaluation
    # (on validation noise as wide as the 0.01 bins, the record breakers are the noise's upper edge)
    from rlscale.db.store import Store
    from rlscale.fitting.sigmoid.points import record_breaking_points

    url = f"sqlite:///{workdir / 'rl.db'}"
    truth, c_obs = bench.CASES["saturates_64"]
    seed_isocompute(url, "iso", truth, c_obs, fit=fit)
    with Store(url) as store:
        records = store.records_frame("iso").dropna(subset=["val_reward"])
        names = dict(zip(store.runs_frame("iso")["run_id"], store.runs_frame("iso")["run"]))
    points = {
        names[run_id]: len(record_breaking_points(group["gpu_hours"], group["val_reward"]))
        if fit is None
        else len(group)
        for run_id, group in records.groupby("run_id")
    }
    assert fit is not None or all(points[name] < (records["run_id"].map(names) == name).sum() for name in points)

    code, out, err = _cli(
        ["report", "iso", "--db", url, "--out", "rep", "--bootstrap", "0", "--json"], capsys, monkeypatch
    )
    assert code == 0, err
    report = json.loads(out)
    assert report["fitted_on"] == expected
    assert {row["run"]: row["n_points"] for row in report["fits"]} == points
    # `rlscale fit --study` fits (and saves) the same points
    code, out, err = _cli(["fit", "--study", "iso", "--db", url, "--json"], capsys, monkeypatch)
    assert code == 0, err
    assert {row["run"]: row["n_points"] for row in json.loads(out)} == points


def test_the_fits_table_of_a_quickstart_sized_study_fits_80_columns(workdir, capsys, monkeypatch):
    # what `make demo` prints on an 80-column terminal: every cell whole, the "fit" column included
    from rlscale.cli.console import console
    from rlscale.views.report import fit_cells

    url = f"sqlite:///{workdir / 'rl.db'}"
    truth, c_obs = bench.CASES["still_rising"]  # some fits unidentified: "no (1)" must fit too
    seed_isocompute(url, "iso", truth, c_obs)
    code, out, err = _cli(
        ["report", "iso", "--db", url, "--out", "rep", "--bootstrap", "20", "--json"], capsys, monkeypatch
    )
    fits = json.loads(out)["fits"]
    assert any(not row["identified"] for row in fits)
    monkeypatch.setattr(console, "_width", 80)
    code, out, err = _cli(["report", "iso", "--db", url, "--out", "rep", "--bootstrap", "20"], capsys, monkeypatch)
    assert code == 0, err
    table = out[out.index("sigmoid fits") :]
    table = table[: table.index("└")]
    rows = [line.rstrip() for line in table.splitlines()[1:]]  # rich crops what does not fit: the edge must show
    assert rows and all(len(line) <= 80 and line[-1] in "┓┃┩│" for line in rows), "\n".join(rows)
    for row in fits:
        cells = fit_cells(row)
        assert cells[1] in table and cells[3] in table, row["run"]  # A [lo, hi] and C_mid whole


def test_steps_past_a_runs_data_go_on_at_its_own_compute_per_step_over_its_second_half():
    from rlscale.fitting.rules.decision import run_rate_steps

    # 2.0 of start-up, then 0.5 a step to step 40; the first half's costs do not count
    records = pd.DataFrame(
        {"run": "r", "step": range(0, 41, 5), "gpu_hours": [0.0] + [2.0 + 0.5 * s for s in range(5, 41, 5)]}
    )
    assert run_rate_steps(records, "r", "gpu_hours", 22.0) is None  # within its data (it reached 22 at step 40)
    assert run_rate_steps(records, "r", "gpu_hours", 32.0) == (60, 0.5)
    assert run_rate_steps(records, "r", "gpu_hours", 32.4) == (60, 0.5)  # no step past the budget
    assert run_rate_steps(records[records["step"] == 40], "r", "gpu_hours", 30.0) is None  # one record: no rate


def test_an_isocompute_budget_is_read_on_the_studys_metric():
    from pathlib import Path

    from rlscale.fitting.rules.allocation import decision_budget
    from rlscale.planner.study_file import load_study

    study = load_study(Path(__file__).resolve().parents[1] / "studies" / "quickstart.yaml")
    study = study.model_copy(update={"metric": "score"})
    runs = pd.DataFrame({"run_id": [1, 2], "status": ["done", "done"]})
    # run 2's last step has a val_reward but no score: the study's fits end at its last score, at 0.2
    records = pd.DataFrame(
        {
            "run_id": [1, 1, 2, 2],
            "gpu_hours": [0.1, 0.3, 0.2, 0.25],
            "score": [1.0, 2.0, 1.5, None],
            "val_reward": [0.1, 0.2, 0.15, 0.16],
        }
    )
    assert decision_budget(study, runs, records) == pytest.approx(0.2)
