"""`rlscale fit`: the docs/methods.md section 7 contract on files, and fits of stored studies saved back."""

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import run_cli
from rlscale.db.store import Store
from rlscale.fitting.sigmoid import sigmoid

EXAMPLE = Path(__file__).parents[1] / "examples" / "scalerl_runs.csv"
JSON_KEYS = {"run", "A", "B", "C_mid", "R0", "rss", "r2", "A_lo", "A_hi", "n_points", "identified", "reason", "noise"}


def _strict_json(text: str):
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def _write_curve(
    path: Path, *, A=0.7, B=1.5, C_mid=100.0, R0=0.1, max_compute=800.0, noise=0.005, column="compute", run="r"
):
    compute = np.linspace(0.0, max_compute, 41)
    reward = sigmoid(compute, A, B, C_mid, R0) + np.random.default_rng(0).normal(0, noise, compute.size)
    lines = [f"run,{column},reward"] + [f"{run},{c:g},{r:.5f}" for c, r in zip(compute, reward)]
    path.write_text("\n".join(lines) + "\n")


def test_json_has_the_contract_keys_and_recovers_a_known_curve(monkeypatch, capsys, workdir):
    _write_curve(workdir / "curve.csv")
    code, out, _ = run_cli(monkeypatch, capsys, "fit", "curve.csv", "--json")
    assert code == 0
    (fit,) = _strict_json(out)
    assert set(fit) == JSON_KEYS
    assert fit["run"] == "r" and fit["identified"] is True and fit["n_points"] == 41
    assert fit["A"] == pytest.approx(0.7, abs=0.02)
    assert fit["C_mid"] == pytest.approx(100.0, rel=0.15)
    assert fit["A_lo"] <= fit["A"] <= fit["A_hi"]


def test_r0_fixes_the_start_and_min_compute_drops_early_points(monkeypatch, capsys, workdir):
    _write_curve(workdir / "curve.csv", column="gpu_hours")  # gpu_hours is accepted for compute
    code, out, _ = run_cli(monkeypatch, capsys, "fit", "curve.csv", "--json", "--r0", "0.1", "--min-compute", "100")
    assert code == 0
    (fit,) = _strict_json(out)
    assert fit["R0"] == 0.1
    assert fit["n_points"] == 36  # 41 points, 5 of them below 100
    # a run that ends before it: not fitted, and it counts the 0 points its reason names, not its 7 in the file
    code, out, _ = run_cli(monkeypatch, capsys, "fit", str(EXAMPLE), "--json", "--min-compute", "1500")
    short = {fit["run"]: fit for fit in _strict_json(out)}["grpo_short"]
    assert code == 0 and short["n_points"] == 0 and short["reason"].endswith("got 0")


def test_example_file_fits_every_run_and_flags_the_short_one(monkeypatch, capsys):
    code, out, _ = run_cli(monkeypatch, capsys, "fit", str(EXAMPLE), "--json")
    assert code == 0
    fits = {fit["run"]: fit for fit in _strict_json(out)}
    assert set(fits) == {"cispo", "gspo", "dapo", "grpo_short"}
    # examples/make_example.py draws these runs with A = 0.61, 0.58, 0.52
    asymptotes = [round(fits[run]["A"], 2) for run in ("cispo", "gspo", "dapo")]
    assert asymptotes == pytest.approx([0.61, 0.58, 0.52], abs=0.02)
    assert fits["grpo_short"]["identified"] is False and fits["grpo_short"]["reason"]


def test_the_table_says_in_words_when_a_fit_is_not_identified(monkeypatch, capsys, workdir):
    from rlscale.cli.console import console

    monkeypatch.setattr(console, "width", 250)  # one table row per line
    _write_curve(workdir / "early.csv", max_compute=40.0, C_mid=400.0)  # stops long before the inflection
    _write_curve(workdir / "full.csv", run="full")
    code, early, _ = run_cli(monkeypatch, capsys, "fit", "early.csv")
    assert code == 0
    row = next(line for line in early.splitlines() if line.startswith("│ r "))
    assert "no (1)" in row
    note = next(line for line in early.splitlines() if line.startswith("(1) r: not identified: "))
    reason = note.split("not identified: ", 1)[1].strip()
    assert len(reason) > 10  # the reason in words, e.g. the interval on A is too wide
    code, full, _ = run_cli(monkeypatch, capsys, "fit", "full.csv")
    row = next(line for line in full.splitlines() if line.startswith("│ full "))
    assert "not identified" not in row and "yes" in row


def test_fit_of_a_stored_study_saves_the_fits(monkeypatch, capsys, workdir, db_url):
    code, _, _ = run_cli(monkeypatch, capsys, "import", str(EXAMPLE), "--study", "ablation", "--db", db_url)
    assert code == 0
    with Store(db_url) as store:  # a step without an eval has no val_reward: fit must skip it
        run_id = store.runs_frame("ablation").query("run == 'cispo'")["run_id"].item()
        store.add_records(run_id, [{"step": 5, "gpu_hours": 100.0, "val_reward": None}])
    code, out, _ = run_cli(monkeypatch, capsys, "fit", "--study", "ablation", "--db", db_url, "--json")
    assert code == 0
    printed = {fit["run"]: fit for fit in _strict_json(out)}
    with Store(db_url) as store:
        stored = store.fits_frame("ablation").set_index("run")
    assert set(stored.index) == set(printed) == {"cispo", "gspo", "dapo", "grpo_short"}
    assert stored.loc["cispo", "A"] == pytest.approx(printed["cispo"]["A"])
    assert stored.loc["cispo", "n_points"] == printed["cispo"]["n_points"] == 81
    assert not stored.loc["grpo_short", "identified"]
    # the file fitted as it is reads the same fit of record: estimates, intervals and verdicts
    code, out, _ = run_cli(monkeypatch, capsys, "fit", str(EXAMPLE), "--json")
    assert code == 0
    from_file = {fit["run"]: fit for fit in _strict_json(out)}
    for run, fit in printed.items():
        for key in ("A", "A_lo", "A_hi", "B", "C_mid", "identified"):
            expected = fit[key] if fit[key] is None or isinstance(fit[key], bool) else pytest.approx(fit[key], rel=1e-9)
            assert from_file[run][key] == expected, (run, key)


def test_runs_sharing_a_name_across_seeds_are_fitted_apart(monkeypatch, capsys, db_url):
    with Store(db_url) as store:
        for seed, A in ((0, 0.6), (1, 0.65)):
            run = store.ensure_run("seeds", "cispo", {"loss": "cispo"}, seed=seed)
            compute = np.linspace(10, 800, 30)
            store.add_records(
                run,
                [
                    {"step": i, "gpu_hours": c, "val_reward": float(sigmoid(c, A, 1.5, 100.0, 0.1))}
                    for i, c in enumerate(compute)
                ],
            )
    code, out, _ = run_cli(monkeypatch, capsys, "fit", "--study", "seeds", "--db", db_url, "--json")
    assert code == 0
    fits = {fit["run"]: fit["A"] for fit in _strict_json(out)}
    assert fits == pytest.approx({"cispo (seed 0)": 0.6, "cispo (seed 1)": 0.65}, abs=0.01)
    with Store(db_url) as store:
        assert len(store.fits_frame("seeds")) == 2


def test_plot_writes_a_png(monkeypatch, capsys, workdir):
    code, out, _ = run_cli(monkeypatch, capsys, "fit", str(EXAMPLE), "--plot", "fits.png")
    assert code == 0
    assert (workdir / "fits.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "args,message",
    [
        (["fit"], "error: fit: give either a run-log FILE or --study NAME (not both)"),
        (["fit", "x.csv", "--study", "s"], "error: fit: give either a run-log FILE or --study NAME (not both)"),
        (["fit", "--study", "nope"], "error: no study named 'nope' in sqlite:///"),
    ],
)
def test_wrong_arguments_are_one_line_errors(monkeypatch, capsys, workdir, args, message):
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert code == 2 and err.startswith(message) and err.count("\n") == 1


def test_a_malformed_csv_names_line_and_column(monkeypatch, capsys, workdir):
    (workdir / "bad.csv").write_text("run,compute,reward\na,1,0.1\na,2,0.2\na,three,0.3\n")
    code, out, err = run_cli(monkeypatch, capsys, "fit", "bad.csv", "--json")
    assert code == 2 and err == "error: bad.csv:4: column 'compute': expected a number, got 'three'\n"
    assert json.loads(out)["error"] == err[len("error: ") : -1]  # --json: a script reads why on stdout


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1.5"])
def test_r0_that_is_not_a_finite_pass_rate_is_a_one_line_error(monkeypatch, capsys, workdir, value):
    _write_curve(workdir / "curve.csv")
    code, out, err = run_cli(monkeypatch, capsys, "fit", "curve.csv", "--r0", value)
    assert (code, out) == (2, "")
    assert err.startswith("error: --r0: expected a finite reward") and err.count("\n") == 1


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["--noise", "poisson"],
            "error: --noise: expected one of auto, binomial, constant, multiplicative, got 'poisson'",
        ),
        (["--noise", "binomial", "--unbounded"], "error: --noise: binomial noise is for pass rates in [0, 1]"),
    ],
)
def test_bad_noise_options_are_one_line_errors(monkeypatch, capsys, workdir, args, message):
    _write_curve(workdir / "curve.csv")
    code, _, err = run_cli(monkeypatch, capsys, "fit", "curve.csv", *args)
    assert code == 2 and err.startswith(message) and err.count("\n") == 1


def test_noise_models_through_the_cli(monkeypatch, capsys, workdir):
    _write_curve(workdir / "curve.csv")
    for noise in ("auto", "binomial", "constant", "multiplicative"):
        code, out, _ = run_cli(monkeypatch, capsys, "fit", "curve.csv", "--noise", noise, "--json")
        (fit,) = _strict_json(out)
        assert code == 0 and fit["A"] == pytest.approx(0.7, abs=0.02)
        assert fit["noise"] in ("binomial", "constant", "multiplicative") and (noise == "auto" or fit["noise"] == noise)


def test_a_metric_above_one_needs_unbounded_and_the_reason_names_the_flag(monkeypatch, capsys, workdir):
    _write_curve(workdir / "score.csv", A=7.0, R0=1.0, noise=0.02)
    code, out, err = run_cli(monkeypatch, capsys, "fit", "score.csv", "--json")
    # the only run cannot be fitted as a pass rate: exit 2, the reason in the command line's words
    assert code == 2 and err.startswith("error: score.csv: no run could be fitted (r: not fitted: ")
    assert json.loads(out)["file"] == "score.csv"
    assert "use --unbounded" in err and "in the API" not in err and err.count("\n") == 1
    code, out, _ = run_cli(monkeypatch, capsys, "fit", "score.csv", "--unbounded", "--json")
    (fit,) = _strict_json(out)
    assert code == 0 and fit["identified"] is True and fit["A"] == pytest.approx(7.0, rel=0.02)


def test_compute_near_1e303_fits_like_the_same_curve_and_prints_no_warning(monkeypatch, capsys, workdir):
    _write_curve(workdir / "curve.csv")
    lines = (workdir / "curve.csv").read_text().splitlines()
    huge = [lines[0]] + [f"r,{float(c) * 1e303!r},{r}" for _, c, r in (line.split(",") for line in lines[1:])]
    (workdir / "huge.csv").write_text("\n".join(huge) + "\n")
    code, out, _ = run_cli(monkeypatch, capsys, "fit", "curve.csv", "--json")
    (plain,) = _strict_json(out)
    code, out, err = run_cli(monkeypatch, capsys, "fit", "huge.csv", "--json", "--plot", "huge.png")
    (fit,) = _strict_json(out)
    assert code == 0 and err == "" and fit["identified"] is True
    assert [fit["A"], fit["B"], fit["C_mid"] / 1e303, fit["r2"]] == pytest.approx(
        [plain["A"], plain["B"], plain["C_mid"], plain["r2"]], rel=1e-6
    )


def test_a_file_without_a_fittable_run_exits_2_naming_the_run_and_why(monkeypatch, capsys, workdir):
    (workdir / "two.csv").write_text("run,compute,reward\nshort,1,0.1\nshort,2,0.2\n")
    code, out, err = run_cli(monkeypatch, capsys, "fit", "two.csv", "--plot", "two.png")
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert err.startswith("error: two.csv: no run could be fitted (short: not fitted: need at least 3 points")
    assert not (workdir / "two.png").exists()  # nothing half-written


def test_a_run_that_cannot_be_fitted_beside_others_is_listed_as_not_fitted(monkeypatch, capsys, workdir):
    _write_curve(workdir / "runs.csv", run="full")
    with (workdir / "runs.csv").open("a") as f:
        f.write("short,1,0.1\nshort,2,0.2\n")
    code, out, _ = run_cli(monkeypatch, capsys, "fit", "runs.csv")
    assert code == 0
    assert "none (1)" in out and "(1) short: not fitted: need at least 3 points" in " ".join(out.split())


TARGET_KEYS = {"target", "reach_code", "reach_compute", "reach_compute_lo", "reach_compute_hi", "reach_level"}


def test_target_gives_the_compute_at_which_each_run_reaches_it(monkeypatch, capsys, workdir):
    # R = 0.45 is half way from R0 0.1 to A 0.8: the fitted curve reaches it at C_mid (100)
    _write_curve(workdir / "curve.csv", A=0.8, noise=0.003)
    code, out, err = run_cli(monkeypatch, capsys, "fit", "curve.csv", "--json", "--target", "0.45")
    assert code == 0, err
    (fit,) = _strict_json(out)
    assert set(fit) == JSON_KEYS | TARGET_KEYS
    assert (fit["target"], fit["reach_code"], fit["reach_level"]) == (0.45, "reached", 0.9)
    assert fit["reach_compute"] == pytest.approx(100.0, rel=0.05)
    assert fit["reach_compute_lo"] < fit["reach_compute"] < fit["reach_compute_hi"]
    assert fit["reach_compute_lo"] <= 100.0 <= fit["reach_compute_hi"]
    # at or above A it is not reached; at or below R0 it is reached at the start
    code, out, _ = run_cli(monkeypatch, capsys, "fit", "curve.csv", "--json", "--target", "0.9")
    (fit,) = _strict_json(out)
    assert fit["reach_code"] == "not_reached" and fit["reach_compute"] is None
    code, out, _ = run_cli(monkeypatch, capsys, "fit", "curve.csv", "--json", "--target", "0.05")
    assert _strict_json(out)[0]["reach_code"] == "at_start"
    code, out, _ = run_cli(monkeypatch, capsys, "fit", "curve.csv", "--target", "0.45")
    assert code == 0 and "r: reaches 0.450 at" in out
    # an A that is not identified is not a prediction: below the target it says so, not that the run stops short
    code, out, _ = run_cli(monkeypatch, capsys, "fit", str(EXAMPLE), "--json", "--target", "0.6")
    short = {fit["run"]: fit for fit in _strict_json(out)}["grpo_short"]
    assert (short["identified"], short["reach_code"]) == (False, "a_not_identified")


def test_target_inverts_the_sigmoid_and_its_draws():
    from rlscale.fitting.laws.target import compute_to_reach, reach

    assert compute_to_reach(0.45, 0.8, 1.5, 100.0, 0.1) == pytest.approx(100.0)
    # R(C) = 0.6 at C = C_mid (5/2)^(1/B): (0.6 - 0.1) / (0.8 - 0.6) = 2.5
    assert compute_to_reach(0.6, 0.8, 2.0, 10.0, 0.1) == pytest.approx(10.0 * 2.5**0.5)
    assert float(sigmoid(compute_to_reach(0.6, 0.8, 2.0, 10.0, 0.1), 0.8, 2.0, 10.0, 0.1)) == pytest.approx(0.6)
    draws = np.array([[0.8, 1.5, c_mid, 0.1] for c_mid in np.linspace(80.0, 120.0, 41)])
    reached = reach(0.45, (0.8, 1.5, 100.0, 0.1), draws, level=0.9)
    assert reached.code == "reached" and reached["compute"] == pytest.approx(100.0)
    # sample quantiles of the 41 draws' C_mid (80, 81, ..., 120): the 3rd and the 39th
    assert reached["compute_lo"] == pytest.approx(82.0) and reached["compute_hi"] == pytest.approx(118.0)
    # a third of the draws level off below the target: no upper end
    some_below = draws.copy()
    some_below[::3, 0] = 0.44
    unbounded = reach(0.45, (0.8, 1.5, 100.0, 0.1), some_below, level=0.9)
    assert unbounded.code == "reached_unbounded" and unbounded["share_unreached"] == pytest.approx(14 / 41)
