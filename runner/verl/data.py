"""A recipe's task as verl's data: train and validation parquet files in the schema verl's RLHFDataset reads."""

from pathlib import Path

from rlscale.runner.rl.tasks import exact_match, make_task, math_match

DATA_SOURCE = "rlscale"  # verl names its validation metric val-core/<data_source>/reward/mean@<k> after it
ABILITY = "math"


def verifier_name(recipe) -> str:
    """What extra_info["verifier"] names: the recipe's 'module:function', or the task's own verifier by name."""
    if recipe.verifier:
        return recipe.verifier
    verifier = make_task(recipe).verifier
    return {exact_match: "exact_match", math_match: "math_match"}[verifier]


def task_rows(recipe, split: str) -> list[dict]:
    """One verl row per prompt of the split ("train": every train prompt; "test": the first eval_prompts held-out, the
    same for every seed): data_source, chat prompt, ability, reward_model.ground_truth, extra_info."""
    task = make_task(recipe)
    prompts = task.train if split == "train" else task.validation(recipe.eval_prompts)
    verifier = verifier_name(recipe)
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": prompt.text}],
            "ability": ABILITY,
            "reward_model": {"style": "rule", "ground_truth": prompt.answer},
            "extra_info": {"split": split, "index": index, "prompt_id": prompt.id, "verifier": verifier},
        }
        for index, prompt in enumerate(prompts)
    ]


def write_task_parquet(recipe, directory: Path) -> tuple[Path, Path]:
    """Write train.parquet and val.parquet for `recipe`'s task into `directory`; returns their paths."""
    import pandas as pd

    directory.mkdir(parents=True, exist_ok=True)
    paths = directory / "train.parquet", directory / "val.parquet"
    for path, split in zip(paths, ("train", "test")):
        partial = path.with_name(path.name + ".partial")
        pd.DataFrame(task_rows(recipe, split)).to_parquet(partial, index=False)
        partial.replace(path)  # a reader never sees half a file
    return paths
