"""Run inside .venv-openrlhf (scripts/checker_envs.sh): OpenRLHF's own argument parser reads rlscale's command.

OpenRLHF builds its parser under `if __name__ == "__main__":` in openrlhf/cli/train_ppo_ray.py, then runs its
checks and calls train(args). This runs that block of the installed file unchanged, with `train` bound to a
function that keeps the parsed args (so nothing starts: no Ray, no GPUs). An unknown flag or a bad value makes
the parser exit 2, and a failed check raises: both are reported.
stdin: JSON list of {"name", "argv"}. Writes JSON {"version", "cases": [{"name", "ok", "error", "values"}]} to
the file named by argv[1].
"""

import argparse
import ast
import contextlib
import datetime
import importlib.metadata
import importlib.util
import io
import json
import os
import sys


def _main_block():
    path = importlib.util.find_spec("openrlhf.cli.train_ppo_ray").origin
    tree = ast.parse(open(path).read(), filename=path)
    for node in tree.body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            return compile(ast.Module(body=node.body, type_ignores=[]), path, "exec")
    raise RuntimeError(f"no __main__ block in {path}")


def parse(code, argv: list[str]):
    """OpenRLHF's parsed and checked args for `argv`."""
    parsed = []
    namespace = {
        "__name__": "__main__",
        "argparse": argparse,
        "os": os,
        "datetime": datetime.datetime,
        "train": parsed.append,
    }
    sys.argv = ["train_ppo_ray.py", *argv]
    exec(code, namespace)
    return parsed[0]


def values(args) -> dict:
    return {
        "estimator": args.algo.advantage.estimator,
        "no_std_norm": args.algo.advantage.no_std_norm,
        "critic": args.critic.model_name_or_path,
        "rollout_batch_size": args.rollout.batch_size,
        "n_samples_per_prompt": args.rollout.n_samples_per_prompt,
        "train_batch_size": args.train.batch_size,
        "max_epochs": args.train.max_epochs,
        "num_episodes": args.train.num_episodes,
        "max_samples": args.data.max_samples,
        "max_len": args.data.max_len,
        "max_new_tokens": args.rollout.max_new_tokens,
        "policy_loss_type": args.actor.policy_loss_type,
        "eps_clip_low_high": list(args.actor.eps_clip_low_high),
        "dual_clip": args.actor.dual_clip,
        "loss_agg_mode": args.actor.loss_agg_mode,
        "kl_use_loss": args.algo.kl.use_loss,
        "kl_estimator": args.algo.kl.estimator,
        "kl_init_coef": args.algo.kl.init_coef,
        "entropy_coef": args.actor.entropy_coef,
        "lr": args.actor.adam.lr,
        "betas": list(args.actor.adam.betas),
        "lr_scheduler": args.actor.lr_scheduler,
        "lr_warmup_ratio": args.actor.lr_warmup_ratio,
        "seed": args.train.seed,
        "async_enable": args.train.async_enable,
        "async_queue_size": args.train.async_queue_size,
        "dynamic_filtering": args.algo.dynamic_filtering_enable,
        "dynamic_filtering_range": list(args.algo.dynamic_filtering_range),
        "model": args.actor.model_name_or_path,
    }


if __name__ == "__main__":
    out_path = sys.argv[1]  # parse() replaces sys.argv
    cases = json.load(sys.stdin)
    code = _main_block()
    results = []
    for case in cases:
        result = {"name": case["name"], "ok": False, "error": None, "values": {}}
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
                result["values"] = values(parse(code, case["argv"]))
            result["ok"] = True
        except SystemExit as exc:  # argparse: unknown flag or bad value
            result["error"] = f"parser exit {exc.code}: {stderr.getvalue().strip()[-2000:]}"
        except Exception as exc:  # OpenRLHF's own checks after parsing
            result["error"] = f"{type(exc).__name__}: {exc}"
        results.append(result)
    with open(out_path, "w") as out:
        json.dump({"version": importlib.metadata.version("openrlhf"), "cases": results}, out)
