"""One decision for every view: on the demo's real sweeps (bench/data/quickstart, stored under the quickstart study's
spec), the report's decision, `recommend` and `export` at the budget the report prints name the same run and n, and
every command the report prints as a next step runs (exit 0) on the same store."""

import json
import shlex
from pathlib import Path

import pandas as pd
import pytest
import yaml
from rlscale.db.store import Store
from rlscale.planner.planning import planned_runs
from rlscale.planner.study_file import load_study, stored_spec

ROOT = Path(__file__).resolve().parents[1]
SWEEPS = sorted((ROOT / "bench" / "data" / "quickstart").glob("sweep*_*.csv"))


def store_demo_sweep(url: str, csv: Path, study_file: Path = ROOT / "studies" / "quickstart.yaml") -> str:
    """The quickstart study (or a variant of it) with one demo sweep's measured records (run bp16,nN -> the planned
    point n N)."""
    study = load_study(study_file)
    records = pd.read_csv(csv)
    with Store(url) as store:
        store.upsert_study(study.name, stored_spec(study))  # as a sweep stores it: with its file
        for point in planned_runs(study):
            run_id = store.ensure_run(study.name, point.name, point.recipe.to_json(), point.seed)
            mine = records[records["run"] == point.name].sort_values("step")
            store.add_records(
                run_id,
                [
                    {"step": int(r.step), "gpu_hours": float(r.gpu_hours), "val_reward": float(r.val_reward)}
                    for r in mine.itertuples()
                ],
            )
            store.set_run_status(run_id, "done")
    return study.name


def printed(command: str) -> list[str]:
    """A printed `rlscale ...` command as the arguments after `rlscale`."""
    words = shlex.split(command)
    assert words[0] == "rlscale"
    return words[1:]


@pytest.mark.parametrize("csv", SWEEPS[:2], ids=lambda path: path.stem)
def test_report_recommend_and_export_agree_and_every_printed_command_runs(csv, cli, tmp_path):
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    name = store_demo_sweep(url, csv)
    code, out, err = cli("report", name, "--db", url, "--out", str(tmp_path / "report"), "--json", "--bootstrap", "0")
    assert code == 0, err
    decision = json.loads(out)["decision"]
    rec = decision["recommendation"]
    assert rec is not None, decision["refusal"]
    commands = decision["commands"]
    # the printed budget reproduces the decision: the same float, not a rounding of it
    assert float(printed(commands["evidence"])[printed(commands["evidence"]).index("--budget") + 1]) == rec["budget"]

    code, out, err = cli(*printed(commands["evidence"]), "--json")
    assert code == 0, err
    recommended = json.loads(out)
    assert (recommended["predicted_from"], recommended["rollouts"]) == (rec["predicted_from"], rec["rollouts"])
    assert recommended["prompts_per_batch"] == rec["prompts_per_batch"] and recommended["steps"] == rec["steps"]

    code, out, err = cli(*[w if w != "verl" else "yaml" for w in printed(commands["export"])])
    assert code == 0, err
    exported = yaml.safe_load(out)
    assert (exported["rollouts"], exported["prompts_per_batch"], exported["steps"]) == (
        rec["rollouts"],
        rec["prompts_per_batch"],
        rec["steps"],
    )
    code, out, err = cli(*printed(commands["export"]))  # and in the study's own framework, as printed
    assert code == 0, err
    if commands["extend"]:  # the extension is a sweep: its study file must parse and plan (a dry run)
        words = printed(commands["extend"])
        assert words[0] == "sweep" and "--extend" in words
        code, out, err = cli(*words, "--dry-run")
        assert code == 0, err


def test_steps_follow_the_chosen_runs_own_records_across_their_end_and_past_it(cli, tmp_path):
    # a sweep imported from its log, its compute in another unit (x 66.6) and one run cut short: the study's cost
    # model is too poor to use (r2 < 0.5), and pricing past the data by another model's profile gave M = 3 steps
    records = pd.read_csv(SWEEPS[0])
    records["gpu_hours"] *= 66.6
    records = records[(records["run"] != "bp16,n16") | (records["step"] <= 15)]
    records.to_csv(tmp_path / "runs.csv", index=False)
    url = f"sqlite:///{tmp_path / 's.db'}"
    assert cli("import", str(tmp_path / "runs.csv"), "--study", "cut", "--db", url, "--reward", "val_reward")[0] == 0
    chosen = records[records["run"] == "bp16,n8"].sort_values("step")
    reach, last = float(chosen["gpu_hours"].iloc[-1]), int(chosen["step"].iloc[-1])
    steps = []
    for factor in (0.9, 1.0, 1.2, 4.0):
        code, out, err = cli("recommend", "--study", "cut", "--db", url, "--budget", str(reach * factor), "--json")
        assert code == 0, err
        rec = json.loads(out)
        assert (rec["predicted_from"], rec["rollouts"]) == ("bp16,n8", 8)
        steps.append(rec["steps"])
    assert steps == sorted(steps) and steps[1] == last  # where the run reached the budget: its own step there
    half = chosen[chosen["step"] >= last / 2]
    per_step = (reach - float(half["gpu_hours"].iloc[0])) / (last - int(half["step"].iloc[0]))
    assert steps[3] == last + int(3 * reach // per_step)  # past it: on at the run's own compute per step


def test_the_dashboard_reads_the_same_decision(tmp_path):
    from rlscale.fitting.stored import study_decision

    from rlscale.dashboard.study import study_decision as page_decision

    url = f"sqlite:///{tmp_path / 'demo.db'}"
    name = store_demo_sweep(url, SWEEPS[0])
    with Store(url) as store:
        decision = study_decision(store, name)
        page = page_decision(store, name, load_study(ROOT / "studies" / "quickstart.yaml"))
    assert page["verdict"] == ("decided" if decision.decided else "not yet")
    rec = decision.recommendation
    assert rec is not None
    assert any(f"B_p {rec.prompts_per_batch}, n {rec.rollouts}," in line for line in page["lines"])
    assert yaml.safe_load(page["recipe"])["rollouts"] == rec.rollouts


def test_rewards_off_the_pass_rate_scale_and_flat_runs_get_a_verdict_not_a_crash(cli, tmp_path):
    import numpy as np
    from rlscale.fitting.sigmoid.points import BIN_WIDTH, is_pass_rate, record_bin_width

    # a summed reward near -0.003 (a TRL user's reward functions), and two runs whose reward never moves
    rng = np.random.default_rng(0)
    rows = [
        {
            "run": run,
            "step": s,
            "compute": s * 1e-3,
            "reward": -0.003 + rise * (1 - np.exp(-s / 8)) + rng.normal(0, 5e-5),
        }
        for run, rise in (("small", 4e-4), ("smaller", 2e-4))
        for s in range(40)
    ]
    rows += [{"run": f"flat{i}", "step": s, "compute": s * 1e-3, "reward": 0.5} for i in (1, 2) for s in range(20)]
    pd.DataFrame(rows).to_csv(tmp_path / "runs.csv", index=False)
    rewards = [row["reward"] for row in rows[:80]]
    assert not is_pass_rate(rewards) and record_bin_width(rewards) < BIN_WIDTH / 10  # bins follow the spread
    url = f"sqlite:///{tmp_path / 's.db'}"
    assert cli("import", str(tmp_path / "runs.csv"), "--study", "odd", "--db", url)[0] == 0
    code, out, err = cli("report", "odd", "--db", url, "--out", str(tmp_path / "r"), "--json", "--bootstrap", "0")
    assert code == 0, err
    report = json.loads(out)
    fits = {row["run"]: row for row in report["fits"]}
    assert np.isfinite(fits["small"]["A"]) and fits["small"]["A"] < 0  # fitted unbounded, on its own scale
    assert not fits["flat1"]["identified"]  # a flat run: not identified, with the reason
    assert "unbounded" in report["fitted_on"]
    decision = report["decision"]
    assert decision["planned"] is False and decision["commands"]["extend"] is None  # nothing to extend by a sweep
    for command in decision["commands"].values():
        if command:
            assert cli(*printed(command))[0] == 0


def test_the_recipe_decided_is_the_chosen_runs_own_with_the_recommended_geometry():
    import numpy as np
    from rlscale.fitting.sigmoid import sigmoid

    import rlscale

    # n 8 wins at lr 2e-4, a key the study varies besides the geometry: the recipe must train lr 2e-4, not the default
    compute = np.geomspace(0.01, 4.0, 30)
    rows = [
        {"run": f"n{n},lr{lr}", "prompts_per_batch": 16, "rollouts": n, "lr": lr, "compute": c, "reward": r}
        for n, lr, A in ((4, 1e-4, 0.6), (8, 2e-4, 0.8), (16, 1e-4, 0.65))
        for c, r in zip(compute, sigmoid(compute, A, 1.5, 0.3, 0.1))
    ]
    decision = rlscale.decide(pd.DataFrame(rows), budget=4.0)
    assert decision.recommendation is not None, decision.refusal
    assert decision.recommendation.predicted_from == "n8,lr0.0002"
    assert decision.recipe["lr"] == 2e-4 and decision.recipe["rollouts"] == decision.recommendation.rollouts


def test_a_study_imported_from_logs_names_its_best_run_and_exports_no_made_up_recipe(cli, tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    assert cli("import", str(ROOT / "examples" / "scalerl_runs.csv"), "--study", "logs", "--db", url)[0] == 0
    code, out, err = cli("export", "--format", "yaml", "--study", "logs", "--db", url)
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert "run cispo has no recipe to export: it was imported from a log, which names no recipe" in err


def test_a_budget_past_the_evidence_is_refused_with_the_sweep_that_extends_the_study_and_that_sweep_runs(cli, tmp_path):
    from rlscale.fitting.stored import study_decision

    from rlscale.views.wording import decision_commands

    records = pd.read_csv(SWEEPS[0])
    early = pd.concat(run[run["step"] <= 0.3 * run["step"].max()] for _, run in records.groupby("run"))
    early.to_csv(tmp_path / "early.csv", index=False)  # every run at 30% of its steps: no law, A not pinned
    url = f"sqlite:///{tmp_path / 'early.db'}"
    name = store_demo_sweep(url, tmp_path / "early.csv")

    code, out, err = cli("recommend", "--study", name, "--budget", "0.14", "--db", url, "--json")
    refused = json.loads(out)
    assert code == 2 and refused["refused"] and len(err.strip().splitlines()) == 1
    assert err.strip().endswith(refused["extend"])
    words = printed(refused["extend"])
    assert words[0] == "sweep" and load_study(words[1]).name == name and "--extend" in words
    code, out, err = cli(*words, "--dry-run")  # the printed sweep plans on this store
    assert code == 0, err

    code, _, err = cli("export", "--format", "verl", "--study", name, "--budget", "0.14", "--db", url)
    assert code == 2 and err.strip().endswith(refused["extend"])
    with Store(url) as store:  # the API's decision names the same sweep
        assert decision_commands(study_decision(store, name, budget=0.14), db=url)["extend"] == refused["extend"]


def test_a_study_of_two_rollouts_values_never_proposes_an_extension_for_the_optimal_n_law(tmp_path):
    from rlscale.fitting.stored import study_decision

    spec = yaml.safe_load((ROOT / "studies" / "quickstart.yaml").read_text())
    spec["parameters"]["rollouts"]["values"] = [2, 4]  # the law needs n* at 3 or more values
    (tmp_path / "two.yaml").write_text(yaml.safe_dump(spec))
    records = pd.read_csv(SWEEPS[0])
    early = pd.concat(run[run["step"] <= 0.3 * run["step"].max()] for _, run in records.groupby("run"))
    early.to_csv(tmp_path / "early.csv", index=False)
    url = f"sqlite:///{tmp_path / 'two.db'}"
    name = store_demo_sweep(url, tmp_path / "early.csv", tmp_path / "two.yaml")
    with Store(url) as store:
        plan = study_decision(store, name).next_allocation
    assert plan is not None and plan.goal.code == "identify_fits", plan


def test_runs_stand_at_the_budget_decided_when_an_unidentified_run_ends_a_step_short(cli, tmp_path):
    import numpy as np
    from rlscale.fitting.sigmoid import sigmoid

    spec = yaml.safe_load((ROOT / "studies" / "quickstart.yaml").read_text())
    spec["parameters"]["rollouts"]["values"] = [4, 8]
    (tmp_path / "two.yaml").write_text(yaml.safe_dump(spec))
    compute = {"bp16,n4": np.linspace(0, 0.0400, 61), "bp16,n8": np.linspace(0, 0.0399, 61)}
    reward = {
        "bp16,n4": sigmoid(compute["bp16,n4"], 0.88, 1.5, 0.005, 0.3),  # bent: identified
        "bp16,n8": 0.3 + 10 * compute["bp16,n8"],  # still rising straight: A not identified, and a step short
    }
    rows = [
        {"run": run, "step": step, "gpu_hours": c, "val_reward": r}
        for run in compute
        for step, (c, r) in enumerate(zip(compute[run], reward[run]))
    ]
    pd.DataFrame(rows).to_csv(tmp_path / "short.csv", index=False)
    url = f"sqlite:///{tmp_path / 'two.db'}"
    name = store_demo_sweep(url, tmp_path / "short.csv", tmp_path / "two.yaml")
    out_dir = tmp_path / "my reports"
    code, out, err = cli("report", name, "--db", url, "--out", str(out_dir), "--json", "--bootstrap", "0")
    assert code == 0, err
    report = json.loads(out)
    decision = report["decision"]
    assert decision["budget"] == pytest.approx(0.0399)  # what every finished run reached
    # the runs stand where the decision is made, both read inside their own data, in every table of the report
    assert decision["standing"]["compute"] == decision["budget"]
    assert report["comparison"]["compute"] == decision["budget"]
    assert {row["variant"] for row in report["comparison"]["rows"]} == {"bp16,n4", "bp16,n8"}
    code, text, err = cli("report", name, "--db", url, "--out", str(out_dir))
    assert code == 0, err
    # the printed extension writes its report where this one went
    words = printed(decision["commands"]["extend"])
    assert words[words.index("--out") + 1] == str(out_dir)
    code, _, err = cli(*words, "--dry-run")
    assert code == 0, err


def test_a_sweeps_records_imported_decide_as_the_same_frame_does(cli, tmp_path):
    import rlscale

    url = f"sqlite:///{tmp_path / 'imported.db'}"
    code, _, err = cli("import", str(SWEEPS[0]), "--reward", "val_reward", "--study", "sweep", "--db", url)
    assert code == 0, err
    imported = rlscale.decide("sweep", db=url)
    framed = rlscale.decide(pd.read_csv(SWEEPS[0]).rename(columns={"val_reward": "reward"}))
    assert imported.kind == framed.kind == "allocation"  # B_p and n per run, read from the file's columns
    assert imported.budget == framed.budget
    assert imported.recommendation is not None and framed.recommendation is not None
    shown = [json.dumps(d.recommendation.to_dict(), sort_keys=True) for d in (imported, framed)]  # NaN == NaN
    assert shown[0] == shown[1]
    # the log names B_p and n, not how the runs trained: the allocation stands, with no recipe made of defaults
    assert imported.recipe is None and [r.code for r in imported.refusal] == ["no_recipe"]
    code, out, err = cli("export", "--format", "verl", "--study", "sweep", "--db", url)
    assert (code, out) == (2, "") and "has no recipe to export: it was imported from a log" in err
    code, out, err = cli("report", "sweep", "--db", url, "--out", str(tmp_path / "rep"), "--json")
    assert code == 0, err
    commands = json.loads(out)["decision"]["commands"]
    assert commands["export"] is None and commands["evidence"] is not None
    assert cli(*printed(commands["evidence"]))[0] == 0


def test_an_n_that_changes_within_a_run_is_refused_naming_the_line(cli, tmp_path):
    path = tmp_path / "mixed.csv"
    path.write_text("run,prompts_per_batch,rollouts,step,gpu_hours,reward\na,16,2,0,0,0.1\na,16,4,1,1,0.2\n")
    code, _, err = cli("import", str(path), "--study", "mixed", "--db", f"sqlite:///{tmp_path / 'x.db'}")
    assert code == 2 and err.strip() == (
        f"error: {path}:3: column 'rollouts': run 'a' has rollouts 2 and 4: beside prompts_per_batch, rollouts is n "
        "per prompt, one value per run"
    )
    assert not (tmp_path / "x.db").exists() or "mixed" not in Store(f"sqlite:///{tmp_path / 'x.db'}").studies()


@pytest.mark.parametrize("factor", [0.1, 3.0, 100.0])
def test_a_rewards_unit_changes_no_decision(factor):
    import math

    import rlscale

    # the demo's pass rates as a percentage, a sum of three rewards, a tenth: fitted unbounded past [0, 1], with the
    # noise band and A's interval width in the rewards' own units
    frame = pd.read_csv(SWEEPS[0]).rename(columns={"val_reward": "reward"})
    base = rlscale.decide(frame)
    scaled = rlscale.decide(frame.assign(reward=frame["reward"] * factor))
    assert base.decided and scaled.decided
    ours, theirs = base.recommendation, scaled.recommendation
    assert (theirs.predicted_from, theirs.prompts_per_batch, theirs.rollouts, theirs.steps) == (
        ours.predicted_from,
        ours.prompts_per_batch,
        ours.rollouts,
        ours.steps,
    )
    assert math.isclose(theirs.predicted_reward, factor * ours.predicted_reward, rel_tol=1e-3)
    assert [
        math.isclose(a, factor * b, rel_tol=1e-2) for a, b in zip(theirs.predicted_interval, ours.predicted_interval)
    ] == [True, True]
    # the band is ScaleRL's 0.02 of the rewards' range with 0 ([0, 1] for pass rates, which a tenth still reads as)
    span = (frame["reward"] * factor).max() if factor > 1 else 1.0
    assert math.isclose(scaled.standing.noise_band, 0.02 * span)
