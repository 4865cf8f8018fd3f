"""`rlscale import`: tracker exports (CSV/JSONL) into a study; bad files are refused whole, with line and column."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_cli
from rlscale.db.importer import import_run_log, read_run_log
from rlscale.db.store import Store

from rlscale.base.errors import UserError

DATA = Path(__file__).parent / "data"


def test_csv_import_stores_every_row_and_a_second_import_adds_nothing(monkeypatch, capsys, db_url):
    code, out, err = run_cli(
        monkeypatch, capsys, "import", str(DATA / "two_runs.csv"), "--study", "tracker", "--db", db_url
    )
    assert (code, err) == (0, "")
    assert "2 runs (2 new), 5 records added, 0 already stored" in out
    with Store(db_url) as store:
        records = store.records_frame("tracker")
        runs = store.runs_frame("tracker")
    assert sorted(runs["run"]) == ["a", "b"]
    assert set(runs["status"]) == {"done"}  # imported logs are finished runs: a sweep must not start them
    a = records[records["run"] == "a"]
    assert a["step"].tolist() == [0, 10, 20]
    assert a["gpu_hours"].tolist() == [0.0, 0.5, 1.0]
    assert a["val_reward"].tolist() == pytest.approx([0.10, 0.21, 0.33])
    assert a["tokens"].tolist() == [0, 92160, 184320]
    assert a["entropy"].tolist()[:2] == pytest.approx([1.5, 1.4])
    assert records[records["run"] == "b"]["step"].tolist() == [0, 20]

    code, out, _ = run_cli(
        monkeypatch, capsys, "import", str(DATA / "two_runs.csv"), "--study", "tracker", "--db", db_url, "--json"
    )
    assert code == 0
    summary = json.loads(out)
    assert (summary["runs_created"], summary["records_added"], summary["records_skipped"]) == (0, 0, 5)
    with Store(db_url) as store:
        assert len(store.records_frame("tracker")) == 5 and len(store.runs_frame("tracker")) == 2


def test_a_longer_export_of_the_same_runs_adds_only_the_new_steps(tmp_path, db_url):
    from rlscale.db.importer import import_run_log

    first = tmp_path / "log.csv"
    first.write_text("run,compute,reward\nx,1,0.1\nx,2,0.2\n")
    longer = tmp_path / "log_later.csv"
    longer.write_text("run,compute,reward\nx,1,0.1\nx,2,0.2\nx,3,0.3\n")
    with Store(db_url) as store:
        import_run_log(store, first, "s")
        summary = import_run_log(store, longer, "s")
        assert (summary.runs_created, summary.records_added, summary.records_skipped) == (0, 1, 2)
        assert store.records_frame("s")["val_reward"].tolist() == pytest.approx([0.1, 0.2, 0.3])


def test_jsonl_defaults_step_to_row_order_within_each_run():
    rows = read_run_log(DATA / "two_runs.jsonl")
    assert rows[["run", "step"]].values.tolist() == [["a", 0], ["a", 1], ["b", 0], ["a", 2]]
    assert rows["compute"].tolist() == [0.0, 0.5, 0.0, 1.0]
    assert rows["kl"].tolist()[:2] == [0.0, 0.01] and rows["kl"].isna().tolist()[2:] == [True, True]


def test_a_file_without_a_run_column_is_one_run_named_after_the_file(tmp_path):
    path = tmp_path / "cispo_seed0.csv"
    path.write_text("gpu_hours,reward\n0.5,0.2\n1.0,0.3\n")
    rows = read_run_log(path)
    assert rows["run"].tolist() == ["cispo_seed0"] * 2 and rows["step"].tolist() == [0, 1]


def test_reward_and_compute_name_the_columns_of_a_wandb_export(tmp_path):
    path = tmp_path / "wandb.csv"
    path.write_text(
        '"Name","_step","train/reward","reward","_runtime","gpu_hours"\n'
        '"run-a",0,0.1,9,0.0,5\n"run-b",0,0.2,9,0.0,5\n"run-a",4,0.3,9,180.0,5\n'
    )
    rows = read_run_log(path, tag="train/reward", compute_tag="_runtime")
    assert rows[["run", "step", "compute", "reward"]].values.tolist() == [
        ["run-a", 0, 0.0, 0.1], ["run-b", 0, 0.0, 0.2], ["run-a", 4, 180.0, 0.3],
    ]  # fmt: skip
    # the column named as compute is the unit every view labels it with, not GPU-hours
    assert rows.attrs["compute_unit"] == "_runtime"
    assert "compute_unit" not in read_run_log(path, tag="train/reward", compute_tag="gpu_hours").attrs
    jsonl = tmp_path / "log.jsonl"
    jsonl.write_text('{"Score": 0.1, "tokens_k": 1}\n{"score": 0.2, "tokens_k": 2}\n')
    assert read_run_log(jsonl, tag="score", compute_tag="tokens_k")["reward"].tolist() == [0.1, 0.2]
    with pytest.raises(UserError, match=r"wandb.csv:1: --reward: no column 'train/rew'; the file has name, _step"):
        read_run_log(path, tag="train/rew")


MALFORMED = [
    (
        "falls.csv",
        "run,step,compute,reward\na,0,0,0.1\nb,0,0,0.1\na,2,5,0.3\na,1,6,0.2\n",
        "falls.csv:4: column 'compute': run 'a': 5 at step 2 is below 6 at an earlier step; compute is cumulative",
    ),
    ("missing_reward.csv", "run,compute\na,1\n", "missing_reward.csv:1: missing column 'reward'"),
    ("missing_compute.csv", "run,reward\na,0.1\n", "missing_compute.csv:1: missing column 'compute' (or 'gpu_hours')"),
    (
        "text.csv",
        "run,compute,reward\na,1,0.1\na,2,high\n",
        "text.csv:3: column 'reward': expected a number, got 'high'",
    ),
    (
        "nan.csv",
        "run,compute,reward\na,1,0.1\na,2,nan\n",
        "nan.csv:3: column 'reward': expected a finite number, got 'nan'",
    ),
    ("inf.csv", "run,compute,reward\na,inf,0.1\n", "inf.csv:2: column 'compute': expected a finite number, got 'inf'"),
    ("empty.csv", "", "empty.csv:1: empty file"),
    ("header_only.csv", "run,compute,reward\n", "header_only.csv:1: no data rows"),
    (
        "dup.csv",
        "run,step,compute,reward\na,0,1,0.1\nb,0,1,0.1\na,0,2,0.2\n",
        "dup.csv:4: column 'step': run 'a' already has step 0 (line 2)",
    ),
    ("ragged.csv", "run,compute,reward\na,1\n", "ragged.csv:2: expected 3 fields like the header, got 2"),
    ("negative.csv", "run,compute,reward\na,-1,0.1\n", "negative.csv:2: column 'compute': expected a number >= 0"),
    (
        "halfstep.csv",
        "run,step,compute,reward\na,1.5,1,0.1\n",
        "halfstep.csv:2: column 'step': expected a whole number >= 0",
    ),
    (
        "blank_cell.csv",
        "run,compute,reward\na,,0.1\n",
        "blank_cell.csv:2: column 'compute': expected a value, got an empty cell",
    ),
    ("both.csv", "compute,gpu_hours,reward\n1,1,0.1\n", "both.csv:1: both 'compute' and 'gpu_hours' given"),
    (
        "bad.jsonl",
        '{"compute": 1, "reward": 0.1}\n{"compute": 2, "reward": NaN}\n',
        "bad.jsonl:2: column 'reward': expected a finite number, got 'nan'",
    ),
    ("broken.jsonl", '{"compute": 1, "reward": 0.1}\n{"compute": 2,\n', "broken.jsonl:2: column 15: not valid JSON"),
    (
        "missing_key.jsonl",
        '{"compute": 1, "reward": 0.1}\n{"reward": 0.2}\n',
        "missing_key.jsonl:2: column 'compute': missing",
    ),
    ("log.txt", "run,compute,reward\na,1,0.1\n", "log.txt: unknown file type '.txt': expected .csv or .jsonl"),
    # Python's own number syntax is no CSV number: float() reads "1_000" as 1000
    (
        "underscore.csv",
        "run,compute,reward\na,1,0.1\na,2,1_000\n",
        "underscore.csv:3: column 'reward': expected a number, got '1_000'",
    ),
    (
        "fullwidth.csv",
        "run,step,compute,reward\na,\uff11,1,0.1\n",
        "fullwidth.csv:2: column 'step': expected a number, got '\uff11'",
    ),
    (
        "superscript.csv",
        "run,step,compute,reward\na,\u00b2,1,0.1\n",
        "superscript.csv:2: column 'step': expected a number",
    ),
    (
        "second_line.jsonl",
        '{"gpu_hours": 1, "reward": 0.1}\n{"gpu_hours": 2, "compute": 2, "reward": 0.2}\n',
        "second_line.jsonl:2: column 'compute': earlier lines give 'gpu_hours': keep one compute column",
    ),
    (
        "switched.jsonl",
        '{"compute": 1, "reward": 0.1}\n{"gpu_hours": 2, "reward": 0.2}\n',
        "switched.jsonl:2: column 'gpu_hours': earlier lines give 'compute'",
    ),
    (
        "object_run.jsonl",
        '{"run": {"a": 1}, "compute": 1, "reward": 0.1}\n',
        "object_run.jsonl:1: column 'run': expected a run name (text), got",
    ),
]


@pytest.mark.parametrize("name,content,message", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_a_malformed_file_is_one_line_exit_2_and_stores_nothing(
    monkeypatch, capsys, tmp_path, db_url, name, content, message
):
    with Store(db_url) as store:
        store.import_runs("tracker", [("old", {"run": "old"}, [{"step": 0, "gpu_hours": 1.0, "val_reward": 0.1}])])
    path = tmp_path / name
    path.write_text(content)
    code, out, err = run_cli(monkeypatch, capsys, "import", str(path), "--study", "tracker", "--db", db_url)
    assert code == 2
    assert err.startswith(f"error: {tmp_path}/{message}") and err.count("\n") == 1
    with Store(db_url) as store:
        assert store.runs_frame("tracker")["run"].tolist() == ["old"] and len(store.records_frame("tracker")) == 1


def test_a_bad_file_does_not_create_the_default_store(monkeypatch, capsys, workdir):
    (workdir / "bad.csv").write_text("run,compute,reward\na,1,x\n")
    code, _, err = run_cli(monkeypatch, capsys, "import", "bad.csv", "--study", "s")
    assert code == 2 and err == "error: bad.csv:2: column 'reward': expected a number, got 'x'\n"
    assert not (workdir / "rlscale.db").exists()


def test_a_missing_file_names_it(monkeypatch, capsys, workdir):
    code, _, err = run_cli(monkeypatch, capsys, "import", "nowhere.csv", "--study", "s")
    assert code == 2 and err == "error: nowhere.csv: no such file\n"
    code, _, err = run_cli(monkeypatch, capsys, "import", "wandb/", "--reward", "r", "--gpus", "8", "--study", "s")
    assert code == 2 and err == "error: wandb: no such file\n"  # not a word on flags for a path that is not there


def test_the_installed_command_exits_2_with_one_line(workdir):
    (workdir / "bad.csv").write_text("run,compute,reward\na,1,0.1\na,2,high\n")
    result = subprocess.run(
        [str(Path(sys.executable).with_name("rlscale")), "import", "bad.csv", "--study", "s"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr == "error: bad.csv:3: column 'reward': expected a number, got 'high'\n"
    assert not (workdir / "rlscale.db").exists()


def test_a_run_imported_again_from_a_richer_read_of_its_log_is_the_same_run(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("run,prompts_per_batch,rollouts,step,gpu_hours,reward\na,16,4,0,0,0.1\na,16,4,1,1,0.2\n")
    url = f"sqlite:///{tmp_path / 's.db'}"
    plain = tmp_path / "plain.csv"  # the same log as an earlier read of it stored it: no geometry
    plain.write_text("run,step,gpu_hours,reward\na,0,0,0.1\n")
    with Store(url) as store:
        import_run_log(store, plain, "s")
        summary = import_run_log(store, path, "s")
        runs = store.runs_frame("s")
    assert (summary.runs_created, summary.records_added, summary.records_skipped) == (0, 1, 1)
    assert len(runs) == 1 and runs["config"].iloc[0]["rollouts"] == 4  # what the richer read says, kept


def test_a_wandb_history_export_skips_steps_that_logged_no_reward_and_names_its_own_columns(
    monkeypatch, capsys, workdir
):
    # W&B writes a row per logged step: the reward's cell is empty where that step logged other metrics only
    (workdir / "history.csv").write_text(
        "Name,_step,_runtime,train/reward,train/loss\n"
        "a,0,10,0.1,1.0\na,1,20,,0.9\na,2,30,0.3,0.8\n"
        "crashed,0,5,,1.2\n"
        "b,0,12,0.2,1.1\nb,1,24,0.4,1.0\n"
    )
    args = ("--reward", "train/reward", "--compute", "_runtime", "--study", "wb", "--json")
    code, out, err = run_cli(monkeypatch, capsys, "import", "history.csv", *args)
    assert code == 0, err
    summary = json.loads(out)
    assert (summary["records_added"], summary["runs_left_out"]) == (4, ["crashed"])
    # an error names the file's own column, not the name rlscale reads it by
    (workdir / "bad.csv").write_text("Name,_step,_runtime,train/reward\na,0,10,0.1\na,0,20,0.2\n")
    code, _, err = run_cli(monkeypatch, capsys, "import", "bad.csv", *args[:-3], "--study", "x")
    assert code == 2 and err == "error: bad.csv:3: column '_step': run 'a' already has step 0 (line 2)\n"
    (workdir / "bad.csv").write_text("Name,_runtime,train/reward\na,10,0.1\na,20,high\n")
    code, _, err = run_cli(monkeypatch, capsys, "import", "bad.csv", *args[:-3], "--study", "x")
    assert code == 2 and err == "error: bad.csv:3: column 'train/reward': expected a number, got 'high'\n"
    (workdir / "none.csv").write_text("Name,_runtime,train/reward\na,10,\n")
    code, _, err = run_cli(monkeypatch, capsys, "import", "none.csv", *args[:-3], "--study", "x")
    assert code == 2 and err == "error: none.csv: column 'train/reward': no step with a reward\n"


def test_status_labels_an_imported_axis_and_a_study_keeps_one_compute_unit(monkeypatch, capsys, workdir):
    (workdir / "history.csv").write_text("Name,_runtime,train/reward\na,10,0.1\na,20,0.2\n")
    args = ("--reward", "train/reward", "--compute", "_runtime", "--study", "wb")
    assert run_cli(monkeypatch, capsys, "import", "history.csv", *args)[0] == 0
    code, out, err = run_cli(monkeypatch, capsys, "status", "wb", "--json")
    assert code == 0 and [row["compute_unit"] for row in json.loads(out)] == ["_runtime"], err
    code, out, _ = run_cli(monkeypatch, capsys, "status", "wb")
    assert "compute: _runtime" in out and "GPU-hours" not in out
    # a log in GPU-hours would share one axis with seconds: refused, nothing stored
    (workdir / "sweep.csv").write_text("run,gpu_hours,reward\nb,1,0.1\nb,2,0.2\n")
    code, _, err = run_cli(monkeypatch, capsys, "import", "sweep.csv", "--study", "wb")
    assert code == 2 and err == (
        "error: sweep.csv: compute here is gpu_hours, study 'wb' counts _runtime: import into another study, "
        "or name a matching --compute\n"
    )
    with Store("sqlite:///rlscale.db") as store:
        assert list(store.runs_frame("wb")["run"]) == ["a"]
