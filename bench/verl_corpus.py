"""verl's own launch scripts as users' setups: each file in tests/data/verl_launches/ (the launch arguments of one of
verl 0.9's example scripts or DAPO recipes, its source named at its top) made the `overrides_file` of a study over
B_p and n, then `rlscale sweep STUDY --dry-run --json` as a user runs it. Each either composes and validates through
verl 0.9.1's Hydra (exit 0, every job composed) or exits 2 naming the file and the key; nothing else is acceptable.

The study: B_p at half and all of the file's data.train_batch_size, n at its rollout.n and twice that, the file's
devices (trainer.n_gpus_per_node x trainer.nnodes), and setup.replace for the batch keys the file sets (the study's
axes win; rollout.n, data.train_batch_size, actor.ppo_mini_batch_size).

    .venv/bin/python bench/verl_corpus.py
Prints the table (docs/benchmarks.md holds it) and writes bench/results/verl_corpus.json.
"""

import json
import platform
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "data" / "verl_launches"
RESULTS = Path(__file__).parent / "results"
# the verl keys a study over B_p and n changes (planner/frameworks/verl.py's mapping): the study replaces the file's
REPLACED = ("data.train_batch_size", "actor_rollout_ref.rollout.n", "actor_rollout_ref.actor.ppo_mini_batch_size")


def corpus() -> list[Path]:
    return sorted(CORPUS.glob("*.args"))


def source_of(args: Path) -> str:
    """`owner/repo@commit path` from the file's first line."""
    return args.read_text().splitlines()[0].removeprefix("# ")


def corpus_study(args: Path, folder: Path) -> Path:
    """The study over B_p and n on `args` (module docstring), written into `folder`."""
    from rlscale.planner.frameworks.setup import read_setup

    from rlscale.base.errors import UserError

    try:
        keys = read_setup("verl", config=None, overrides=[], overrides_file=str(args), study_file=None).keys
    except UserError:  # the dry-run says why, naming the file
        keys = {}
    batch, rollouts = int(keys.get("data.train_batch_size", 64)), int(keys.get("actor_rollout_ref.rollout.n", 4))
    gpus = int(keys.get("trainer.n_gpus_per_node", 8)) * int(keys.get("trainer.nnodes", 1))
    study = {
        "name": args.stem.replace(".", "_"),
        "method": "grid",
        "parameters": {
            "prompts_per_batch": {"values": [max(1, batch // 2), batch]},
            "rollouts": {"values": [rollouts, 2 * rollouts]},
        },
        "recipe": {"engine": "verl", "trainer_devices": gpus, "steps": 20},
        "setup": {"overrides_file": str(args), "replace": [key for key in REPLACED if key in keys]},
    }
    path = folder / f"{args.stem}.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


def outcome(code: int, out: str, err: str) -> dict:
    """What the dry-run said: composed (the config, jobs composed of jobs) or refused (each problem's key and
    reason); `ok` when it is one of the two a user may get."""
    if code == 0:
        points = json.loads(out)
        composed = [point["composed"] for point in points if point.get("composed")]
        config = composed[0]["config"] if composed else None
        return {
            "result": "composed",
            "config": config,
            "jobs": len(points),
            "composed": len(composed),
            "ok": len(composed) == len(points),
        }
    if code != 2:
        return {"result": "crashed", "code": code, "error": err.strip()[-300:], "ok": False}
    lines = err.strip().removeprefix("error: ").splitlines()
    problems = [dict(zip(("file", "key", "reason"), line.split(": ", 2))) for line in lines]
    named = all(problem.get("reason") and problem["file"].endswith((".args", ".yaml")) for problem in problems)
    return {"result": "refused", "problems": problems, "ok": named}


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for args in corpus():
            study = corpus_study(args, Path(folder))
            started = time.perf_counter()
            done = subprocess.run(
                [
                    str(ROOT / ".venv" / "bin" / "rlscale"),
                    "sweep",
                    str(study),
                    "--dry-run",
                    "--json",
                    "--db",
                    f"sqlite:///{folder}/never.db",
                    "--shared-dir",
                    "/nfs/rl",
                    "--ray-address",
                    "http://head:8265",
                ],
                capture_output=True,
                text=True,
                cwd=folder,
            )
            row = {"file": args.name, "source": source_of(args), "seconds": round(time.perf_counter() - started, 1)}
            row.update(outcome(done.returncode, done.stdout, done.stderr))
            rows.append(row)
            print(table_row(row), flush=True)
    composed = sum(row["result"] == "composed" for row in rows)
    print(
        f"{len(rows)} scripts: {composed} composed, {len(rows) - composed} refused; all as a user may get: "
        f"{all(row['ok'] for row in rows)}"
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "verl_corpus.json").write_text(
        json.dumps(
            {
                "date": date.today().isoformat(),
                "host": f"{platform.node()} ({platform.processor() or platform.machine()})",
                "python": sys.version.split()[0],
                "rows": rows,
            },
            indent=1,
        )
    )


def table_row(row: dict) -> str:
    """A markdown row: the source script, the result and why."""
    path = row["source"].split(" ", 1)[1]
    if row["result"] == "composed":
        what = f"composed, {row['composed']} of {row['jobs']} jobs ({row['config']})"
    elif row["result"] == "crashed":
        what = f"crashed (exit {row['code']}): {row['error'][-120:]}"
    else:
        what = "refused: " + "; ".join(f"`{p.get('key')}`: {p.get('reason', '')[:90]}" for p in row["problems"])
    return f"| {path} | {what} |"


if __name__ == "__main__":
    main()
