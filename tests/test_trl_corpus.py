"""TRL's own GRPO example settings (tests/data/trl_configs/, each with its source named) as the `setup.config` of a
study over B_p and n: each composes every point's job config (runner/trl/setup.py: TRL's parser in this process,
then TRL's parser again in .venv-trl on the config the job would read, which must train the planned n and batch),
or is refused with one line naming the file and the key. None may compose here and be refused by TRL there.

`.venv/bin/python tests/test_trl_corpus.py` prints the table docs/benchmarks.md quotes."""

import json
import subprocess
import tempfile
from pathlib import Path

import yaml

TESTS = Path(__file__).resolve().parent
CORPUS = TESTS / "data" / "trl_configs"
ROOT = TESTS.parent
PROMPTS_PER_BATCH, ROLLOUTS = [8, 16], [4, 8]
AXIS_KEYS = ("num_generations", "generation_batch_size", "steps_per_generation")  # what the two axes change
# file -> the key it is refused on; every other file composes all four points
REFUSED = {
    "paper_80_20": "per_device_train_batch_size",
    "paper_dapo": "per_device_train_batch_size",
    "paper_deepseekmath": "gradient_accumulation_steps",
    "paper_lite_ppo": "gradient_accumulation_steps",
}


def corpus_study(folder: Path, config: Path) -> Path:
    """A grid over B_p x n on `config`; the axes' keys the file sets are the study's to replace (as a user answers
    the conflict the first dry-run names)."""
    keys = yaml.safe_load(config.read_text()) or {}
    study = {
        "name": "corpus",
        "method": "grid",
        "parameters": {"prompts_per_batch": {"values": PROMPTS_PER_BATCH}, "rollouts": {"values": ROLLOUTS}},
        "recipe": {"engine": "trl", "steps": 20, "eval_every": 10, "checkpoint_every": 10},
        "setup": {"config": str(config), "replace": [key for key in AXIS_KEYS if key in keys]},
    }
    path = folder / f"{config.stem}.study.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def compose_file(config: Path, folder: Path) -> dict:
    """{"file", "composed": [(recipe, the job's keys)], "refused": the one-line message or None}."""
    from rlscale.planner.frameworks.setup import setup_plan
    from rlscale.planner.planning import planned_runs
    from rlscale.planner.study_file import load_study
    from rlscale.runner.jobs_api import RunDir
    from rlscale.runner.trl.job import make_setup_job

    from rlscale.base.errors import UserError

    out = {"file": config.name, "composed": [], "refused": None}
    try:
        study = load_study(corpus_study(folder, config))
        plan = setup_plan(study)
        for number, point in enumerate(planned_runs(study)):
            run_dir = RunDir(folder / "shared" / f"{config.stem}-{number}")
            job = make_setup_job(plan, point.recipe, run_dir, f"{config.stem}-{number}-1", until_step=20, python="py")
            out["composed"].append((point.recipe, job.config))
    except UserError as err:
        out["refused"] = str(err)
    return out


def trl_reads(configs: list[dict], python: Path) -> list[dict]:
    """TRL 1.16.0 in .venv-trl (`python`) reads each job config as `trl grpo --config` does (checkers/trl_check.py)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "read.json"
        done = subprocess.run(
            [str(python), str(TESTS / "checkers" / "trl_check.py"), str(out), "--parse"],
            input=json.dumps(configs),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(out.read_text())["cases"]


def corpus(python: Path) -> list[dict]:
    """Every corpus file composed, and TRL's reading (in `python`) of every composed job config (result["read"])."""
    with tempfile.TemporaryDirectory() as tmp:
        results = [compose_file(config, Path(tmp)) for config in sorted(CORPUS.glob("*.yaml"))]
    cases = [
        {"name": f"{result['file']}#{index}", "yaml": yaml.safe_dump(keys)}
        for result in results
        for index, (_, keys) in enumerate(result["composed"])
    ]
    read = {case["name"]: case for case in trl_reads(cases, python)} if cases else {}
    for result in results:
        result["read"] = [read[f"{result['file']}#{index}"] for index in range(len(result["composed"]))]
    return results


def test_each_example_composes_through_trls_parser_or_is_refused_naming_the_file_and_the_key():
    from helpers import python_of

    results = corpus(python_of(".venv-trl"))
    assert len(results) >= 20
    for result in results:
        stem = result["file"].removesuffix(".yaml")
        if stem in REFUSED:
            message = result["refused"]
            assert message is not None and "\n" not in message, result
            assert message.startswith(f"{CORPUS / result['file']}: {REFUSED[stem]}: "), message
            continue
        assert result["refused"] is None, result["refused"]
        assert len(result["composed"]) == len(PROMPTS_PER_BATCH) * len(ROLLOUTS)
        for (recipe, keys), read in zip(result["composed"], result["read"]):
            assert read["ok"], (result["file"], read["error"])  # TRL's own parser takes what the job reads
            values = read["values"]
            assert values["num_generations"] == recipe.rollouts, result["file"]
            assert values["generation_batch_size"] == recipe.prompts_per_batch * recipe.rollouts, result["file"]
            assert keys["max_steps"] == values["max_steps"] == 20 * values["updates_per_generation"]


def table(results: list[dict]) -> str:
    lines = ["| file | points composed | refused (the one line) |", "|---|---|---|"]
    for result in results:
        agreed = sum(1 for read in result["read"] if read["ok"])
        refused = result["refused"] or ""
        refused = refused.replace(str(CORPUS) + "/", "")
        lines.append(f"| {result['file']} | {agreed} of {len(PROMPTS_PER_BATCH) * len(ROLLOUTS)} | {refused} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(corpus(ROOT / ".venv-trl" / "bin" / "python")))
