"""What a person reads at 80 columns: every line of fit, import, report, backtest, recommend, plan and studies
fits, no cell or header is cut with an ellipsis, and notes are bullet lines."""

from pathlib import Path

import pytest
from helpers import NAMES, curves_csv, run_cli
from rich.cells import cell_len

ROOT = Path(__file__).parents[1]


@pytest.fixture
def narrow(monkeypatch, capsys, workdir):
    from rlscale.cli.console import console

    monkeypatch.setattr(console, "_width", 80)

    def call(*args):
        code, out, err = run_cli(monkeypatch, capsys, *args)
        assert (code, err) == (0, ""), (args, err)
        from rlscale.views.wording import db_flag

        db = db_flag(args[args.index("--db") + 1] if "--db" in args else None)  # as printed: the absolute path
        # a command stays whole on its line, to copy: only the store's URL (the test's long path) may overflow it, as
        # may a path alone on its line (a word longer than a line is never broken)
        too_wide = [
            line
            for line in out.splitlines()
            if cell_len(line.replace(db, "") if line.startswith("  rlscale ") else line) > 80 and " " in line.strip()
        ]
        assert not too_wide, (args, too_wide)
        assert "…" not in out, (args, out)  # rich cuts a cell or header it cannot fit with an ellipsis
        return out

    return call


def test_commands_on_tracker_named_runs_fit_80_columns(narrow, workdir):
    curves_csv(workdir / "runs.csv", NAMES[:6] + ["short"], points=12)
    with (workdir / "runs.csv").open("a") as f:
        f.write("two points,1,0.1\ntwo points,2,0.2\n")  # a run that cannot be fitted: its reason under the table
    url = "sqlite:///rl.db"
    narrow("import", "runs.csv", "--study", "logs", "--db", url)
    out = narrow("fit", "runs.csv")
    assert "(1) two points: not fitted: need at least 3 points" in out
    narrow("fit", "--study", "logs", "--db", url)
    out = narrow("report", "logs", "--db", url, "--bootstrap", "0")
    assert "\n- " in out and "note:" not in out  # notes as bullets
    narrow("backtest", "--study", "logs", "--db", url, "--bootstrap", "2")
    narrow("studies", "--db", url)


def test_plans_and_a_leave_one_out_report_fit_80_columns(narrow, workdir):
    from helpers import seed_loo

    narrow("plan", str(ROOT / "studies" / "scalerl_loo.yaml"))  # variant names longer than their column
    narrow("plan", "--budget", "16000", "--min-steps", "300")  # a table of dropped points with reasons
    url = f"sqlite:///{workdir / 'loo.db'}"
    name = seed_loo(url)
    out = narrow("report", name, "--db", url, "--bootstrap", "0")
    assert "leave-one-out" in out and "worse" in out  # the DAPO revert, beyond noise


def test_recommend_fits_80_columns(narrow, workdir):
    from helpers import bench, seed_isocompute

    url = f"sqlite:///{workdir / 'iso.db'}"
    truth, c_obs = bench.CASES["saturates_64"]
    seed_isocompute(url, "iso", truth, c_obs)
    out = narrow("recommend", "--budget", "100", "--study", "iso", "--db", url, "--bootstrap", "0")
    assert "evidence" in out and "frontier:" in out
