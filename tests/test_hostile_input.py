"""Hostile and unlucky input (issue 19): no path escapes, no secrets or markup reach the terminal, every failure a
user can cause is one line and exit 2, work is bounded before it starts, and concurrent SQLite writers wait.

Each test names what a user would see go wrong; all run without torch, Ray or vLLM, in seconds."""

import json
import math
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from helpers import run_cli
from rlscale.db.engine import display_url
from rlscale.db.store import Store

from rlscale.base.errors import UserError
from rlscale.base.names import MAX_RUNS, MAX_SEEDS, check_name, child_path, verifier_problem

REPO = Path(__file__).parents[1]
OSC52 = "\x1b]52;c;cm0gLXJmIH4=\x07"  # a clipboard write: a terminal obeys it if it arrives raw


def one_line_error(code: int, out: str, err: str) -> str:
    """The single `error: ...` line of a refused command (exit 2, nothing else on stderr)."""
    assert code == 2, (code, out, err)
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and "\x1b" not in err
    return err


@pytest.fixture
def cli(monkeypatch, capsys, workdir):
    return lambda *args: run_cli(monkeypatch, capsys, *args)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _runs_csv(workdir: Path, name: str = "runs.csv", run: str = "a") -> Path:
    return _write(workdir / name, f"run,compute,reward\n{run},1,0.1\n{run},2,0.2\n{run},3,0.3\n")


# --- names: one rule at every entry point, paths stay inside their directory -----------------------------------


@pytest.mark.parametrize("study", ["../../escape", "/tmp/abs", "", ".hidden", "a/b", "[/]", "x" * 300, "a\x1b[2Jb"])
def test_import_refuses_a_study_name_that_is_not_a_name(cli, workdir, study):
    err = one_line_error(*cli("import", str(_runs_csv(workdir)), "--study", study, "--db", "sqlite:///s.db"))
    assert "study" in err and "letters, digits" in err
    assert not (workdir / "s.db").exists()  # refused before the store is created


def test_a_path_the_system_refuses_or_a_store_that_keeps_nothing_is_one_line(cli, workdir):
    runs, long = _runs_csv(workdir), "y" * 300
    for args in (
        ("fit", f"{long}.csv", "--json"),
        ("import", f"{long}.csv", "--study", "s", "--db", "sqlite:///s.db"),
        ("report", "x", "--out", long, "--db", "sqlite:///s.db"),
    ):
        assert "File name too long" in one_line_error(*cli(*args))
    err = one_line_error(*cli("studies", "--db", "sqlite:///mine.db?timeout=abc"))
    assert "timeout" in err and "mine.db" in err
    assert "mine.db?mode=ro" in one_line_error(*cli("studies", "--db", "sqlite:///mine.db?mode=ro"))  # the user's file
    for url in ("sqlite://", "sqlite:///:memory:"):
        assert "in-memory" in one_line_error(*cli("import", str(runs), "--study", "s", "--db", url))
        assert "in-memory" in one_line_error(*cli("plan", "--budget", "100", "--save", "p", "--db", url))
    assert "--bootstrap" in one_line_error(*cli("backtest", str(runs), "--bootstrap", "99999999999"))
    assert cli("fit", str(runs), "--at", "1e-320")[0] == 0  # a subnormal compute: a prediction, not a crash


def test_a_study_with_nothing_fittable_exits_2_and_says_how_to_see_why(cli, workdir):
    one = _write(workdir / "one.csv", "run,compute,reward\na,1,0.1\n")
    assert cli("import", str(one), "--study", "s", "--db", "sqlite:///s.db")[0] == 0
    assert "no run could be fitted" in one_line_error(*cli("fit", "--study", "s", "--db", "sqlite:///s.db"))
    err = one_line_error(*cli("export", "--format", "yaml", "--study", "s", "--db", "sqlite:///s.db"))
    command = err.split("why, run by run: ")[1].strip()
    assert command.startswith("rlscale fit --study s --db ")
    assert cli(*command.split()[1:])[0] == 2  # it runs, and says why for each run


def test_report_never_writes_outside_reports(cli, workdir):
    for study in ("../../escape", "/tmp/x", "..", "x" * 300):
        one_line_error(*cli("report", study, "--db", "sqlite:///s.db"))
    assert not (workdir.parent.parent / "escape").exists()
    with pytest.raises(UserError):
        child_path(workdir / "reports", "..", field="study")
    assert child_path("reports", "ok-1.2_x", field="study") == Path("reports/ok-1.2_x")


def test_a_report_that_cannot_land_leaves_nothing_half_written(cli, workdir):
    runs = _write(workdir / "runs.csv", "".join(f"a,{c},{0.5 - 0.4 / (1 + c / 4):.4f}\n" for c in range(1, 13)))
    runs.write_text("run,compute,reward\n" + runs.read_text())
    assert cli("import", str(runs), "--study", "s", "--db", "sqlite:///s.db")[0] == 0
    (workdir / "out" / "report.md").mkdir(parents=True)  # a directory in the markdown's place
    err = one_line_error(*cli("report", "s", "--db", "sqlite:///s.db", "--out", "out"))
    assert "report.md" in err
    assert [path.name for path in (workdir / "out").iterdir()] == ["report.md"]  # no PNG, no staging folder
    (workdir / "out" / "report.md").rmdir()
    assert cli("report", "s", "--db", "sqlite:///s.db", "--out", "out")[0] == 0
    written = sorted(path.name for path in (workdir / "out").iterdir())
    assert "report.md" in written and "report.html" in written and "curves.png" in written
    assert not [name for name in written if name.startswith(".")]


def test_study_files_keep_the_strict_rule_and_imported_runs_refuse_control_characters(cli, workdir):
    study = _write(workdir / "s.yaml", "name: '../x'\nmethod: grid\nparameters: {rollouts: {values: [8]}}\n")
    assert "name" in one_line_error(*cli("plan", str(study)))
    long_name = _write(
        workdir / "l.yaml", f"name: {'a' * 300}\nmethod: grid\nparameters: {{rollouts: {{values: [8]}}}}\n"
    )
    assert "300 characters" in one_line_error(*cli("plan", str(long_name)))
    loo = _write(
        workdir / "loo.yaml", "name: loo\nmethod: loo\nleave_one_out: [{name: '[red]x', overrides: {loss: dapo}}]\n"
    )
    assert "leave_one_out.0.name" in one_line_error(*cli("plan", str(loo)))
    # run names are printable text as trackers write them (markup included, shown literally), never control codes
    for run, why in ((f"a{OSC52}", "U+001B"), ("a\u202eb", "U+202E"), ("x" * 201, "201"), ("a\x9bb", "U+009B")):
        err = one_line_error(*cli("import", str(_runs_csv(workdir, run=run)), "--study", "s", "--db", "sqlite:///s.db"))
        assert "runs.csv:2" in err and "column 'run'" in err and why in err
    with Store("sqlite:///s.db") as store:
        assert store.study_names() == []  # nothing was written
    assert check_name("a" * 100, field="f") and pytest.raises(UserError, check_name, "a" * 101, field="f")


# --- the terminal: markup and escape sequences from data are shown, never obeyed --------------------------------


def _legacy_store(path: Path) -> str:
    """A store written by an older rlscale, holding names the rule now refuses (markup, an OSC 52 sequence)."""
    url = f"sqlite:///{path}"
    with Store(url) as store:
        store.upsert_study("ok", {})
    con = sqlite3.connect(path)
    con.execute("insert into rlscale_studies (name, spec, created_at) values (?, '{}', '2026-01-01')", ("[/]",))
    con.execute(
        "insert into rlscale_studies (name, spec, created_at) values (?, '{}', '2026-01-01')",
        (f"[link=http://evil]x{OSC52}",),
    )
    con.commit()
    con.close()
    return url


def test_studies_lists_a_store_with_markup_and_escape_sequences_in_its_names(cli, workdir, monkeypatch):
    url = _legacy_store(workdir / "legacy.db")
    from rlscale.cli.console import console

    monkeypatch.setattr(console, "width", 200)  # names stay whole in the table
    code, out, err = cli("studies", "--db", url)
    assert (code, err) == (0, "")
    assert "[/]" in out and "[link=http://evil]" in out  # shown as typed, not interpreted
    assert "\x1b" not in out and "\\x1b]52" in out


def test_tables_and_errors_escape_what_came_from_data():
    import pandas as pd
    from rich.console import Console
    from rlscale.runner.sweep.state import RunState

    from rlscale.cli.views import fits_table, sweep_table

    console = Console(record=True, width=200, force_terminal=False)
    runs = [RunState(1, f"[/]{OSC52}", None, 0, 1.0, status="failed", note="[bold]boom\x1b[31m")]
    console.print(sweep_table("[/]", runs))
    fits = pd.DataFrame([{"run": "[/]", "A": 0.5, "identified": False, "reason": f"[red]{OSC52}"}])
    console.print(fits_table(fits, title="[/]"))
    text = console.export_text()
    assert "\x1b" not in text and "[/]" in text and "[bold]boom" in text


def test_an_error_message_carrying_an_escape_sequence_is_printed_visibly(cli, workdir):
    err = one_line_error(*cli("status", f"x{OSC52}", "--db", "sqlite:///s.db"))
    assert "\\x1b]52" in err


# --- secrets ---------------------------------------------------------------------------------------------------


def test_password_like_query_parameters_are_masked_everywhere(cli):
    url = "postgresql+psycopg://u@127.0.0.1:1/db?password=hunter2&sslpassword=k3y&sslmode=disable"
    shown = display_url(url)
    assert "hunter2" not in shown and "k3y" not in shown and "password=***" in shown and "sslmode=disable" in shown
    assert "pw" not in display_url("postgresql://u:pw@h/d?PWD=pw")
    with pytest.raises(UserError) as err:
        Store(url)
    assert "hunter2" not in str(err.value)
    code, out, err_text = cli("studies", "--db", url)
    assert "hunter2" not in out + err_text and "k3y" not in out + err_text
    one_line_error(code, out, err_text)


@pytest.mark.parametrize("url", ["sqlite://x.db", "sqlite://user@host/x.db"])
def test_a_sqlite_url_with_two_slashes_is_one_line_naming_the_form(cli, workdir, url):
    err = one_line_error(*cli("studies", "--db", url))
    assert "sqlite:///path/to/file.db" in err and not (workdir / "x.db").exists()


@pytest.mark.parametrize("host", ["...", "a..b"])
def test_a_placeholder_host_in_a_server_url_is_one_line_naming_it(cli, host):
    # the README's `--db postgresql+psycopg://...` pasted as is: the driver's resolver raised UnicodeError
    err = one_line_error(*cli("studies", "--db", f"postgresql+psycopg://u@{host}/x"))
    assert err.startswith("error: --db: expected a host name or address") and repr(host) in err


def test_a_bad_store_url_from_the_environment_is_named_as_such(cli, workdir, monkeypatch):
    monkeypatch.setenv("RLSCALE_DB", "nonsense")
    err = one_line_error(*cli("studies"))
    assert err.startswith("error: RLSCALE_DB: expected a SQLAlchemy URL") and "port" not in err


# --- verifiers ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "verifier",
    [
        "os:system",
        "builtins:eval",
        "shutil:rmtree",
        "subprocess:run",
        "importlib:import_module",
        "rlscale.db.store:Store",
        "__import__('os')",
    ],
)
def test_a_verifier_from_the_standard_library_or_not_module_function_is_refused(cli, workdir, verifier):
    study = _write(
        workdir / "s.yaml",
        yaml.safe_dump(
            {
                "name": "s",
                "method": "grid",
                "recipe": {"verifier": verifier},
                "parameters": {"rollouts": {"values": [8]}},
            }
        ),
    )
    assert "recipe.verifier" in one_line_error(*cli("plan", str(study)))
    bare = _write(workdir / "r.yaml", yaml.safe_dump({"verifier": verifier, "steps": 10}))
    assert "verifier" in one_line_error(*cli("export", "--format", "openrlhf", "--recipe", str(bare)))


def test_the_projects_tasks_and_your_own_package_are_verifiers():
    assert verifier_problem("my_tasks.math:verify") is None
    assert verifier_problem("rlscale.runner.rl.tasks:math_match") is None


# --- bounded work --------------------------------------------------------------------------------------------------


def test_a_study_of_a_hundred_million_seeds_is_refused_at_once(cli, workdir):
    study = _write(
        workdir / "s.yaml", "name: s\nmethod: grid\nseeds: 100000000\nparameters: {rollouts: {values: [8]}}\n"
    )
    started = time.perf_counter()
    err = one_line_error(*cli("plan", str(study)))
    assert time.perf_counter() - started < 5 and "seeds" in err and f"{MAX_SEEDS:,}" in err


def test_a_study_above_the_run_limit_is_refused_with_its_count(cli, workdir):
    values = ", ".join(str(i) for i in range(1, 5001))
    study = _write(
        workdir / "s.yaml", f"name: s\nmethod: grid\nseeds: 3\nparameters: {{rollouts: {{values: [{values}]}}}}\n"
    )
    err = one_line_error(*cli("plan", str(study)))
    assert "15,000 runs" in err and f"{MAX_RUNS:,}" in err


def test_planning_the_largest_allowed_study_is_quick(cli, workdir):
    values = ", ".join(str(i) for i in range(1, 5001))
    study = _write(
        workdir / "s.yaml",
        "name: s\nmethod: isocompute\nseeds: 2\ncompute: {budget: 1e6, unit: rollouts}\n"
        f"parameters: {{rollouts: {{values: [{values}]}}}}\n",
    )
    started = time.perf_counter()
    code, out, err = cli("plan", str(study), "--json")
    assert code == 0, err
    assert len(json.loads(out)["runs"]) == 10_000 and time.perf_counter() - started < 30


def test_a_plan_grid_above_the_cap_is_refused_before_any_work(cli):
    axis = ",".join(str(i) for i in range(1, 401))
    started = time.perf_counter()
    err = one_line_error(*cli("plan", "--budget", "16000", "--prompts", axis, "--rollouts", axis))
    assert "160,000 combinations" in err and time.perf_counter() - started < 5


@pytest.mark.parametrize("budget", ["inf", "1e308", "1.7e308"])
def test_plan_refuses_a_budget_beyond_any_run(cli, budget):
    err = one_line_error(*cli("plan", "--budget", budget, "--json"))
    assert "--budget" in err


def test_plan_json_is_strict_json():
    from rlscale.cli.console import print_json

    with pytest.MonkeyPatch.context() as mp:
        written = []
        mp.setattr(sys.stdout, "write", written.append)
        print_json({"a": math.inf, "b": [math.nan, 1.5]})
    assert json.loads("".join(written), parse_constant=lambda c: pytest.fail(c)) == {"a": None, "b": [None, 1.5]}


# --- one line and exit 2 for every failure a user can cause --------------------------------------------------------


def test_status_shows_an_imported_study(cli, workdir):
    assert cli("import", str(_runs_csv(workdir)), "--study", "s", "--db", "sqlite:///s.db")[0] == 0
    code, out, err = cli("status", "s", "--db", "sqlite:///s.db")
    assert (code, err) == (0, "") and "done" in out
    code, out, _ = cli("status", "s", "--db", "sqlite:///s.db", "--json")
    assert code == 0 and json.loads(out)[0]["steps"] is None


def _early_study(url: str) -> None:
    """An IsoCompute study whose runs all stopped long before their inflection."""
    import numpy as np
    from rlscale.planner.recipe import Recipe

    spec = {
        "name": "early",
        "method": "isocompute",
        "compute": {"budget": 100.0},
        "parameters": {"rollouts": {"values": [4, 8, 16, 32]}},
        "recipe": {"prompts_per_batch": 8},
    }
    rng = np.random.default_rng(1)
    with Store(url) as store:
        store.upsert_study("early", spec)
        for k, n in enumerate((4, 8, 16, 32)):
            run = store.ensure_run("early", f"n{n}", Recipe(prompts_per_batch=8, rollouts=n, steps=100).to_json())
            store.set_run_status(run, "done")
            c = np.linspace(0.01, 1.0, 12)
            reward = 0.1 + 0.6 / (1 + (2 * (1 + 0.3 * k) / c) ** 2) + rng.normal(0, 0.005, c.size)
            store.add_records(
                run,
                [{"step": i, "gpu_hours": float(x), "val_reward": float(r)} for i, (x, r) in enumerate(zip(c, reward))],
            )


def test_recommend_export_and_report_on_runs_before_their_inflection(cli, workdir):
    url = f"sqlite:///{workdir / 'early.db'}"
    _early_study(url)
    assert "no recommendation" in one_line_error(*cli("recommend", "--budget", "100", "--db", url, "--bootstrap", "0"))
    assert "no recommendation" in one_line_error(
        *cli("export", "--format", "yaml", "--study", "early", "--budget", "100", "--db", url)
    )
    code, out, err = cli("report", "early", "--db", url, "--bootstrap", "0")
    assert code == 0, err
    assert (workdir / "reports" / "early" / "report.html").is_file()


@pytest.mark.parametrize("budget", ["inf", "1e308", "nan", "1e14"])
def test_recommend_and_export_refuse_an_unusable_budget(cli, workdir, budget):
    from helpers import bench, seed_isocompute

    url = f"sqlite:///{workdir / 'iso.db'}"
    truth, c_obs = bench.CASES["saturates_64"]
    seed_isocompute(url, "iso", truth, c_obs)
    common = ["--budget", budget, "--study", "iso", "--db", url]
    assert "--budget" in one_line_error(*cli("recommend", *common, "--profile", "tiny-cpu", "--bootstrap", "0"))
    assert "--budget" in one_line_error(*cli("export", "--format", "yaml", *common, "--profile", "tiny-cpu"))


@pytest.mark.parametrize(
    "cell, column, line",
    [
        ("rollouts\n{a},1,0.1,1e20", "rollouts", 2),
        ("tokens\n{a},1,0.1,9223372036854775808", "tokens", 2),
        ("step\n{a},1,0.1," + "9" * 5000, "step", 2),
    ],
)
def test_csv_integers_beyond_64_bits_are_refused(cli, workdir, cell, column, line):
    header, row = cell.split("\n")
    path = _write(workdir / "big.csv", f"run,compute,reward,{header}\n{row.format(a='a')}\n")
    err = one_line_error(*cli("import", str(path), "--study", "s", "--db", "sqlite:///s.db"))
    assert f"big.csv:{line}" in err and f"column '{column}'" in err


def test_the_largest_64_bit_integer_is_stored_exactly(cli, workdir):
    path = _write(workdir / "max.csv", "run,compute,reward,tokens\na,1,0.1,9223372036854775807\n")
    assert cli("import", str(path), "--study", "s", "--db", "sqlite:///s.db")[0] == 0
    with Store("sqlite:///s.db") as store:
        assert store.records_frame("s")["tokens"].tolist() == [2**63 - 1]


@pytest.mark.parametrize(
    "line",
    [
        '{"run": "a", "compute": 1, "reward": 0.1, "tokens": 9223372036854775808}',
        '{"run": "a", "compute": 1, "reward": 0.1, "step": ' + "9" * 5000 + "}",
        '{"run": "a", "compute": 1, "reward": 0.1, "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
        '{"run": "a", "compute": 1, "reward": 0.1, "reward": 0.9}',
        '{"run": "a", "compute": 1, "Reward": 0.1, "reward": 0.9}',
    ],
)
def test_jsonl_big_integers_deep_nesting_and_duplicate_keys_are_refused(cli, workdir, line):
    path = _write(workdir / "log.jsonl", '{"run": "a", "compute": 0, "reward": 0.0}\n' + line + "\n")
    err = one_line_error(*cli("import", str(path), "--study", "s", "--db", "sqlite:///s.db"))
    assert "log.jsonl:2" in err


def test_a_jsonl_error_names_the_right_line(cli, workdir):
    # U+2028, U+2029 and NEL are legal inside a JSON string; str.splitlines counts them as line breaks
    path = _write(
        workdir / "log.jsonl",
        '{"run": "a", "compute": 0, "reward": 0.0, "note": "x\u2028y\u2029z\x85"}\n'
        '{"run": "a", "compute": 1, "reward": "oops"}\n',
    )
    assert "log.jsonl:2: column 'reward'" in one_line_error(*cli("fit", str(path)))


@pytest.mark.parametrize(
    "url, expected",
    [
        ("sqlite:///{notdb}", "not a SQLite database"),
        ("postgresql+psycopg://u@host:port/db", "--db"),
        ("postgresql+psycopg://u@127.0.0.1:99999/db", "port"),
        ("postgresql+psycopg://u@ho st:5432/db", "cannot open"),
        ("postgresql+psycopg://u@127.0.0.1:1/db?sslmode=bogus", "cannot open"),
        ("sqlite:///{db}?foo=bar", "unknown option"),
    ],
)
def test_db_urls_that_cannot_work_are_one_line_errors(cli, workdir, url, expected):
    notdb = _write(workdir / "notdb.db", "this is not a database\n" * 100)
    url = url.format(notdb=notdb, db=workdir / "x.db")
    assert expected in one_line_error(*cli("studies", "--db", url))
    assert expected in one_line_error(*cli("import", str(_runs_csv(workdir)), "--study", "s", "--db", url))


@pytest.mark.parametrize("unwritable", ["file", "directory"])
def test_a_read_only_store_can_still_be_read(cli, workdir, monkeypatch, unwritable):
    url = f"sqlite:///{workdir / 'ro' / 's.db'}"
    (workdir / "ro").mkdir()
    assert cli("import", str(_runs_csv(workdir)), "--study", "s", "--db", url)[0] == 0
    import rlscale.db.engine as engine

    real = os.access
    target = str(workdir / "ro") if unwritable == "directory" else str(workdir / "ro" / "s.db")
    # root may write anything, so the test says what an unprivileged user (or a read-only mount) would see
    monkeypatch.setattr(
        engine.os, "access", lambda p, mode: False if mode == os.W_OK and str(p) == target else real(p, mode)
    )
    engine._migrated.clear()
    code, out, err = cli("studies", "--db", url)
    assert (code, err) == (0, "") and "s" in out
    assert cli("status", "s", "--db", url)[0] == 0
    err = one_line_error(*cli("import", str(_runs_csv(workdir, "more.csv", run="b")), "--study", "s", "--db", url))
    assert "read-only" in err


def test_output_paths_that_cannot_be_written_are_one_line_errors(cli, workdir):
    url = f"sqlite:///{workdir / 's.db'}"
    csv = _runs_csv(workdir)
    assert cli("import", str(csv), "--study", "s", "--db", url)[0] == 0
    afile = _write(workdir / "afile", "x")
    assert "--out" in one_line_error(*cli("report", "s", "--db", url, "--out", str(afile)))
    assert "--plot" in one_line_error(*cli("fit", str(csv), "--plot", "x.txt"))
    recipe = _write(workdir / "r.yaml", "steps: 10\n")
    assert "--out" in one_line_error(
        *cli("export", "--format", "yaml", "--recipe", str(recipe), "--out", str(afile / "x.yaml"))
    )
    if Path("/dev/full").exists():
        assert "No space" in one_line_error(
            *cli("export", "--format", "yaml", "--recipe", str(recipe), "--out", "/dev/full")
        )


def test_base_model_without_the_runner_extra_says_what_to_install(workdir):
    code = (
        "import sys; sys.modules['torch'] = None; sys.argv = ['rlscale', 'base-model']; "
        "from rlscale.cli import main; main()"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=workdir)
    one_line_error(done.returncode, done.stdout, done.stderr)
    assert "runner" in done.stderr and "torch" in done.stderr


@pytest.mark.parametrize(
    "recipe, field",
    [
        ("lr: .inf", "lr"),
        ("lr: .nan", "lr"),
        ("steps: 1_000", "steps"),  # YAML 1.1 read this as 1000
        ("fp32_head: yes", "fp32_head"),  # YAML 1.1 read this as true
        ("steps: 10\nloss: dapo\nsteps: 20", "line 3"),  # a duplicate key
    ],
)
def test_yaml_values_are_read_as_written(cli, workdir, recipe, field):
    bare = _write(workdir / "r.yaml", recipe + "\n")
    assert field in one_line_error(*cli("export", "--format", "yaml", "--recipe", str(bare)))
    nested = "\n".join("  " + line for line in recipe.splitlines())
    study = _write(
        workdir / "s.yaml", f"name: s\nmethod: grid\nparameters: {{rollouts: {{values: [8]}}}}\nrecipe:\n{nested}\n"
    )
    one_line_error(*cli("plan", str(study)))


def test_yaml_12_numbers_still_read():
    from rlscale.planner.loading import StrictLoader

    data = yaml.load("a: 1e-4\nb: 010\nc: 0x1F\nd: -2.5\ne: true\nf: ~", Loader=StrictLoader)
    assert data == {"a": 1e-4, "b": 10, "c": 31, "d": -2.5, "e": True, "f": None}


def test_warnings_never_precede_a_one_line_error(workdir):
    # in a fresh process, as a user runs it: Python prints warnings to stderr unless the CLI holds them back
    code = textwrap.dedent("""
        import sys, warnings
        import numpy as np
        try:
            import rlscale.db.importer as importer
            from rlscale.base.errors import UserError
        except ImportError:  # the layout before the rlscale.* namespace
            import db.importer as importer
            from rlscale.errors import UserError

        def noisy(*_args, **_kwargs):
            np.log(np.array([0.0]))  # RuntimeWarning: divide by zero
            warnings.warn("matplotlib would say something here", UserWarning)
            raise UserError("expected a better file", file="x.csv")

        importer.read_run_log = noisy
        sys.argv = ["rlscale", "fit", "x.csv"]
        from rlscale.cli import main
        main()
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=workdir)
    assert one_line_error(done.returncode, done.stdout, done.stderr) == "error: x.csv: expected a better file\n"


# --- concurrent writers --------------------------------------------------------------------------------------------

_IMPORTER = textwrap.dedent("""
    import os, sys, time
    from rlscale.cli import main  # everything imported before the start line, so the imports collide
    go = sys.argv[1]
    while not os.path.exists(go):
        time.sleep(0.005)
    sys.argv = ["rlscale", "import", sys.argv[2], "--study", "s", "--db", sys.argv[3]]
    main()
""")


@pytest.mark.parametrize("existing", [True, False], ids=["existing-store", "new-store"])
def test_eight_concurrent_imports_into_one_sqlite_store_all_succeed(workdir, existing):
    url = f"sqlite:///{workdir / 'shared.db'}"
    if existing:
        with Store(url) as store:
            store.upsert_study("s", {})
    files = []
    for i in range(8):
        rows = "".join(f"run{i}_{r},{step},{step / 100}\n" for r in range(3) for step in range(40))
        files.append(_write(workdir / f"log{i}.csv", "run,compute,reward\n" + rows))
    go = workdir / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _IMPORTER, str(go), str(f), url],
            cwd=workdir,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for f in files
    ]
    time.sleep(1.0)
    go.write_text("")
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    assert all(code == 0 for code, _ in results), results
    with Store(url) as store:
        records = store.records_frame("s")
        runs = store.runs_frame("s")
    assert len(runs) == 24 and runs["run"].is_unique
    assert len(records) == 8 * 3 * 40 and not records.duplicated(["run", "step"]).any()


def test_an_output_path_under_a_file_is_one_line_exit_2(cli, workdir):
    runs = _runs_csv(workdir)
    assert cli("import", str(runs), "--study", "s", "--db", "sqlite:///s.db")[0] == 0
    err = one_line_error(*cli("report", "s", "--db", "sqlite:///s.db", "--out", f"{runs}/sub"))
    assert err == f"error: --out: {runs} is a file: expected a directory for report.md, report.html and the PNGs\n"
    err = one_line_error(*cli("fit", str(runs), "--plot", f"{runs}/sub/fits.png"))
    assert err == f"error: --plot: {runs} is a file: expected a directory for fits.png\n"


def _quickstart_with(workdir: Path, name: str, old: str, new: str) -> Path:
    text = (REPO / "studies" / "quickstart.yaml").read_text()
    assert old in text
    return _write(workdir / name, text.replace(old, new, 1))


@pytest.mark.parametrize(
    ("old", "new", "error"),
    [
        (
            "  task: arithmetic",
            "  task: /nonexistent/file.jsonl",
            "recipe.task: file not found: /nonexistent/file.jsonl",
        ),
        (
            "  task: arithmetic",
            "  task: data/missing.jsonl",
            "recipe.task: file not found: data/missing.jsonl (a relative path is read from where rlscale runs: ",
        ),
        ("  model: tiny", "  model: /nonexistent/model", "recipe.model: /nonexistent/model: expected 'tiny' or a HF"),
        ("  task: arithmetic", "  task: arithmetic\n  verifier: nopkg.mod:fn", "recipe.verifier: nopkg.mod:fn: cannot"),
    ],
)
def test_the_builtin_dry_run_loads_each_jobs_model_task_and_verifier(cli, workdir, old, new, error):
    study = _quickstart_with(workdir, "q.yaml", old, new)
    err = one_line_error(*cli("sweep", str(study), "--dry-run", "--db", "sqlite:///s.db"))
    assert err.startswith(f"error: {study}: {error}")
    assert not (workdir / "s.db").exists()
    # on a cluster, a path or module this machine does not have is the cluster's: noted, not refused
    code, out, err = cli("sweep", str(study), "--dry-run", "--json", "--ray-address", "http://head:8265")
    assert code == 0, err
    assert all(len(point["notes"]) == 1 for point in json.loads(out))


def test_a_seed_in_the_study_recipe_is_refused(cli, workdir):
    study = _quickstart_with(workdir, "q.yaml", "  task: arithmetic", "  task: arithmetic\n  seed: 3")
    err = one_line_error(*cli("plan", str(study)))
    assert err == f"error: {study}: recipe.seed: seeds are set by the study's `seeds`, not in the recipe\n"


@pytest.mark.parametrize(
    ("option", "error"),
    [
        (("--out", "afile"), "--out: afile is a file: expected a directory for report.md"),
        (("--out", "afile/report"), "--out: afile is a file: expected a directory for report.md"),
        (("--db", "sqlite:///nowhere/s.db"), "--db: cannot create the store sqlite:///"),
        (("--db", "sqlite:///adir"), "--db: "),
        (("--shared-dir", "afile"), "--shared-dir: afile is a file: expected a directory for the runs' data"),
    ],
)
def test_the_dry_run_refuses_what_the_sweep_could_not_write_to(cli, workdir, option, error):
    # a sweep would train every run, then fail writing its report: the dry-run and the sweep refuse it first
    (workdir / "afile").write_text("")
    (workdir / "adir").mkdir()
    study = _quickstart_with(workdir, "q.yaml", "  task: arithmetic", "  task: arithmetic")
    for extra in (["--dry-run"], []):
        err = one_line_error(*cli("sweep", str(study), *extra, *option))
        assert err.startswith(f"error: {error}"), err
    assert sorted(path.name for path in workdir.iterdir()) == ["adir", "afile", "q.yaml"]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (
            ("fit", "{csv}", "--plot", "afile/plots/fit.png"),
            "--plot: afile is a file: expected a directory for fit.png",
        ),
        (
            ("export", "--format", "yaml", "--recipe", "{recipe}", "--out", "afile/prod/recipe.yaml"),
            "--out: afile is a file: expected a directory for recipe.yaml",
        ),
    ],
)
def test_fit_and_export_refuse_an_output_under_a_file_before_writing(cli, workdir, args, error):
    # one rule with report and sweep (rlscale/cli/options.check_out_dir): any folder above it being a file
    (workdir / "afile").write_text("")
    sources = {
        "csv": REPO / "bench/data/public/cs336_grpo_math_eval_points.csv",
        "recipe": REPO / "studies/quickstart.yaml",
    }
    err = one_line_error(*cli(*(arg.format(**sources) for arg in args)))
    assert err == f"error: {error}\n"
    assert sorted(path.name for path in workdir.iterdir()) == ["afile"]


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("fit", "afile", "--json"), None),
        (("status", "nosuch", "--json", "--db", "sqlite:///s.db"), None),
        (("plan", "--budget", "-1", "--json"), "--budget"),
        (("plan", "--budgetx", "3", "--json"), None),
    ],
)
def test_a_refused_command_with_json_says_why_on_stdout_too(cli, workdir, args, field):
    (workdir / "afile").write_text("")
    code, out, err = cli(*args)
    line = one_line_error(code, out, err)
    assert json.loads(out) == {"error": line[len("error: ") : -1], "file": None, "field": field, "exit_code": 2} | (
        {"file": "afile"} if args[0] == "fit" else {}
    )
    assert not (workdir / "s.db").exists()


def test_a_budget_too_large_for_any_run_names_the_study_file(cli, workdir):
    study = _quickstart_with(workdir, "q.yaml", "  budget: 0.035", "  budget: 1e16")
    err = one_line_error(*cli("plan", str(study)))
    assert err.startswith(f"error: {study}: compute.budget: a budget of 1e+16 gives a run about ")


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (
            ("sweep", "studies/quickstart.yaml", "--extend", "nan"),
            "--extend: expected a factor from 1 to 1000, got nan",
        ),
        (
            ("sweep", "studies/quickstart.yaml", "--extend", "0.5"),
            "--extend: expected a factor from 1 to 1000, got 0.5",
        ),
        (
            ("export", "--format", "yaml", "--recipe", "recipes/tiny_scalerl.yaml", "--budget", "5"),
            "--recipe: --recipe ",
        ),
        (("export", "--format", "yaml", "--recipe", "recipes/tiny_scalerl.yaml", "--profile", "x"), "--recipe: "),
        (
            ("export", "--format", "yaml", "--recipe", "studies/quickstart.yaml"),
            "studies/quickstart.yaml: parameters: ",
        ),
    ],
)
def test_a_flag_that_would_be_ignored_or_a_study_given_as_a_recipe_is_refused(cli, args, error, monkeypatch):
    monkeypatch.chdir(REPO)
    assert one_line_error(*cli(*args)).startswith(f"error: {error}")
