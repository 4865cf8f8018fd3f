"""The verl engine's data, reward function, config and log ingestion, read by verl 0.9.1 itself (in .venv-verl,
scripts/checker_envs.sh; tests/checkers/verl_engine_check.py), and its records in the store exactly once.

The dataset is loaded with the tiny policy's tokenizer (rlscale.runner.rl.policy.build_tokenizer, saved here)."""

import json
import math
import subprocess
from pathlib import Path

import pytest
from helpers import python_of
from rlscale.db.logs import VERL_HEALTH
from rlscale.db.store import Store
from rlscale.planner.recipe import Recipe
from rlscale.runner.jobs_api import LogTail, RecordMaker, RunDir
from rlscale.runner.verl.data import DATA_SOURCE, task_rows, write_task_parquet
from rlscale.runner.verl.engine import VerlEngine, stage_reward_modules
from rlscale.runner.verl.job import val_reward_metric
from rlscale.runner.verl.logs import line_reader

ROOT = Path(__file__).resolve().parents[1]
CHECKER = ROOT / "tests" / "checkers" / "verl_engine_check.py"
RECIPE = Recipe(
    engine="verl",
    model="/models/Qwen3-0.6B",
    task="arithmetic",
    prompts_per_batch=4,
    rollouts=2,
    steps=40,
    eval_every=5,
    eval_prompts=6,
    eval_samples=2,
    checkpoint_every=10,
    temperature=0.9,
    trainer_devices=2,
    generator_devices=2,
    kl_coef=0.001,
)
# (metric the store keeps, verl's name) for the actor metrics verl's workers log each step
ACTOR = {"entropy": 1.3, "grad_norm": 0.7, "clip_fraction": 0.05, "kl": 0.002}


def steps_spec(path: Path, steps: range, *, first_val: bool = True) -> dict:
    """What the checker's FileLogger writes: a validation at step 0 and every 5 steps, training metrics otherwise."""
    rows = []
    for step in steps:
        row = {"step": step}
        if step > 0:
            row.update(
                scores=[1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0][: 8 - step % 3],
                response_lengths=[3, 5, 7, 16, 2, 4, 16, 1][: 8 - step % 3],
                timing={"step": 10.0 + step, "gen": 4.0},
                actor={VERL_HEALTH[name]: value for name, value in ACTOR.items()},
            )
        if step % 5 == 0 and (step > 0 or first_val):
            row["val_scores"] = [1.0, 0.0] * 3 + [1.0, 1.0] * 3  # 6 prompts x 2 samples: mean 0.75
        rows.append(row)
    return {"path": str(path), "steps": rows, "max_response_length": 16, "val_samples": 2, "data_source": DATA_SOURCE}


@pytest.fixture(scope="module")
def verl_check(tmp_path_factory):
    """The checker's results for RECIPE's first job, and the paths it used."""
    from rlscale.runner.rl.policy import build_tokenizer

    tmp = tmp_path_factory.mktemp("verl_engine")
    engine = VerlEngine(shared_dir=tmp / "shared")
    run_dir = RunDir(tmp / "shared" / "study-1-abc")
    job = engine.verl_job(RECIPE, run_dir, "study-1-abc-1", until_step=10)
    write_task_parquet(RECIPE, run_dir.data)
    stage_reward_modules(run_dir.modules)
    tokenizer = tmp / "tokenizer"
    build_tokenizer().save_pretrained(tokenizer)
    cases = [
        {
            "data_source": DATA_SOURCE,
            "solution_str": solution,
            "ground_truth": "42",
            "extra_info": {"verifier": "exact_match"},
        }
        for solution in ("42", " 42\n", "43", "4 2")
    ]
    cases += [
        {
            "data_source": DATA_SOURCE,
            "solution_str": solution,
            "ground_truth": "1234",
            "extra_info": {"verifier": "math_match"},
        }
        for solution in ("so \\boxed{1,234}", "1234.0", "\\boxed{12}")
    ]
    spec = {
        "overrides": job.overrides,
        "modules": str(run_dir.modules.parent),
        "tokenizer": str(tokenizer),
        "reward_cases": cases,
        "logger": steps_spec(tmp / "verl.jsonl", range(0, 21)),
    }
    out = tmp / "result.json"
    done = subprocess.run(
        [str(python_of(".venv-verl")), str(CHECKER), str(out)],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp,
    )
    assert done.returncode == 0 and out.exists(), done.stderr[-3000:]
    result = json.loads(out.read_text())
    errors = {key: value for key, value in result.items() if key.endswith("_error")}
    assert not errors, errors
    assert result["version"] == "0.9.1"
    return result, job, run_dir, tmp / "verl.jsonl"


def test_verl_composes_and_validates_the_jobs_config(verl_check):
    config = verl_check[0]["config"]
    job, run_dir = verl_check[1], verl_check[2]
    assert config["model_path"] == RECIPE.model
    assert (config["train_files"], config["val_files"]) == (str(job.train_file), str(job.val_file))
    assert (config["reward_path"], config["reward_name"]) == ("pkg://rlscale.runner.verl.reward", "compute_score")
    # validation is rlscale's val reward: eval_samples samples per prompt at the training temperature, step 0 too
    assert (config["val_n"], config["val_temperature"], config["val_do_sample"]) == (2, 0.9, True)
    assert config["temperature"] == 0.9 and config["test_freq"] == 5 and config["val_before_train"] is True
    # a rung pauses the run: the job ends, checkpointed, at until_step and resumes from the run's own directory
    assert config["total_training_steps"] == 10 and config["save_freq"] == 10
    assert config["resume_mode"] == "auto" and config["default_local_dir"] == str(run_dir.checkpoints)
    assert "file" in config["logger"] and job.env_vars["VERL_FILE_LOGGER_PATH"] == str(job.log_file)
    # devices: 2 trainer GPUs, and (async: pipeline) 2 generator GPUs of its own; the job holds 4
    assert (config["nnodes"], config["n_gpus_per_node"], config["rollout_n_gpus_per_node"]) == (1, 2, 2)
    assert job.gpus == 4
    assert (config["train_batch_size"], config["n"]) == (4, 2)


def test_verls_dataset_class_reads_the_parquet_files(verl_check):
    dataset = verl_check[0]["dataset"]
    train_rows, val_rows = task_rows(RECIPE, "train"), task_rows(RECIPE, "test")
    assert dataset["train"]["len"] == len(train_rows) and dataset["val"]["len"] == RECIPE.eval_prompts == len(val_rows)
    for split, rows in (("train", train_rows), ("val", val_rows)):
        got = dataset[split]
        assert got["raw_prompt"] == rows[0]["prompt"] and got["data_source"] == DATA_SOURCE
        assert got["ground_truth"] == rows[0]["reward_model"]["ground_truth"]
        assert got["extra_info"]["verifier"] == "exact_match"


def test_verls_reward_loader_finds_rlscales_verifier(verl_check):
    # exact_match strips whitespace; math_match reads the last \boxed{}, drops thousands commas, compares numbers
    assert verl_check[0]["rewards"] == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0]


def ingest(store: Store, run_id: int, path: Path, cut: int | None = None) -> None:
    """What the engine does with a job's log: read whole lines from the byte offset, make records, store them."""
    maker, tail = RecordMaker(line_reader(val_reward_metric(RECIPE)), RECIPE.total_batch), LogTail(path)
    if cut is None:
        records = maker.records(tail.read(), job="study-1-abc-1", devices=4, base_device_seconds=0.0)
        store.add_records(run_id, records)
        return
    partial = path.with_name("partial.jsonl")
    data = path.read_bytes()
    partial.write_bytes(data[:cut])  # the job has written part of a line so far
    tail.path = partial
    records = maker.records(tail.read(), job="study-1-abc-1", devices=4, base_device_seconds=0.0)
    store.add_records(run_id, records)
    assert tail.offset < cut  # the half-written line waits
    partial.write_bytes(data)
    records = maker.records(tail.read(), job="study-1-abc-1", devices=4, base_device_seconds=0.0)
    store.add_records(run_id, records)


def test_file_logger_lines_land_in_the_store_once_across_a_driver_restart(verl_check, tmp_path):
    path = verl_check[3]
    lines = path.read_bytes().splitlines(keepends=True)
    cut = sum(map(len, lines[:8])) + len(lines[8]) // 2  # mid-way through step 8's line
    store = Store(f"sqlite:///{tmp_path / 'a.db'}")
    store.upsert_study("s", {})
    run_id = store.ensure_run("s", "r", RECIPE.to_json())
    ingest(store, run_id, path, cut=cut)  # the first driver, killed after reading past the cut
    ingest(store, run_id, path)  # a restarted driver reads the file again from the start
    frame = store.records_frame("s")
    assert list(frame["step"]) == list(range(21))  # every step once
    reference = Store(f"sqlite:///{tmp_path / 'b.db'}")
    reference.upsert_study("s", {})
    ingest(reference, reference.ensure_run("s", "r", RECIPE.to_json()), path)
    other = reference.records_frame("s")
    for column in ("gpu_hours", "rollouts", "tokens", "val_reward", *ACTOR, "truncation_rate", "train_reward"):
        assert frame[column].equals(other[column]), column
    # val reward: verl 0.9.1 files a float score as acc (val-core) and reward (val-aux/rlscale/reward/mean@2), over
    # 6 prompts x 2 samples at steps 0, 5, ...
    assert frame.loc[frame["step"] % 5 == 0, "val_reward"].tolist() == [0.75] * 5
    assert frame.loc[frame["step"] % 5 != 0, "val_reward"].isna().all()
    # GPU-hours: 4 GPUs x verl's timing_s/step summed; rollouts B_p x n x step; tokens: response_length/mean x B_p x n
    row = frame.set_index("step").loc[3]
    assert math.isclose(row["gpu_hours"], 4 * (11 + 12 + 13) / 3600)
    assert row["rollouts"] == 3 * 8
    means = {
        1: sum([3, 5, 7, 16, 2, 4, 16][:7]) / 7,
        2: sum([3, 5, 7, 16, 2, 4]) / 6,
        3: sum([3, 5, 7, 16, 2, 4, 16, 1]) / 8,
    }
    assert row["tokens"] == round(sum(means.values()) * 8)
    # health: verl's own metric names; truncation = responses at max_response_length (step 3: 2 of 8)
    assert math.isclose(row["truncation_rate"], 2 / 8) and row["entropy"] == ACTOR["entropy"]
    assert math.isclose(row["train_reward"], 4 / 8)


def test_plan_and_dry_run_accept_the_verl_study_and_submit_nothing(cli, workdir, tmp_path):
    study = ROOT / "studies" / "verl_gsm8k.yaml"
    code, out, err = cli("plan", str(study), "--json")
    assert code == 0, err
    url = f"sqlite:///{tmp_path / 'never.db'}"
    code, out, err = cli(
        "sweep",
        str(study),
        "--dry-run",
        "--json",
        "--db",
        url,
        "--shared-dir",
        "/nfs/rl",
        "--ray-address",
        "http://head:8265",
    )
    assert code == 0, err
    points = json.loads(out)
    assert len(points) == len(json.loads(cli("plan", str(study), "--json")[1])["runs"]) == 6
    first = points[0]
    assert first["engine"] == "verl" and first["entrypoint"] == "python3 -m verl.trainer.main_ppo"
    assert first["train_file"] == "/nfs/rl/RUN_KEY/data/train.parquet" and first["gpus"] == 8
    assert "reward.custom_reward_function.path='pkg://rlscale.runner.verl.reward'" in first["overrides"]
    assert "trainer.logger=[console,file]" in first["overrides"]
    assert not (tmp_path / "never.db").exists()  # nothing stored, nothing submitted
    assert not Path("/nfs/rl").exists()


def test_a_verl_study_with_early_evaluations_is_refused_in_one_line(cli, tmp_path):
    # verl's trainer.test_freq cannot express log-spaced early evaluations: refused before anything is submitted
    study = tmp_path / "early.yaml"
    study.write_text(
        (ROOT / "studies" / "verl_gsm8k.yaml")
        .read_text()
        .replace("recipe:\n", "recipe:\n  eval_early_per_decade: 4\n", 1)
    )
    code, out, err = cli(
        "sweep",
        str(study),
        "--dry-run",
        "--db",
        f"sqlite:///{tmp_path / 'never.db'}",
        "--shared-dir",
        "/nfs/rl",
        "--ray-address",
        "http://head:8265",
    )
    assert code == 2 and "eval_early_per_decade" in err and "test_freq" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "never.db").exists()
