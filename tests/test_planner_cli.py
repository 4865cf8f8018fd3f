"""`rlscale plan` end to end: the JSON contract, the Playbook grid, exit 2 on bad input, --save, --calibrate,
and running without torch, Ray or vLLM."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import run_cli

ROOT = Path(__file__).parent.parent
PLAYBOOK_GRID = {(2**a, 2**b) for a in range(5, 11) for b in range(3, 12) if 2 ** (a + b) <= 65536}


def rlscale(monkeypatch, capsys, *args) -> tuple[int, str, str]:
    """Run the CLI in-process as a user would; (exit code, stdout, stderr)."""
    return run_cli(monkeypatch, capsys, *args)


def test_budget_json_follows_the_contract(workdir, monkeypatch, capsys):
    code, out, _ = rlscale(monkeypatch, capsys, "plan", "--budget", 16000, "--json")
    assert code == 0
    plan = json.loads(out)
    assert {"points", "budget_gpu_hours", "per_run_gpu_hours", "profile", "dropped"} <= set(plan)
    assert plan["budget_gpu_hours"] == 16000 and plan["profile"] == "scalerl-8b"
    for point in plan["points"]:
        assert set(point) == {"prompts_per_batch", "rollouts", "steps", "gpu_hours", "total_rollouts"}
        assert point["total_rollouts"] == point["prompts_per_batch"] * point["rollouts"] * point["steps"]
    assert sum(p["gpu_hours"] for p in plan["points"]) <= 16000
    assert not (workdir / "rlscale.db").exists()  # planning alone writes nothing


def test_playbook_axes_through_the_cli(workdir, monkeypatch, capsys):
    code, out, _ = rlscale(
        monkeypatch,
        capsys,
        "plan",
        "--budget",
        5e6,
        "--prompts",
        "32,64,...,1024",
        "--rollouts",
        "8,16,...,2048",
        "--max-batch",
        65536,
        "--json",
    )
    assert code == 0
    plan = json.loads(out)
    assert {(p["prompts_per_batch"], p["rollouts"]) for p in plan["points"]} == PLAYBOOK_GRID
    per_run = plan["per_run_gpu_hours"]
    assert per_run == pytest.approx(5e6 / 39)
    for p in plan["points"]:
        step = p["gpu_hours"] / p["steps"]
        assert 0 <= per_run - p["gpu_hours"] < step
    assert all("max-batch" in d["reason"] for d in plan["dropped"])


def test_table_shows_points_and_dropped(workdir, monkeypatch, capsys):
    code, out, _ = rlscale(
        monkeypatch,
        capsys,
        "plan",
        "--budget",
        100,
        "--per-run",
        "--prompts",
        "8,16",
        "--rollouts",
        "4,8",
        "--profile",
        "scalerl-8b",
        "--min-steps",
        100,
    )
    assert code == 0  # 100 GPU-hours pay for 177 steps of 8 x 4, 88 of 16 x 4 or 8 x 8, 44 of 16 x 8
    assert "IsoCompute plan: 1 runs at 100 GPU-hours each" in out
    assert "dropped (3)" in out and "100 step(s)" in out


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--budget", "-16000"], "--budget"),
        (["--budget", "0"], "--budget"),
        (["--budget", "nan"], "--budget"),
        ([], "--budget"),
        (["--budget", "100", "--prompts", ""], "--prompts"),
        (["--budget", "100", "--rollouts", "8,0"], "--rollouts"),
        (["--budget", "100", "--max-batch", "0"], "--max-batch"),
        (["--budget", "100", "--min-steps", "0"], "--min-steps"),
        (["--budget", "100", "--profile", "a100-70b"], "--profile"),
        (["--budget", "0.0001"], "--budget"),
    ],
)
def test_bad_grid_input_exits_2_naming_the_option(workdir, monkeypatch, capsys, args, field):
    code, out, err = rlscale(monkeypatch, capsys, "plan", *args, "--save", "nope")
    assert code == 2
    assert err.startswith(f"error: {field}: ")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (workdir / "rlscale.db").exists()


BAD_STUDIES = [
    ({"recipe": {"los": "dapo"}}, "recipe.los: unknown key"),
    ({"parameters": {"loss": {"values": ["dapo", "ppo"]}}}, "parameters.loss.values.1: Input should be"),
    ({"compute": {"budget": -1, "profile": "tiny-cpu"}}, "compute.budget: Input should be greater than 0"),
    ({"parameters": {"loss": {"values": []}}}, "parameters.loss.values: List should have at least 1 item"),
    ({"early_terminate": {"type": "asymptote", "patience": 3}}, "early_terminate.patience: unknown key"),
    # an axis value that leaves no run to plan: the file is named with the field
    ({"max_batch": 4}, "max_batch: no run is left to plan"),
    ({"compute": {"budget": 1e-6}}, "compute.budget: no run is left to plan"),
]


@pytest.mark.parametrize(("change", "message"), BAD_STUDIES)
def test_bad_study_exits_2_with_file_and_field_and_writes_nothing(workdir, monkeypatch, capsys, change, message):
    data = yaml.safe_load((ROOT / "studies" / "loss_ablation.yaml").read_text())
    for key, value in change.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) and key != "parameters" else value
    path = workdir / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    code, out, err = rlscale(monkeypatch, capsys, "plan", path, "--save", "bad-plan")
    assert code == 2
    assert err.startswith(f"error: {path}: {message}")
    assert not (workdir / "rlscale.db").exists()


def test_bad_study_exits_2_in_a_real_process(workdir):
    path = workdir / "typo.yaml"
    path.write_text("name: typo\nmethod: grid\nparameters:\n  loss: {values: [dapo]}\nrecipe:\n  rollout: 8\n")
    proc = subprocess.run(
        [sys.executable, "-m", "rlscale", "plan", str(path)], capture_output=True, text=True, cwd=workdir, timeout=120
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: {path}: recipe.rollout: unknown key (typo?)"


def test_study_runs_and_save(workdir, monkeypatch, capsys):
    code, out, _ = rlscale(
        monkeypatch, capsys, "plan", ROOT / "studies" / "quickstart.yaml", "--json", "--save", "quickstart-plan"
    )
    assert code == 0
    plan = json.loads(out)
    assert plan["study"] == "quickstart" and plan["profile"] == "tiny-cpu"
    assert len(plan["runs"]) == 4
    from rlscale.db.store import Store

    with Store() as store:
        assert store.plan("quickstart-plan")["runs"] == plan["runs"]


def test_grid_save_stores_the_json_payload(workdir, monkeypatch, capsys):
    code, out, _ = rlscale(monkeypatch, capsys, "plan", "--budget", 16000, "--save", "b16k")
    assert code == 0 and "saved plan 'b16k'" in out
    from rlscale.db.store import Store

    with Store() as store:
        stored = store.plan("b16k")
    assert stored["budget_gpu_hours"] == 16000 and len(stored["points"]) == 9


def test_study_table(workdir, monkeypatch, capsys):
    code, out, _ = rlscale(monkeypatch, capsys, "plan", ROOT / "studies" / "scalerl_loo.yaml")
    assert code == 0
    assert "study scalerl_loo (loo): 24 runs" in out and "dapo_loss" in out


def test_calibrate_from_the_store_then_plan_with_the_fitted_profile(workdir, monkeypatch, capsys):
    from rlscale.db.store import Store

    per_rollout, overhead, startup = 4e-6, 1e-4, 0.02
    runs = []
    for bp, n in [(8, 4), (8, 8), (16, 8)]:
        cost = overhead + per_rollout * bp * n
        records = [{"step": s, "gpu_hours": startup + s * cost, "val_reward": 0.1} for s in range(0, 41, 10)]
        runs.append((f"bp{bp},n{n}", {"prompts_per_batch": bp, "rollouts": n}, records))
    with Store() as store:
        store.import_runs("cpu-probe", runs)
    code, out, _ = rlscale(monkeypatch, capsys, "plan", "--calibrate", "cpu-probe", "--json")
    assert code == 0
    fitted = json.loads(out)
    assert fitted["profile"]["gpu_hours_per_rollout"] == pytest.approx(per_rollout, rel=1e-6)
    assert fitted["profile"]["step_overhead_gpu_hours"] == pytest.approx(overhead, rel=1e-6)
    assert fitted["profile"]["startup_gpu_hours"] == pytest.approx(startup, rel=1e-6)
    assert fitted["quality"]["r2"] == pytest.approx(1.0) and fitted["quality"]["warnings"] == []
    assert Path(fitted["path"]) == workdir / "cache" / "profiles" / "cpu-probe.json"
    # `--profile NAME` now finds it: 1 GPU-hour per run at 8 x 4 -> (1 - startup) / cost steps
    code, out, _ = rlscale(
        monkeypatch,
        capsys,
        "plan",
        "--budget",
        1,
        "--per-run",
        "--prompts",
        8,
        "--rollouts",
        4,
        "--profile",
        "cpu-probe",
        "--json",
    )
    assert code == 0
    assert json.loads(out)["points"][0]["steps"] == int((1 - startup) / (overhead + per_rollout * 32))


def test_calibrate_unknown_study_exits_2(workdir, monkeypatch, capsys):
    code, _, err = rlscale(monkeypatch, capsys, "plan", "--calibrate", "nothing-here")
    assert code == 2 and "no study named 'nothing-here'" in err


BLOCKER = """
import importlib.abc, sys
BLOCKED = {"torch", "ray", "vllm"}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked in this test")
sys.meta_path.insert(0, Block())
for name in list(sys.modules):
    if name.split(".")[0] in BLOCKED:
        del sys.modules[name]
sys.argv = ["rlscale", *sys.argv[1:]]
from rlscale.cli import main
main()
"""


@pytest.mark.parametrize(
    "args", [["plan", "--budget", "16000", "--json"], ["plan", "studies/quickstart.yaml", "--json"]]
)
def test_plan_runs_without_torch_ray_or_vllm(workdir, args):
    args = [str(ROOT / a) if a.endswith(".yaml") else a for a in args]
    proc = subprocess.run(
        [sys.executable, "-c", BLOCKER, *args], capture_output=True, text=True, cwd=workdir, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)
    # and the blocker works: importing torch in that interpreter fails
    check = subprocess.run(
        [sys.executable, "-c", BLOCKER.replace("from rlscale.cli import main\nmain()", "import torch")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode != 0 and "blocked" in check.stderr
