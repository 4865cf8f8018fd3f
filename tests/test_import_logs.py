"""`rlscale import` of training logs: TensorBoard event directories (written here with tensorboard's own writer)
and verl's file-logger JSONL; bad logs are refused whole with a one-line error."""

import json

import pytest
from helpers import REWARD, run_cli, write_events
from rlscale.db.store import Store


def verl_steps(n_steps=20, every=5, *, tokens=7200.0, throughput=1.0, reward=lambda s: 0.2 + 0.01 * s):
    """What verl logs: validation at step 0 (before training), then each step's perf and health metrics,
    with validation every `every` steps. GPU-seconds per step = tokens / throughput."""
    steps = {0: {REWARD: reward(0)}}
    for step in range(1, n_steps + 1):
        steps[step] = {
            "perf/total_num_tokens": tokens,
            "perf/throughput": throughput,
            "perf/time_per_step": 3.0,
            "actor/entropy": 1.0 - step / 100,
            "critic/score/mean": 0.3,
        }
        if step % every == 0:
            steps[step][REWARD] = reward(step)
    return steps


def test_tensorboard_directory_one_run_per_subdirectory(monkeypatch, capsys, tmp_path, db_url):
    write_events((tmp_path / "tb" / "grpo").resolve(), verl_steps())
    write_events((tmp_path / "tb" / "ppo").resolve(), verl_steps(throughput=2.0, reward=lambda s: 0.1 + 0.02 * s))
    code, out, err = run_cli(monkeypatch, capsys, "import", str(tmp_path / "tb"), "--study", "tb", "--db", db_url)
    assert (code, err) == (0, "")
    assert "2 runs (2 new), 10 records added" in out and "compute: GPU-hours" in out
    with Store(db_url) as store:
        records = store.records_frame("tb")
        runs = store.runs_frame("tb")
    assert sorted(runs["run"]) == ["grpo", "ppo"]
    grpo = records[records["run"] == "grpo"]
    assert grpo["step"].tolist() == [0, 5, 10, 15, 20]
    # 7200 tokens at 1 token/s/GPU = 7200 GPU-seconds = 2 GPU-hours per step
    assert grpo["gpu_hours"].tolist() == pytest.approx([0.0, 10.0, 20.0, 30.0, 40.0])
    assert grpo["val_reward"].tolist() == pytest.approx([0.2, 0.25, 0.3, 0.35, 0.4])
    assert grpo["entropy"].tolist()[1:] == pytest.approx([0.95, 0.9, 0.85, 0.8])
    ppo = records[records["run"] == "ppo"]
    assert ppo["gpu_hours"].tolist() == pytest.approx([0.0, 5.0, 10.0, 15.0, 20.0])
    assert all(config.get("compute_unit") == "gpu_hours" for config in runs["config"])


def test_a_run_that_crashed_before_its_first_validation_is_left_out_and_named(monkeypatch, capsys, tmp_path, db_url):
    write_events((tmp_path / "tb" / "grpo").resolve(), verl_steps())
    crashed = {step: logged for step, logged in verl_steps(4).items() if REWARD not in logged}
    write_events((tmp_path / "tb" / "crashed").resolve(), crashed)
    code, out, err = run_cli(monkeypatch, capsys, "import", str(tmp_path / "tb"), "--study", "tb", "--db", db_url)
    assert (code, err) == (0, "")
    assert "1 runs (1 new), 5 records added" in out and f"reward: {REWARD}" in out
    assert f"left out, no '{REWARD}' logged: crashed" in " ".join(out.split())
    with Store(db_url) as store:
        assert list(store.runs_frame("tb")["run"]) == ["grpo"]


def test_torch_summary_writer_logs_as_verl_writes_them(tmp_path):
    # verl's TensorBoard backend is torch's SummaryWriter.add_scalar(key, value, step)
    tensorboard = pytest.importorskip("torch.utils.tensorboard")
    from rlscale.db.importer import read_run_log

    writer = tensorboard.SummaryWriter(str(tmp_path / "tb" / "run1"))
    for step, scalars in verl_steps(10).items():
        for key, value in scalars.items():
            writer.add_scalar(key, value, step)
    writer.close()
    rows = read_run_log(tmp_path / "tb")
    assert rows["run"].unique().tolist() == ["run1"] and rows["step"].tolist() == [0, 5, 10]
    assert rows["reward"].tolist() == pytest.approx([0.2, 0.25, 0.3])
    assert rows.attrs["compute_unit"] == "gpu_hours"


def test_tag_and_compute_tag_choose_the_scalars(tmp_path):
    from rlscale.db.importer import read_run_log

    steps = {s: {"eval/pass_rate": 0.1 * s, "gpu_hours_total": 0.5 * s, "val-core/a/acc/mean@4": 0.3} for s in range(4)}
    write_events(tmp_path / "tb", steps)
    rows = read_run_log(tmp_path / "tb", tag="eval/pass_rate", compute_tag="gpu_hours_total")
    assert rows["run"].tolist() == ["tb"] * 4  # events directly in the directory: one run named after it
    assert rows["reward"].tolist() == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert rows["compute"].tolist() == pytest.approx([0.0, 0.5, 1.0, 1.5])
    assert rows.attrs["compute_unit"] == "gpu_hours_total"
    default = read_run_log(tmp_path / "tb")  # verl's core metric, any variable name; no perf: steps
    assert default["reward"].tolist() == pytest.approx([0.3] * 4)
    assert default.attrs["compute_unit"] == "steps" and default["compute"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_nested_run_directories_are_named_by_their_path(tmp_path):
    from rlscale.db.importer import read_run_log

    # verl's default: tensorboard_log/<project>/<experiment>; the name is the path as TensorBoard shows it
    write_events(tmp_path / "tensorboard_log" / "gsm8k" / "qwen-grpo (clip 0.2)", {0: {REWARD: 0.1}})
    write_events(tmp_path / "tensorboard_log" / "gsm8k" / "lr=1e-6,bs=256", {0: {REWARD: 0.2}})
    rows = read_run_log(tmp_path / "tensorboard_log")
    assert sorted(rows["run"]) == ["gsm8k/lr=1e-6,bs=256", "gsm8k/qwen-grpo (clip 0.2)"]


def test_a_resumed_run_keeps_the_later_file_for_repeated_steps(tmp_path):
    from rlscale.db.importer import read_run_log

    run = tmp_path / "tb" / "r"
    write_events(run, {s: {REWARD: 0.1} for s in range(4)}, suffix=".1")
    write_events(run, {s: {REWARD: 0.5} for s in range(2, 6)}, suffix=".2")  # restarted from the step-2 checkpoint
    rows = read_run_log(tmp_path / "tb")
    assert rows["step"].tolist() == list(range(6))
    assert rows["reward"].tolist() == pytest.approx([0.1, 0.1, 0.5, 0.5, 0.5, 0.5])


def write_verl_jsonl(path, steps: dict[int, dict]):
    # verl.utils.tracking.FileLogger: orjson.dumps({"step": step, "data": data}) per line (NaN written as null)
    path.write_text("".join(json.dumps({"step": s, "data": d}) + "\n" for s, d in steps.items()))
    return path


def test_verl_file_logger_jsonl(monkeypatch, capsys, tmp_path, db_url):
    steps = verl_steps(10)
    steps[5]["actor/entropy"] = None  # a NaN health metric: left out, not an error
    path = write_verl_jsonl(tmp_path / "qwen_grpo.jsonl", steps)
    with path.open("a") as handle:  # a step's validation logged on a line of its own merges with its training line
        handle.write(json.dumps({"step": 11, "data": {"perf/total_num_tokens": 7200, "perf/throughput": 1.0}}) + "\n")
        handle.write(json.dumps({"step": 11, "data": {REWARD: 0.33}}) + "\n")
    code, out, err = run_cli(monkeypatch, capsys, "import", str(path), "--study", "v", "--db", db_url, "--json")
    assert (code, err) == (0, "")
    summary = json.loads(out)
    assert (summary["runs"], summary["records_added"], summary["compute_unit"]) == (1, 4, "gpu_hours")
    with Store(db_url) as store:
        records = store.records_frame("v")
    assert records["run"].unique().tolist() == ["qwen_grpo"]
    assert records["step"].tolist() == [0, 5, 10, 11]
    assert records["gpu_hours"].tolist() == pytest.approx([0.0, 10.0, 20.0, 22.0])
    assert records["val_reward"].tolist() == pytest.approx([0.2, 0.25, 0.3, 0.33])
    assert records["train_reward"].tolist()[1:3] == pytest.approx([0.3, 0.3])  # verl's critic/score/mean
    assert records["entropy"].isna().tolist() == [True, True, False, True]


def test_backtest_reads_a_tensorboard_directory(cli, tmp_path):
    from rlscale.fitting.sigmoid import sigmoid

    steps = verl_steps(100, 2, reward=lambda s: float(sigmoid(s, 0.8, 1.5, 30.0, 0.1)))
    write_events(tmp_path / "tb" / "run", steps)
    code, out, err = cli("backtest", str(tmp_path / "tb"), "--json", "--bootstrap", "50")
    assert (code, err) == (0, "")
    payload = json.loads(out)
    assert payload["compute_unit"] == "gpu_hours" and payload["runs"][0]["fitted"]
    assert abs(payload["runs"][0]["error"]) < 0.01


def corrupt_event_file(tmp_path):
    file = write_events(tmp_path / "bad" / "r", {s: {REWARD: 0.1 * s} for s in range(5)})
    data = bytearray(file.read_bytes())
    data[-30] ^= 0xFF  # a flipped byte in the last record fails its CRC
    file.write_bytes(bytes(data))
    return tmp_path / "bad", f"{file}: truncated or corrupt event record at byte"


def truncated_event_file(tmp_path):
    file = write_events(tmp_path / "cut" / "r", {s: {REWARD: 0.1 * s} for s in range(5)})
    file.write_bytes(file.read_bytes()[:-7])
    return tmp_path / "cut", f"{file}: truncated or corrupt event record at byte"


def no_reward_tag(tmp_path):
    write_events(tmp_path / "tb" / "r", {s: {"train/loss": 1.0} for s in range(3)})
    return tmp_path / "tb", f"{tmp_path / 'tb'}: run 'r' has no verl validation reward"


def two_sources(tmp_path):
    write_events(tmp_path / "tb" / "r", {0: {"val-core/a/reward/mean@1": 0.1, "val-core/b/reward/mean@1": 0.2}})
    return (
        tmp_path / "tb",
        "several validation rewards (val-core/a/reward/mean@1, val-core/b/reward/mean@1): pick one with --reward",
    )


def nan_reward_in_tb(tmp_path):
    file = write_events(tmp_path / "tb" / "r", {0: {REWARD: 0.1}, 1: {REWARD: float("nan")}})
    return tmp_path / "tb", f"{file}: step 1: tag '{REWARD}': expected a finite number, got nan"


def empty_directory(tmp_path):
    (tmp_path / "empty").mkdir()
    return tmp_path / "empty", f"{tmp_path / 'empty'}: no TensorBoard event files"


def bad_run_name(tmp_path):
    write_events(tmp_path / "tb" / "run\x1b[2J1", {0: {REWARD: 0.1}})  # a directory name that clears the screen
    return tmp_path / "tb", "the directory gives the run name: expected a run name of printable text"


def jsonl(name, lines):
    def make(tmp_path):
        path = tmp_path / "log.jsonl"
        path.write_text("".join(line + "\n" for line in lines))
        return path, f"{path}:{name}"

    return make


MALFORMED = {
    "corrupt event file": corrupt_event_file,
    "truncated event file": truncated_event_file,
    "no reward tag": no_reward_tag,
    "two validation sources": two_sources,
    "nan reward in tensorboard": nan_reward_in_tb,
    "empty directory": empty_directory,
    "bad run name": bad_run_name,
    "key twice": jsonl(
        f"2: column '{REWARD}': key appears twice in one object",
        [
            json.dumps({"step": 0, "data": {REWARD: 0.1}}),
            f'{{"step": 1, "data": {{"{REWARD}": 0.1, "{REWARD}": 0.2}}}}',
        ],
    ),
    "null reward": jsonl(
        f"2: column '{REWARD}': expected a number, got null",
        [json.dumps({"step": 0, "data": {REWARD: 0.1}}), json.dumps({"step": 1, "data": {REWARD: None}})],
    ),
    "text reward": jsonl(
        f"2: column '{REWARD}': expected a number, got 'high'",
        [json.dumps({"step": 0, "data": {REWARD: 0.1}}), json.dumps({"step": 1, "data": {REWARD: "high"}})],
    ),
    "broken json": jsonl(
        "2: column 22: not valid JSON", [json.dumps({"step": 0, "data": {REWARD: 0.1}}), '{"step": 1, "data": {']
    ),
    "negative step": jsonl(
        "2: column 'step': expected a whole number >= 0, got -1",
        [json.dumps({"step": 0, "data": {REWARD: 0.1}}), json.dumps({"step": -1, "data": {REWARD: 0.2}})],
    ),
    "not a verl line": jsonl(
        "2: expected a verl file-logger line",
        [json.dumps({"step": 0, "data": {REWARD: 0.1}}), json.dumps({"step": 1, "metrics": {}})],
    ),
    "conflicting duplicate": jsonl(
        f"2: column '{REWARD}': step 0 already has 0.1",
        [json.dumps({"step": 0, "data": {REWARD: 0.1}}), json.dumps({"step": 0, "data": {REWARD: 0.2}})],
    ),
    "zero throughput": jsonl(
        "3: column 'perf/throughput': expected a throughput > 0",
        [
            json.dumps({"step": 0, "data": {REWARD: 0.1}}),
            json.dumps({"step": 1, "data": {"perf/total_num_tokens": 10, "perf/throughput": 1.0}}),
            json.dumps({"step": 2, "data": {"perf/total_num_tokens": 10, "perf/throughput": 0, REWARD: 0.2}}),
        ],
    ),
}


@pytest.mark.parametrize("make", MALFORMED.values(), ids=list(MALFORMED))
def test_a_malformed_log_is_one_line_exit_2_and_stores_nothing(monkeypatch, capsys, tmp_path, db_url, make):
    with Store(db_url) as store:
        store.import_runs("logs", [("old", {"run": "old"}, [{"step": 0, "gpu_hours": 1.0, "val_reward": 0.1}])])
    path, message = make(tmp_path)
    code, out, err = run_cli(monkeypatch, capsys, "import", str(path), "--study", "logs", "--db", db_url)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    with Store(db_url) as store:
        assert store.runs_frame("logs")["run"].tolist() == ["old"] and len(store.records_frame("logs")) == 1


def test_a_tag_option_on_a_csv_names_a_column_and_one_it_lacks_is_refused(monkeypatch, capsys, tmp_path):
    path = tmp_path / "log.csv"
    path.write_text("compute,reward\n1,0.1\n")
    code, _, err = run_cli(
        monkeypatch, capsys, "import", str(path), "--study", "s", "--tag", "x", "--db", f"sqlite:///{tmp_path / 's.db'}"
    )
    assert (code, err) == (2, f"error: {path}:1: --reward: no column 'x'; the file has compute, reward\n")
    assert not (tmp_path / "s.db").exists()


def test_a_plain_jsonl_tracker_export_is_still_read_as_columns(tmp_path):
    from rlscale.db.importer import read_run_log

    path = tmp_path / "export.jsonl"
    path.write_text('{"step": 0, "compute": 0.5, "reward": 0.2}\n')
    rows = read_run_log(path)
    assert rows["compute"].tolist() == [0.5] and "compute_unit" not in rows.attrs


def test_fit_and_backtest_take_the_metric_options_their_errors_name(cli, tmp_path):
    from rlscale.fitting.sigmoid import sigmoid

    steps = verl_steps(100, 2, reward=lambda s: float(sigmoid(s, 0.8, 1.5, 30.0, 0.1)))
    for step in steps:
        if REWARD in steps[step]:
            steps[step]["val-core/other/reward/mean@1"] = steps[step][REWARD] / 2
    path = write_verl_jsonl(tmp_path / "two.jsonl", steps)
    code, _, err = cli("fit", str(path))
    assert code == 2 and "pick one with --reward" in err
    for command, extra in (("fit", ()), ("backtest", ("--bootstrap", "20"))):
        code, out, err = cli(command, str(path), "--tag", "val-core/other/reward/mean@1", "--json", *extra)
        assert (code, err) == (0, ""), command
    (fit,) = json.loads(cli("fit", str(path), "--reward", REWARD, "--json")[1])
    assert fit["A"] == pytest.approx(0.8, abs=0.02)
    code, _, err = cli("fit", "--study", "s", "--tag", REWARD)
    assert code == 2 and "--reward names a metric of a run-log FILE" in err


def test_an_imported_studys_decision_is_in_the_unit_its_logs_name(tmp_path):
    from rlscale.db.importer import import_run_log, read_run_log
    from rlscale.fitting.stored import study_decision, study_fits

    steps = {s: {"eval/pass_rate": 0.1 + 0.005 * s, "tokens_seen": 1000.0 * s} for s in range(0, 60, 2)}
    write_events(tmp_path / "tb" / "run", steps)
    rows = read_run_log(tmp_path / "tb", tag="eval/pass_rate", compute_tag="tokens_seen")
    with Store(f"sqlite:///{tmp_path / 's.db'}") as store:
        import_run_log(store, tmp_path / "tb", "t", rows)
        assert study_fits(store, "t").unit == "tokens_seen"
        assert study_decision(store, "t").unit == "tokens_seen"
