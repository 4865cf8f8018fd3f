"""Deep-GRPO's W&B exports -> deep_grpo_qwen2.5_0.5b_gsm8k.csv (run, step, compute, reward) and its sources file.

The exports sit under recipe/DEEP_GRPO/paper_draw/data/ of github.com/befocuss/Deep-GRPO at commit 7158a96 (removed
from the repository by the next commit). Each has a `<run> - <metric>` column per run (with W&B's __MIN/__MAX band,
equal to the value: the curves are not smoothed), indexed by Step, or by wall time with the run's step in a
`<run> - _step` column. A run found in several exports is kept once, after checking the copies are equal.
Usage: python extract_deep_grpo.py PATH_TO_A_CLONE_OF_Deep-GRPO
"""

import io
import subprocess
import sys
from pathlib import Path

import pandas as pd

COMMIT = "7158a967c61c1e9d302ccb09ea18bf1acc1749b3"
EXPORTS = "recipe/DEEP_GRPO/paper_draw/data/"
OUT = Path(__file__).with_name("deep_grpo_qwen2.5_0.5b_gsm8k.csv")


def git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, check=True).stdout


def main(repo: str) -> None:
    runs, sources = {}, []
    for path in git(repo, "ls-tree", "-r", "--name-only", COMMIT, EXPORTS).split():
        table = pd.read_csv(io.StringIO(git(repo, "show", f"{COMMIT}:{path}")))
        for column in table.columns:
            run, _, metric = column.partition(" - ")
            if not (metric.startswith("val-core/") and metric.endswith("/mean@1")):
                continue
            for band in ("__MIN", "__MAX"):
                assert (table[column].dropna() == table.get(column + band, table[column]).dropna()).all(), column
            step = table["Step"] if "Step" in table.columns else table[f"{run} - _step"]
            curve = pd.DataFrame({"step": step, "reward": table[column]}).dropna().astype({"step": int})
            curve = curve.sort_values("step").reset_index(drop=True)
            sources.append({"run": run, "metric": metric, "path": path, "commit": COMMIT})
            if run in runs:
                shared = runs[run].merge(curve, on="step")
                assert len(shared) and (shared["reward_x"] == shared["reward_y"]).all(), (run, path)
                continue
            runs[run] = curve
    rows = pd.concat([curve.assign(run=run) for run, curve in runs.items()])
    rows["compute"] = rows["step"].astype(float)  # every step of a run has the same batch
    rows[["run", "step", "compute", "reward"]].to_csv(OUT, index=False)
    pd.DataFrame(sources).to_csv(OUT.with_name("deep_grpo_sources.csv"), index=False)
    print(f"wrote {OUT.name}: {len(runs)} runs, {len(rows)} evaluations")


if __name__ == "__main__":
    main(sys.argv[1])
