"""Benchmark: the demo's measured sweeps, perturbed as logs from outside arrive, through every view of the decision.

Each case takes one of bench/data/quickstart/sweep*_*.csv (real `make demo` sweeps: B_p 16, n in {2, 4, 8, 16}) and,
drawn from the seed, drops runs, cuts one short, adds evaluation noise, rescales its compute or its rewards (another
unit), shuffles its rows, gives its runs hostile names or keeps every second evaluation. It is imported (`rlscale
import`), reported (`rlscale report --json`), and every command the report prints is run (`recommend`, `export`; a
`sweep --extend` as a dry run). Checks, per case:
    exits      every command exits 0, or 2 with one line (never a traceback)
    agree      `recommend` names the report's B_p, n, M and run; `export` its B_p and n; the dashboard and the
               stored decision its verdict and run; a case with its rewards rescaled, its twin without the factor
And on each unperturbed sweep:
    invariant  the decision is the same with its compute in other units (x 1e-3, 3600, 1e4), its rewards in
               other units (x 0.1, 3, 100: a percentage, a sum of three rewards), its rows shuffled and its runs
               renamed
    monotone   at each n chosen, M never falls as the budget grows across the run's data end (0.5x to 4x)
Writes bench/results/perturbed_sweeps.json.

Run: `.venv/bin/python bench/perturbed_sweeps.py [--cases 30] [--seed 0]` (~20 s a case on one core).
"""

import argparse
import contextlib
import io
import json
import platform
import shlex
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
SWEEPS = sorted((ROOT / "bench" / "data" / "quickstart").glob("sweep*_*.csv"))
RESULT = ROOT / "bench" / "results" / "perturbed_sweeps.json"
VARIANTS = 9  # check_invariance's
NAMES = ["a b", "ünï,côde", "x'; drop", "--flag", "n/8", "tab\tname", "😀", "dot.name"]


def cli(*args) -> tuple[int, str, str]:
    """`rlscale ARGS` in this process: (exit code, stdout, stderr); 99 for a traceback."""
    from rlscale.cli import main

    out, err, code = io.StringIO(), io.StringIO(), 0
    sys.argv = ["rlscale", *map(str, args)]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main()
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
        except Exception:
            code = 99
            traceback.print_exc(file=err)
    return code, out.getvalue(), err.getvalue()


def perturb(frame: pd.DataFrame, rng: np.random.Generator) -> tuple[pd.DataFrame, list[str]]:
    """The frame with some of the perturbations, drawn from `rng`, and their names."""
    frame, done = frame.copy(), []
    runs = list(frame["run"].unique())
    if rng.random() < 0.4 and len(runs) > 2:
        drop = list(rng.choice(runs, size=int(rng.integers(1, len(runs) - 1)), replace=False))
        frame, done = frame[~frame["run"].isin(drop)], [*done, f"drop {len(drop)}"]
    if rng.random() < 0.4:
        run = rng.choice(frame["run"].unique())
        cut = int(frame.loc[frame["run"] == run, "step"].quantile(rng.uniform(0.2, 0.9)))
        frame, done = frame[(frame["run"] != run) | (frame["step"] <= cut)], [*done, f"cut at {cut}"]
    if rng.random() < 0.4:
        sd = float(rng.choice([0.005, 0.02, 0.05]))
        frame["val_reward"] = (frame["val_reward"] + rng.normal(0, sd, len(frame))).clip(0, 1)
        done.append(f"noise {sd}")
    if rng.random() < 0.4:
        factor = float(10 ** rng.uniform(-3, 4))
        frame["gpu_hours"] *= factor
        done.append(f"compute x {factor:.3g}")
    if rng.random() < 0.3:
        factor = float(rng.choice([3.0, 100.0]))
        frame["val_reward"] *= factor
        done.append(f"reward x {factor:g}")
    if rng.random() < 0.3:
        frame, done = frame.sample(frac=1, random_state=int(rng.integers(1_000_000))), [*done, "shuffled"]
    if rng.random() < 0.3:
        names = {run: f"{NAMES[i % len(NAMES)]}{i}" for i, run in enumerate(frame["run"].unique())}
        frame["run"], done = frame["run"].map(names), [*done, "hostile names"]
    if rng.random() < 0.2:
        frame, done = frame.iloc[::2], [*done, "every 2nd"]
    return frame, done


def imported(frame: pd.DataFrame, where: Path) -> str:
    """The frame imported into a fresh SQLite store under `where`; its URL."""
    where.mkdir(parents=True, exist_ok=True)
    frame.to_csv(where / "runs.csv", index=False)
    url = f"sqlite:///{where / 's.db'}"
    code, _, err = cli("import", where / "runs.csv", "--study", "s", "--db", url, "--reward", "val_reward")
    if code != 0:
        raise ValueError(f"import exited {code}: {err.strip()[:200]}")
    return url


def decision(url: str, where: Path) -> dict:
    code, out, err = cli("report", "s", "--db", url, "--out", where / "report", "--json", "--bootstrap", "0")
    if code != 0:
        raise ValueError(f"report exited {code}: {err.strip()[:300]}")
    return json.loads(out)["decision"]


def stored_decision(url: str) -> dict:
    """The study's one decision (what `report` prints), without the report's plots and tables."""
    from rlscale.db.store import Store
    from rlscale.fitting.stored import study_decision

    with Store(url) as store:
        return study_decision(store, "s").to_dict()


def summary(d: dict) -> dict:
    rec = d.get("recommendation")
    refusal = [r["code"] for r in (d.get("refusal") or {}).get("reasons", [])]
    return {
        "decided": d["decided"],
        "best_run": d["best_run"],
        "geometry": None if rec is None else [rec["prompts_per_batch"], rec["rollouts"], rec["steps"]],
        "refusal": refusal,
    }


def check_case(seed: int, work: Path) -> dict:
    rng = np.random.default_rng(seed)
    source = SWEEPS[seed % len(SWEEPS)]
    frame, done = perturb(pd.read_csv(source), rng)
    where = work / f"case{seed}"
    case = {"seed": seed, "sweep": source.name, "perturbations": done, "broken": []}
    try:
        url = imported(frame, where)
    except ValueError as err:  # a perturbation the import refuses: exit 2 is an answer, a traceback is not
        case["import"] = str(err)
        if "exited 2" not in str(err):
            case["broken"].append(str(err))
        return case
    d = decision(url, where)
    case.update(summary(d))
    rec = d.get("recommendation")
    for command in (d.get("commands") or {}).values():
        if not command:
            continue
        words = shlex.split(command)[1:]
        if words[0] == "sweep":
            words.append("--dry-run")
        if words[0] == "export" and "--format" in words:
            words[words.index("--format") + 1] = "yaml"  # the recipe, in the format the checks read
        if words[0] == "recommend":
            words.append("--json")
        code, out, err = cli(*words)
        if code != 0:
            case["broken"].append(f"{command} exited {code}: {err.strip()[:200]}")
            continue
        if words[0] == "recommend" and rec:
            got = json.loads(out)
            mine = [got[k] for k in ("prompts_per_batch", "rollouts", "steps", "predicted_from")]
            theirs = [rec[k] for k in ("prompts_per_batch", "rollouts", "steps", "predicted_from")]
            if mine != theirs:
                case["broken"].append(f"recommend {mine} against the report's {theirs}")
        if words[0] == "export" and rec:
            got = yaml.safe_load(out)
            if [got.get("prompts_per_batch"), got.get("rollouts")] != [rec["prompts_per_batch"], rec["rollouts"]]:
                case["broken"].append("export's B_p and n are not the report's")
    from rlscale.db.store import Store
    from rlscale.fitting.stored import study_decision

    from rlscale.dashboard.study import study_decision as page_decision

    with Store(url) as store:
        stored, page = study_decision(store, "s"), page_decision(store, "s", None)
    if (stored.decided, stored.best_run) != (d["decided"], d["best_run"]):
        case["broken"].append("the stored decision is not the report's")
    if page is not None and page["verdict"] != ("decided" if stored.decided else "not yet"):
        case["broken"].append(f"the dashboard's verdict is {page['verdict']!r}")
    factor = next((float(name.split("x ")[1]) for name in done if name.startswith("reward x")), None)
    if factor is not None:  # its twin in the rewards' first unit decides the same
        twin = summary(stored_decision(imported(frame.assign(val_reward=frame["val_reward"] / factor), where / "twin")))
        if [twin[k] for k in ("geometry", "refusal")] != [case[k] for k in ("geometry", "refusal")]:
            case["broken"].append(f"unscaled, it decides {twin['geometry']} ({', '.join(twin['refusal'])})")
    return case


def check_invariance(source: Path, work: Path) -> dict:
    frame = pd.read_csv(source)
    variants = {
        "as measured": frame,
        "compute x 1e-3": frame.assign(gpu_hours=frame["gpu_hours"] * 1e-3),
        "compute x 3600": frame.assign(gpu_hours=frame["gpu_hours"] * 3600),
        "compute x 1e4": frame.assign(gpu_hours=frame["gpu_hours"] * 1e4),
        "reward x 0.1": frame.assign(val_reward=frame["val_reward"] * 0.1),
        "reward x 3": frame.assign(val_reward=frame["val_reward"] * 3),
        "reward x 100": frame.assign(val_reward=frame["val_reward"] * 100),
        "rows shuffled": frame.sample(frac=1, random_state=1),
        "runs renamed": frame.assign(run='run "' + frame["run"] + '" ü'),
    }
    seen = {}
    for name, variant in variants.items():
        where = work / f"{source.stem}-{len(seen)}"
        seen[name] = summary(stored_decision(imported(variant, where)))
    base = seen["as measured"]
    broken = [
        name for name, got in seen.items() if got["geometry"] != base["geometry"] or got["refusal"] != base["refusal"]
    ]
    # M across the chosen run's data end
    url = imported(frame, work / f"{source.stem}-steps")
    steps, monotone = [], None
    if base["geometry"] is not None:
        run = stored_decision(url)["best_run"]
        reach = float(frame.loc[frame["run"] == run, "gpu_hours"].max())
        for factor in (0.5, 0.9, 1.0, 1.05, 1.5, 4.0):
            code, out, _ = cli("recommend", "--study", "s", "--db", url, "--budget", str(reach * factor), "--json")
            steps.append([json.loads(out)["rollouts"], json.loads(out)["steps"]] if code == 0 else None)
        by_n = {}  # the chosen n may change with the budget: M is compared at one n
        for n, m in (pair for pair in steps if pair is not None):
            by_n.setdefault(n, []).append(m)
        monotone = all(ms == sorted(ms) for ms in by_n.values())
    return {"sweep": source.name, "decision": base, "variants_differing": broken, "steps": steps, "monotone": monotone}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULT)
    args, argv = parser.parse_args(), sys.argv[1:]  # cli() sets sys.argv for each command it runs
    began = time.time()
    cases, invariance = [], []
    with tempfile.TemporaryDirectory(prefix="rlscale-perturbed-") as tmp:
        work = Path(tmp)
        for source in SWEEPS:
            row = check_invariance(source, work)
            invariance.append(row)
            same = VARIANTS - len(row["variants_differing"])
            ladder = " ".join("-" if pair is None else f"{pair[0]}/{pair[1]}" for pair in row["steps"])
            print(f"{source.stem:15s} same in {same}/{VARIANTS}; n/M {ladder}"[:80], flush=True)
        for seed in range(args.seed, args.seed + args.cases):
            case = check_case(seed, work)
            cases.append(case)
            verdict = "held" if not case["broken"] else "BROKEN: " + "; ".join(case["broken"])
            print(f"case {seed:3d} {', '.join(case['perturbations']) or 'none':44.44s} {verdict}"[:80], flush=True)
    held = sum(not case["broken"] for case in cases)
    result = {
        "command": " ".join(["bench/perturbed_sweeps.py", *argv]),
        "date": time.strftime("%Y-%m-%d"),
        "host": {"machine": platform.machine(), "cpus": len(__import__("os").sched_getaffinity(0))},
        "wall_seconds": round(time.time() - began),
        "cases": len(cases),
        "held": held,
        "decided": sum(bool(case.get("decided")) for case in cases),
        "invariant_sweeps": sum(not row["variants_differing"] for row in invariance),
        "monotone_sweeps": sum(row["monotone"] is True for row in invariance),
        "invariance": invariance,
        "case_rows": cases,
    }
    args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    print(f"{held} of {len(cases)} cases held ({result['decided']} decided)")
    print(
        f"decisions invariant on {result['invariant_sweeps']} of {len(SWEEPS)} sweeps, "
        f"M monotone on {result['monotone_sweeps']}; wrote {args.out.name}"
    )


if __name__ == "__main__":
    main()
