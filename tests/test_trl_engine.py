"""The trl engine: real TRL 1.16.0 GRPOTrainer jobs on the tiny policy, submitted through the Jobs API of a real
local Ray head (tests/test_verl_jobs.py's `cluster`): a job killed mid-run and retried from TRL's checkpoint, a run
paused at a rung, a run that ends at its planned compute (a driver killed with -9 is tests/test_setup_trl.py's). Also:
the dry-run prints the GRPOConfig the export prints, and bad input exits 2 with nothing stored."""

import os
import signal
import sys
import threading
from pathlib import Path

import pytest
import yaml
from rlscale.db.store import Store
from rlscale.planner.recipe import Recipe

TESTS = Path(__file__).resolve().parent
# sync, one update per batch, group normalisation, token aggregation, clip 0.2/0.28: what TRL expresses exactly
RECIPE = dict(
    engine="trl",
    model="tiny",
    task="arithmetic",
    prompts_per_batch=4,
    rollouts=4,
    steps=8,
    loss="dapo",
    loss_agg="token",
    adv_norm="group",
    zero_variance_filter=False,
    no_positive_resampling=None,
    length_control="truncate",
    max_new_tokens=8,
    lr=1e-4,
    lr_reference_batch=16,
    lr_warmup_steps=0,
    eval_every=4,
    eval_prompts=16,
    eval_samples=2,
    checkpoint_every=2,
    trainer_devices=1,
)
RECIPE["async"] = "sync"


def trl_engine(cluster, tmp_path):
    from rlscale.runner.trl.engine import TrlEngine

    return TrlEngine(ray_address=cluster, shared_dir=tmp_path / "shared", poll_seconds=0.2)


def write_study(path: Path, name: str, parameters: dict, **recipe) -> Path:
    """A grid study over `parameters` of RECIPE with `recipe` changes."""
    keys = {**RECIPE, **recipe}
    spec = {
        "name": name,
        "method": "grid",
        "recipe": keys,
        "parameters": {key: {"values": values} for key, values in parameters.items()},
    }
    path.write_text(yaml.safe_dump(spec))
    return path


# ------------------------------------------------------------------------------------------ no Ray, no training


def test_dry_run_prints_the_grpo_config_that_the_export_prints(cli, tmp_path, monkeypatch):
    if "vllm" not in sys.modules:  # TRL imports an installed vLLM (slow) that a GRPOConfig does not need
        monkeypatch.setitem(sys.modules, "vllm", None)
    pytest.importorskip("trl")
    import trl

    changes = {"loss": "cispo", "zero_variance_filter": True}  # TRL keeps all-pass/all-fail groups: a note
    study = write_study(tmp_path / "dry.yaml", "dry", {"rollouts": [4]}, **changes)
    code, out, err = cli("sweep", study, "--dry-run", "--db", f"sqlite:///{tmp_path / 'x.db'}")
    assert code == 0, err
    recipe_file = tmp_path / "recipe.yaml"
    recipe_file.write_text(yaml.safe_dump({**RECIPE, **changes, "rollouts": 4}))
    code, exported, err = cli("export", "--format", "trl", "--recipe", recipe_file)
    assert code == 0, err

    def recipe_part(text: str) -> list[str]:  # the lr note, the notes and the recipe's keys (not the header/layout)
        lines = [line.strip() for line in text.splitlines()]
        start = next(i for i, line in enumerate(lines) if line.startswith("# lr "))
        end = next(i for i, line in enumerate(lines) if line.startswith("# deployment choices"))
        return lines[start:end]

    assert recipe_part(out) == recipe_part(exported)
    assert "loss_type: cispo" in recipe_part(out) and "# not expressible:" in recipe_part(out)
    assert not (tmp_path / "x.db").exists()
    # the job's own config is one TRL builds: one generation batch of B_p x n per update, on CPU without vLLM
    code, out, err = cli("sweep", study, "--dry-run", "--json")
    point = yaml.safe_load(out)[0]
    config = trl.GRPOConfig(**point["config"])
    assert config.generation_batch_size == 4 * 4 and config.num_generations == 4 and not config.use_vllm
    assert config.loss_type == "cispo" and config.epsilon_high == 5.0 and config.output_dir.endswith("checkpoints")
    assert point["submission_id"] == "RUN_KEY-1" and point["devices"] == [{"CPU": 1.0}]


def test_bad_input_exits_2_naming_the_field_or_package_and_stores_nothing(cli, tmp_path, monkeypatch):
    db = tmp_path / "store.db"
    lower = write_study(tmp_path / "lower.yaml", "lower", {"rollouts": [4]}, loss="cispo", clip_low=0.2)
    code, out, err = cli("sweep", lower, "--db", f"sqlite:///{db}")
    assert code == 2 and "clip_low" in err and "CISPO" in err and len(err.strip().splitlines()) == 1
    plain = write_study(tmp_path / "plain.yaml", "plain", {"rollouts": [4]})
    monkeypatch.setitem(sys.modules, "trl", None)  # as if TRL were not installed
    code, out, err = cli("sweep", plain, "--db", f"sqlite:///{db}")
    assert code == 2 and "trl==1.16.0" in err and len(err.strip().splitlines()) == 1
    assert not db.exists() or not Store(f"sqlite:///{db}").study_names()


# ------------------------------------------------------------------------------------------ real TRL jobs on Ray


def _kill_job(tmp_path: Path, submission_id: str) -> None:
    """kill -9 the job's python process (its command line ends with its spec file; not Ray's shell around it)."""
    import psutil

    spec = str(tmp_path / "shared" / submission_id.rsplit("-", 1)[0] / "jobs" / f"{submission_id}.json")
    for process in psutil.process_iter(["pid", "cmdline"]):
        cmdline = process.info["cmdline"] or []
        if cmdline[-1:] == [spec] and "rlscale.runner.trl.train" in cmdline:
            os.kill(process.info["pid"], signal.SIGKILL)
            return
    raise LookupError(submission_id)


@pytest.mark.slow
def test_a_killed_job_is_retried_from_trls_checkpoint_and_pauses_at_a_rung(cluster, tmp_path):
    from ray.job_submission import JobSubmissionClient
    from rlscale.runner.jobs_api import RunDir
    from rlscale.runner.trl.engine import TrlJobFailed
    from rlscale.runner.trl.job import checkpointed_step

    recipe = Recipe.model_validate({**RECIPE, "steps": 40})
    engine = trl_engine(cluster, tmp_path)
    got = []
    killed = threading.Event()

    def kill_at_step_3(records):
        got.extend(records)
        if not killed.is_set() and any(r["step"] >= 3 for r in records):
            _kill_job(tmp_path, "trl-life-1-aa-1")
            killed.set()

    # the first job is killed with -9 once it is past its checkpoint at step 2: the engine raises
    with pytest.raises(TrlJobFailed, match="trl-life-1-aa-1 FAILED"):
        engine.run(recipe, run_key="trl-life-1-aa", on_records=kill_at_step_3)
    run_dir = RunDir(tmp_path / "shared" / "trl-life-1-aa")
    saved = checkpointed_step(recipe, run_dir)  # 2, or later on a host fast enough to step on before the kill lands
    assert saved >= 2
    # the retry resumes from TRL's last checkpoint and pauses at the next rung, checkpointed there
    rung = saved + 2
    result = engine.run(recipe, run_key="trl-life-1-aa", on_records=got.extend, until_step=rung)
    assert result.steps == rung and not result.stopped and result.timings["launch"] > 0
    assert (run_dir.checkpoints / f"checkpoint-{rung}" / "trainer_state.json").is_file()
    second = [yaml.safe_load(line) for line in run_dir.log("trl-life-1-aa-2").read_text().splitlines()]
    assert [line["step"] for line in second] == [saved + 1, saved + 2]  # no step 0 again
    assert sorted({r["step"] for r in got}) == list(range(max(r["step"] for r in got) + 1))  # nothing lost
    firsts = {}
    for record in got:
        firsts.setdefault(record["step"], record)
    hours = [firsts[s]["gpu_hours"] for s in sorted(firsts)]
    assert hours == sorted(hours) and hours[0] > 0  # measured device-hours, the failed job's included
    assert firsts[0]["val_reward"] is not None and firsts[4]["val_reward"] is not None
    assert firsts[3]["val_reward"] is None  # not an eval step
    end = got[-1]  # the rung's record from the retry: evaluated, with TRL's health metrics
    assert end["step"] == rung and 0 < end["val_reward"] <= 1 and end["rollouts"] == rung * 16
    assert end["tokens"] > rung * 16
    assert {"train_reward", "entropy", "grad_norm", "clip_fraction", "truncation_rate"} <= set(end["metrics"])
    jobs = sorted(
        j.submission_id
        for j in JobSubmissionClient(cluster).list_jobs()
        if j.submission_id.startswith("trl-life-1-aa-")
    )
    assert jobs == ["trl-life-1-aa-1", "trl-life-1-aa-2"]
    # a driver that comes back with a planned compute the jobs passed unwatched: the run ends at the plan's step
    ended = []
    result = engine.run(recipe, run_key="trl-life-1-aa", on_records=ended.extend, gpu_hours=firsts[3]["gpu_hours"])
    assert result.compute_reached and result.steps == 3 and max(r["step"] for r in ended) == 3
