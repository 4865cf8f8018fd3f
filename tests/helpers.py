"""Helpers the test modules share (conftest.py keeps the fixtures): the CLI in-process, spawned drivers and their
logs, synthetic studies, exported scripts' argv, the checker venvs. No test module imports another; each imports
what it needs from here."""

import csv
import functools
import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import yaml
from rlscale.fitting.sigmoid import sigmoid
from rlscale.planner.recipe import Recipe


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """Run `rlscale ARGS` in-process, as the console script does: (exit code, stdout, stderr)."""
    from rlscale.cli import main

    monkeypatch.setattr(sys, "argv", ["rlscale", *map(str, args)])
    try:
        main()
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    out = capsys.readouterr()
    return code, out.out, out.err


def spawn(args: list[str], log: Path, **options) -> subprocess.Popen:
    """Start `args` in a process group of its own, its stderr into the file `log`: a pipe nobody reads while the
    process runs fills up (64 KiB) and blocks it."""
    with open(log, "ab") as stderr:
        return subprocess.Popen(args, start_new_session=True, stdout=subprocess.DEVNULL, stderr=stderr, **options)


def tail(log: Path, chars: int = 2000) -> str:
    """The last `chars` characters of a spawned process's stderr."""
    return log.read_text(errors="replace")[-chars:] if log.exists() else ""


ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def bench_module(name: str):
    """bench/<name>.py imported as a module (bench/ is no package), once per test session."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = bench_module("optimal_n_recovery")  # synthetic IsoCompute studies with a known n*


def seed_isocompute(url, name, truth, c_obs, prompts=(16, 32), fit=None):
    """Store a synthetic IsoCompute study (runs and records) and return nothing. fit: the study's `fit` section."""
    from rlscale.db.store import Store
    from rlscale.planner.study_file import parse_study

    runs, records = bench.synthetic_study(truth, c_obs, prompts=prompts)
    spec = parse_study(
        {
            "name": name,
            "method": "isocompute",
            "compute": {"unit": "gpu_hours", "budget": c_obs, "profile": "tiny-cpu"},
            "parameters": {
                "prompts_per_batch": {"values": list(prompts)},
                "rollouts": {"values": list(bench.ROLLOUTS)},
            },
            **({"fit": fit} if fit else {}),
        },
        file="test",
    ).to_spec()
    store = Store(url)
    store.upsert_study(name, spec)
    for run in runs.to_dict("records"):
        config = Recipe(prompts_per_batch=run["prompts_per_batch"], rollouts=run["rollouts"]).to_json()
        run_id = store.ensure_run(name, run["run"], config)
        mine = records[records["run"] == run["run"]]
        store.add_records(
            run_id,
            [
                {
                    "step": r.step,
                    "gpu_hours": r.gpu_hours,
                    "val_reward": r.val_reward,
                    "metrics": {"truncation_rate": r.truncation_rate},
                }
                for r in mine.itertuples()
            ],
        )
        store.set_run_status(run_id, "done")
    store.close()


def normal_calibration(noise_share: float, drift_per_noise: float, drift_per_gain: float, n: int = 999):
    """A Calibration with these coefficients and, as scores, `n` evenly spaced quantiles of |N(0, 1)|: the interval a
    Gaussian error of that scale would call for (its `quantile(level)` is close to the normal one)."""
    from rlscale.fitting.laws.predict import Calibration
    from scipy import stats

    scores = stats.norm.ppf(0.5 + 0.5 * (np.arange(n) + 0.5) / n)
    note = {"note": "scores: quantiles of |N(0, 1)|"}
    return Calibration(noise_share, drift_per_noise, drift_per_gain, tuple(map(float, scores)), (1.0,) * n, note)


# true asymptotes of the synthetic LOO study (seed_loo): only the DAPO revert is beyond the 0.02 noise band
TRUE_A = {"baseline": 0.62, "dapo_loss": 0.52, "sample_average": 0.617, "no_fp32_head": 0.612}


def seed_loo(url: str, sweep_names: bool = False) -> str:
    """Store the runs of studies/scalerl_loo.yaml with synthetic records; returns the study name. sweep_names:
    name the runs as a sweep does (`<variant>/s<seed>`, the study has 3 seeds)."""
    from rlscale.db.store import Store
    from rlscale.planner.planning import plan_study
    from rlscale.planner.study_file import load_study
    from rlscale.runner.sweep.state import run_name

    study = load_study(ROOT / "studies" / "scalerl_loo.yaml")
    store = Store(url)
    store.upsert_study(study.name, study.to_spec())
    rng = np.random.default_rng(0)
    budget = study.compute.budget
    for run in plan_study(study).runs:
        A = TRUE_A.get(run.name, 0.615)
        name = run_name(run, several_seeds=True) if sweep_names else run.name
        run_id = store.ensure_run(study.name, name, run.recipe.to_json(), seed=run.seed)
        steps = np.arange(0, 201, 5)
        hours = budget * steps / steps[-1]
        reward = rng.binomial(4096, sigmoid(hours, A, 1.6, budget / 15, 0.1)) / 4096  # the plateau is seen
        store.add_records(
            run_id,
            [
                {"step": int(s), "gpu_hours": float(h), "val_reward": float(r), "metrics": {"truncation_rate": 0.01}}
                for s, h, r in zip(steps, hours, reward)
            ],
        )
        store.set_run_status(run_id, "done")
    store.close()
    return study.name


NAMES = [
    "qwen2.5-7b/lr=1e-6,bs=256",  # verl / W&B group names
    "GRPO (clip 0.2)",
    "dainty-sun-42",  # a W&B default
    "grpo/seed_1",  # a TensorBoard subdirectory
    "[bold]x[/bold]",  # Rich markup, shown literally
    "Модель α, 温度 0.7",  # non-ASCII letters
    "cost $5 *draft* _v2",  # mathtext and markdown punctuation
    "r" * 200,  # the longest a name may be
]


def curves_csv(path, names, *, points: int = 25) -> None:
    """One clean sigmoid per name, asymptotes 0.5, 0.53, ... (csv quotes the commas)."""
    compute = np.geomspace(10, 2000, points)
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["run", "compute", "reward"])
        for i, name in enumerate(names):
            for c, r in zip(compute, sigmoid(compute, 0.5 + 0.03 * i, 1.5, 300.0, 0.1)):
                out.writerow([name, f"{c:.4f}", f"{r:.5f}"])


def script_argv(text: str, tmp_path: Path) -> list[str]:
    """The argv bash passes to `python3 -m MODULE` when it runs an exported script (python3 is a stand-in that
    prints its argv), without the `-m MODULE`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "python3"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    fake.chmod(0o755)
    script = tmp_path / "export.sh"
    script.write_text(text)
    done = subprocess.run(
        ["bash", str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
    )
    assert done.returncode == 0, done.stderr
    argv = json.loads(done.stdout)
    assert argv[0] == "-m"
    return argv[2:]


REWARD = "val-core/openai/gsm8k/reward/mean@1"


def write_events(directory, steps: dict[int, dict[str, float]], *, suffix: str = ""):
    """One event file in `directory` with the given scalars per step, as tensorboard's writer stores them."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(directory), filename_suffix=suffix)
    for step, scalars in steps.items():
        values = [summary_pb2.Summary.Value(tag=tag, simple_value=value) for tag, value in scalars.items()]
        writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=values)))
    writer.close()
    return next(p for p in directory.iterdir() if p.name.endswith(suffix) and "tfevents" in p.name)


def python_of(env: str) -> Path:
    """The Python of a checker venv (scripts/checker_envs.sh); a failure in CI, a skip elsewhere, when it is missing."""
    python = ROOT / env / "bin" / "python"
    if not python.exists():
        message = f"{env} is missing: run scripts/checker_envs.sh (make setup builds it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return python


# ------------------------------------------------------------------ the TRL engine's end-to-end tests
# `python -c TRL_DRIVER STUDY_FILE DB_URL RAY_ADDRESS SHARED_DIR`: the sweep as `rlscale sweep` runs it
TRL_DRIVER = textwrap.dedent("""
    import sys
    from rlscale.db.store import Store
    from rlscale.planner.study_file import load_study
    from rlscale.runner.sweep.driver import SweepDriver
    study_file, url, address, shared = sys.argv[1:]
    options = {"trl": {"shared_dir": shared, "poll_seconds": 0.2}}
    with Store(url) as store:
        SweepDriver(load_study(study_file), store, ray_address=address, engine_options=options).run()
""")


def kill_driver_when(args: list[str], url: str, study: str, reached, *, env: dict | None = None, seconds: float = 300):
    """Start the driver `args` (stderr to driver.log beside the store) and kill -9 its process group once
    `reached(records of study)` holds; fails if the driver ends first or `seconds` pass."""
    from rlscale.db.store import Store

    store_file = Path(url.removeprefix("sqlite:///"))
    log = store_file.with_name("driver.log")
    driver = spawn(args, log, env=env)
    try:
        deadline = time.time() + seconds
        while time.time() < deadline and driver.poll() is None:
            if store_file.exists():
                with Store(url) as store:
                    records = store.records_frame(study) if study in store.study_names() else []
                if len(records) and reached(records):
                    break
            time.sleep(0.3)
        assert driver.poll() is None, f"the driver ended before it could be killed: {tail(log)}"
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()


def kill_driver_past(
    args: list[str], url: str, study: str, cluster: str, *, step: int = 3, env: dict | None = None, seconds: float = 300
) -> list[str]:
    """Start the driver `args`, kill -9 its process group once a record of `study` reaches `step` (past the
    checkpoint at step 2), then stop its running jobs as a lost node would; returns those jobs' submission ids."""
    from ray.job_submission import JobSubmissionClient

    kill_driver_when(args, url, study, lambda records: records["step"].max() >= step, env=env, seconds=seconds)
    client = JobSubmissionClient(cluster)
    stopped = [
        j.submission_id
        for j in client.list_jobs()
        if j.submission_id.startswith(f"{study}-") and str(j.status.value) in ("PENDING", "RUNNING")
    ]
    for job in stopped:
        client.stop_job(job)
    while any(str(client.get_job_status(job).value) in ("PENDING", "RUNNING") for job in stopped):
        time.sleep(0.2)
    return stopped


def write_bayes_study(path: Path, name: str, n_trials: int, recipe: dict, lr: tuple[float, float], **keys) -> Path:
    """A `method: bayes` study over a log-uniform lr in `lr` (min, max); `keys` are more top-level keys."""
    spec = {
        "name": name,
        "method": "bayes",
        "n_trials": n_trials,
        "recipe": recipe,
        "parameters": {"lr": {"min": lr[0], "max": lr[1], "distribution": "log_uniform"}},
        **keys,
    }
    path.write_text(yaml.safe_dump(spec))
    return path


# ------------------------------------------------------------------ a TRL user's setup (the trl setup tests)


def conversations(prompts) -> list[dict]:
    return [{"prompt": [{"role": "user", "content": p.text}], "answer": p.answer} for p in prompts]


def write_setup(
    folder: Path,
    *,
    budget: float = 0.04,
    train_rows: int = 64,
    grpo: dict | None = None,
    rows: list[dict] | None = None,
    module_text: str | None = None,
) -> tuple[Path, str]:
    """A study folder as a TRL user has it: grpo.yaml, data/{train,test}.parquet (conversational 2-digit sums), a
    reward module; and a two-point study over n on it. Returns (the study file, the reward module's name)."""
    import datasets
    from rlscale.runner.rl.tasks import arithmetic_task

    datasets.disable_progress_bars()  # the test's own writes stay off the stderr the CLI's one line is read from
    task = arithmetic_task(2, 0)
    (folder / "data").mkdir(parents=True)
    datasets.Dataset.from_list(rows or conversations(task.train[:train_rows])).to_parquet(folder / "data/train.parquet")
    held_out = conversations(task.validation(16))
    if rows and "answer" not in rows[0]:
        held_out = [{"prompt": row["prompt"], "solution": row["answer"]} for row in held_out]
    datasets.Dataset.from_list(held_out).to_parquet(folder / "data/test.parquet")
    module = f"rewards_{uuid.uuid4().hex[:8]}"  # a fresh name: the CLI runs in this process, which caches modules
    (folder / f"{module}.py").write_text(
        module_text
        or textwrap.dedent('''
        def correct(completions, answer, **kwargs):
            """1.0 when the completion is the sum."""
            return [float(c[0]["content"].strip() == a) for c, a in zip(completions, answer)]
    ''')
    )
    config = {
        "dataset_name": "data",
        "reward_funcs": [f"{module}.correct", "get_soft_overlong_punishment"],
        "reward_weights": [1.0, 0.1],
        "learning_rate": 2.0e-5,
        "per_device_train_batch_size": 8,
        "max_completion_length": 8,
        "gradient_checkpointing": False,
        "report_to": ["mlflow"],
        "env": {"MY_FLAG": "1"},
        **(grpo or {}),
    }
    (folder / "grpo.yaml").write_text(yaml.safe_dump({k: v for k, v in config.items() if v is not None}))
    study = {
        "name": "mine",
        "method": "isocompute",
        "compute": {"unit": "gpu_hours", "budget": budget, "profile": "tiny-cpu"},
        "parameters": {"rollouts": {"values": [2, 4]}},
        "recipe": {
            "engine": "trl",
            "prompts_per_batch": 4,
            "eval_every": 5,
            "eval_prompts": 8,
            "eval_samples": 2,
            "checkpoint_every": 2,
        },
        "setup": {"config": "grpo.yaml"},
    }
    (folder / "study.yaml").write_text(yaml.safe_dump(study))
    return folder / "study.yaml", module
