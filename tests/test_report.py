"""`rlscale report` for studies/scalerl_loo.yaml, seeded with synthetic records of known asymptotes."""

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers import run_cli, seed_loo
from rlscale.fitting.sigmoid import sigmoid

from rlscale.views.plots import linearised, plot_linearised
from rlscale.views.report import loo_table

ROOT = Path(__file__).parents[1]


def _cli(args, capsys, monkeypatch):
    return run_cli(monkeypatch, capsys, *args)


@pytest.fixture
def loo_report(workdir, capsys, monkeypatch):
    url = f"sqlite:///{workdir / 'rl.db'}"
    name = seed_loo(url)
    code, out, err = _cli(
        ["report", name, "--db", url, "--out", "rep", "--bootstrap", "40", "--json"], capsys, monkeypatch
    )
    assert code == 0, err
    return workdir / "rep", json.loads(out), (url, name)


def test_linearised_is_a_power_law_of_compute():
    c = np.geomspace(0.1, 100, 20)
    f = linearised(sigmoid(c, 0.8, 1.5, 5.0, 0.1), 0.8, 0.1)
    slope = np.polyfit(np.log(c), np.log(f), 1)[0]
    assert slope == pytest.approx(-1.5, abs=1e-6)
    assert np.isnan(linearised([0.05, 0.9], 0.8, 0.1)).all()  # outside (R0, A) there is no F


def test_linearised_plot_draws_fits_whose_line_overflows_or_has_no_point_to_linearise(tmp_path):
    """Short runs fit with a near-step rise (B ~ 126: F overflows before C_mid, underflows after it) or with A = R0
    (no point strictly between them), as a sweep's two-eval runs do: the plot is written, not a crash."""
    import pandas as pd

    records = pd.DataFrame(
        {
            "run": ["step"] * 3 + ["flat"] * 3 + ["fell"] * 3,
            "gpu_hours": [0.0, 2.9e-4, 6.3e-4] * 3,
            "val_reward": [0.84375, 0.8125, 0.8125, 0.84375, 0.84375, 0.84375, 0.9, 0.5, 0.5],
        }
    )
    curves = pd.DataFrame(
        {
            "run": ["step", "flat", "fell"],
            "A": [0.8125, 0.84375, 0.5],
            "R0": [0.84375, 0.84375, 0.9],
            "B": [126.03, 0.3714, 1e4],
            "C_mid": [1.92e-4, 1.96e-4, 1e-3],
            "identified": [False] * 3,
        }
    )
    path = plot_linearised(
        records, curves, tmp_path / "linearised.png", compute_col="gpu_hours", reward_col="val_reward"
    )
    assert path.stat().st_size > 1000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # nothing on the axes at all, as two 4-step bayes trials left it: no point strictly between R0 and A, and each
    # line past the axes' dozen decades
    nothing = pd.DataFrame(
        {
            "run": ["t0"] * 3 + ["t1"] * 3,
            "gpu_hours": [0.0, 1.64e-4, 4.07e-4, 0.0, 1.43e-4, 3.53e-4],
            "val_reward": [0.71875, 0.90625, 0.90625] * 2,
        }
    )
    fits = pd.DataFrame(
        {
            "run": ["t0", "t1"],
            "A": [0.90625] * 2,
            "R0": [0.71875] * 2,
            "B": [109.7, 110.6],
            "C_mid": [1.04e-4, 9.1e-5],
            "identified": [False] * 2,
        }
    )
    path = plot_linearised(nothing, fits, tmp_path / "nothing.png", compute_col="gpu_hours", reward_col="val_reward")
    assert path.stat().st_size > 1000
    # the same fits beside a run with points to linearise
    records = pd.concat(
        [
            records,
            pd.DataFrame(
                {
                    "run": ["ok"] * 20,
                    "gpu_hours": np.geomspace(1, 100, 20),
                    "val_reward": sigmoid(np.geomspace(1, 100, 20), 0.8, 1.5, 10, 0.1),
                }
            ),
        ]
    )
    curves = pd.concat(
        [
            curves,
            pd.DataFrame({"run": ["ok"], "A": [0.8], "R0": [0.1], "B": [1.5], "C_mid": [10.0], "identified": [True]}),
        ]
    )
    path = plot_linearised(
        records, curves, tmp_path / "linearised_ok.png", compute_col="gpu_hours", reward_col="val_reward"
    )
    assert path.stat().st_size > 1000


def test_loo_table_flags_only_differences_beyond_the_noise_band():
    import pandas as pd

    curves = pd.DataFrame(
        [
            {"run": "baseline", "A": 0.60, "A_lo": 0.59, "A_hi": 0.61, "B": 1.5, "C_mid": 1.0, "identified": True},
            {"run": "worse", "A": 0.55, "A_lo": 0.54, "A_hi": 0.56, "B": 1.4, "C_mid": 1.0, "identified": True},
            {"run": "same", "A": 0.59, "A_lo": 0.58, "A_hi": 0.60, "B": 1.6, "C_mid": 1.0, "identified": True},
            {"run": "early", "A": 0.40, "A_lo": 0.1, "A_hi": 0.9, "B": 1.6, "C_mid": 1.0, "identified": False},
        ]
    )
    rows = {r["variant"]: r for r in loo_table(curves)}
    assert rows["worse"]["beyond_noise"] and rows["worse"]["dA"] == pytest.approx(-0.05)
    assert rows["worse"]["verdict_code"] == "worse" and rows["baseline"]["verdict_code"] == "full_recipe"
    assert not rows["same"]["beyond_noise"] and rows["same"]["verdict_code"] == "within_noise"
    assert not rows["early"]["beyond_noise"] and rows["early"]["verdict_code"] == "unidentified"


def test_loo_report_renders_tables_pngs_and_one_self_contained_html(loo_report):
    out, payload, _ = loo_report
    for name in ("curves", "linearised", "loo_curves"):
        png = out / f"{name}.png"
        assert png.is_file() and png.stat().st_size > 10_000, name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    loo = {row["variant"]: row for row in payload["loo"]}
    assert set(loo) == {
        "baseline",
        "dapo_loss",
        "sample_average",
        "group_advantage_norm",
        "no_fp32_head",
        "no_zero_variance_filter",
        "no_positive_resampling_off",
        "ppo_off_policy",
    }
    assert loo["dapo_loss"]["beyond_noise"] and loo["dapo_loss"]["dA"] == pytest.approx(-0.10, abs=0.02)
    assert not any(row["beyond_noise"] for name, row in loo.items() if name != "dapo_loss")
    for row in loo.values():
        assert row["A_lo"] <= row["A"] <= row["A_hi"]
    assert len(payload["fits"]) == 24  # 8 variants x 3 seeds, one fit each
    assert all(row["status"] == "identified" for row in payload["fits"])
    markdown = (out / "report.md").read_text()
    assert "## Leave-one-out (ScaleRL)" in markdown and "![linearised](linearised.png)" in markdown
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3
    assert 'src="http' not in page and "<link" not in page  # nothing to fetch: one file is the whole report


def test_loo_pools_the_seeds_of_runs_named_as_a_sweep_names_them(workdir, capsys, monkeypatch):
    # a sweep of a 3-seed study stores "dapo_loss/s0", "dapo_loss/s1", ...: the table is still one row per variant
    url = f"sqlite:///{workdir / 'sweep.db'}"
    name = seed_loo(url, sweep_names=True)
    code, out, err = _cli(
        ["report", name, "--db", url, "--out", "rep", "--bootstrap", "40", "--json"], capsys, monkeypatch
    )
    assert code == 0, err
    loo = {row["variant"]: row for row in json.loads(out)["loo"]}
    assert "baseline" in loo and "dapo_loss" in loo and not any("/s" in variant for variant in loo)
    assert loo["dapo_loss"]["beyond_noise"] and loo["dapo_loss"]["dA"] == pytest.approx(-0.10, abs=0.02)


def test_report_prints_rich_tables(loo_report, capsys, monkeypatch):
    _, _, (url, name) = loo_report
    code, out, err = _cli(["report", name, "--db", url, "--out", "rep2", "--bootstrap", "0"], capsys, monkeypatch)
    assert code == 0, err
    assert "leave-one-out" in out and "dapo_loss" in out and "report.html" in out


def test_the_fits_table_fits_100_columns_with_every_interval_on_one_line(loo_report, capsys, monkeypatch):
    from rlscale.cli.console import console
    from rlscale.views.report import fit_cells

    _, payload, (url, name) = loo_report
    monkeypatch.setattr(console, "_width", 100)  # a 100-column terminal
    code, out, err = _cli(["report", name, "--db", url, "--out", "rep3", "--bootstrap", "40"], capsys, monkeypatch)
    assert code == 0, err
    fits = out[out.index("sigmoid fits") :]
    fits = fits[: fits.index("└")]  # title to the last row
    assert max(len(line) for line in fits.splitlines()) <= 100
    for row in payload["fits"]:
        assert fit_cells(row)[1] in fits, row["run"]  # "A [lo, hi]" whole, not wrapped


def test_report_of_an_unknown_study_is_a_one_line_error(workdir, capsys, monkeypatch):
    code, _, err = _cli(["report", "nope", "--db", f"sqlite:///{workdir / 'rl.db'}"], capsys, monkeypatch)
    assert code == 2 and "no study named 'nope'" in err


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.slow
def test_report_html_renders_in_headless_chromium(loo_report, tmp_path):
    browser = _chromium()
    if browser is None:
        if __import__("os").environ.get("CI"):
            pytest.fail("chromium is not installed: .ci/run installs Debian's chromium")
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    out, _, _ = loo_report
    shot = tmp_path / "shot.png"
    subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}",
            "--window-size=1200,900",
            (out / "report.html").resolve().as_uri(),
        ],
        check=True,
        timeout=120,
        capture_output=True,
    )
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)[..., :3]
    assert pixels.shape[:2] == (900, 1200)
    # a blank (or error) page is one colour; the report has text, tables and coloured rows
    assert pixels.std() > 0.05
    assert len(np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0)) > 50
    shutil.copy(shot, out / "screenshot.png")  # kept beside the report for a person to look at


def test_an_imported_studys_report_names_it_imported_as_the_dashboard_does(workdir, capsys, monkeypatch):
    url = f"sqlite:///{workdir / 'logs.db'}"
    code, _, err = _cli(
        ["import", str(ROOT / "examples" / "scalerl_runs.csv"), "--study", "logs", "--db", url], capsys, monkeypatch
    )
    assert code == 0, err
    code, out, err = _cli(
        ["report", "logs", "--db", url, "--out", "rep", "--bootstrap", "0", "--json"], capsys, monkeypatch
    )
    assert code == 0, err
    assert json.loads(out)["method"] == "imported"  # no spec: not a grid anyone planned
