"""The user's dataset as a `trl grpo` YAML names it, loaded where `trl grpo` cannot (a single file, a save_to_disk
directory) and checked; one without a held-out split gets one split off its train split with a fixed seed."""

import logging
from pathlib import Path

from rlscale.base.errors import UserError

BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv", ".arrow": "arrow"}
SAVED_MARKERS = ("dataset_dict.json", "state.json")  # what save_to_disk writes (a DatasetDict, a Dataset)
HELD_OUT_SEED = 0


def dataset_source(script_args, mixture) -> str:
    """What the messages name as the dataset's file: the mixture's paths or dataset_name."""
    if mixture.datasets:
        return ", ".join(str(entry.data_files or entry.path) for entry in mixture.datasets)
    return str(script_args.dataset_name)


def load_splits(script_args, mixture, *, eval_prompts: int) -> tuple:
    """(train, held_out) datasets.Dataset of the user's config; held_out is at most eval_prompts rows. UserError naming
    the dataset and the field when it cannot be loaded or has no such split."""
    source = dataset_source(script_args, mixture)
    if script_args.dataset_streaming or mixture.streaming:
        raise UserError(
            "a streamed dataset cannot be checked or held out; expected streaming: false",
            file=source,
            field="dataset_streaming",
        )
    splits, held_out_size = _load(script_args, mixture, source)
    name = script_args.dataset_train_split
    if name not in splits:
        raise UserError(f"no split {name!r} (splits: {', '.join(splits)})", file=source, field="dataset_train_split")
    train = splits[name]
    test = splits.get(script_args.dataset_test_split)
    if test is None:
        size = held_out_size or eval_prompts
        if len(train) <= size:
            raise UserError(
                f"no split {script_args.dataset_test_split!r} to take the study's reward on, and "
                f"{len(train)} train rows are too few to hold out {size}",
                file=source,
                field="dataset_test_split",
            )
        parts = train.train_test_split(test_size=size, seed=HELD_OUT_SEED)
        train, test = parts["train"], parts["test"]
    return train, test.select(range(min(eval_prompts, len(test))))


def _load(script_args, mixture, source: str) -> tuple[dict, float | int | None]:
    import datasets

    datasets.disable_progress_bars()  # the sweep's terminal shows its own progress
    datasets.logging.set_verbosity(logging.CRITICAL)  # its errors reach the user as one line, below
    try:
        if mixture.datasets:
            from trl import get_dataset

            size, mixture.test_split_size = mixture.test_split_size, None  # TRL's split has no seed
            return dict(get_dataset(mixture)), size
        if not script_args.dataset_name:
            raise UserError("expected dataset_name or datasets", field="dataset_name")
        path = Path(script_args.dataset_name)
        if path.is_file():
            builder = BUILDERS.get(path.suffix)
            if builder is None:
                raise UserError(
                    f"expected a {', '.join(BUILDERS)} file or a dataset directory", file=source, field="dataset_name"
                )
            loaded = datasets.load_dataset(builder, data_files=str(path))
        elif path.is_dir() and any((path / marker).is_file() for marker in SAVED_MARKERS):
            loaded = datasets.load_from_disk(str(path))
        else:
            loaded = datasets.load_dataset(script_args.dataset_name, name=script_args.dataset_config)
    except UserError:
        raise
    except Exception as err:  # datasets raises many kinds (FileNotFoundError, DatasetGenerationError, ...)
        field = "datasets" if mixture.datasets else "dataset_name"
        root = err
        while root.__cause__ is not None or root.__context__ is not None:
            root = root.__cause__ or root.__context__
        raise UserError(
            f"cannot load the dataset ({type(root).__name__}: {_line(root)})", file=source, field=field
        ) from None
    return ({"train": loaded} if isinstance(loaded, datasets.Dataset) else dict(loaded)), None


def check_rows(dataset, *, columns: list[str], split: str, source: str) -> bool:
    """Whether the prompts are conversational, after checking every row has a usable prompt and a value in each of
    `columns` (what the reward functions take); UserError naming the column and the first bad row."""
    for column in ["prompt", *columns]:
        if column not in dataset.column_names:
            raise UserError(
                f"no column {column!r} in the {split} split (columns: {', '.join(dataset.column_names)})",
                file=source,
                field=column,
            )
    prompts = dataset["prompt"]
    conversational = bool(prompts) and isinstance(prompts[0], list)
    for row, prompt in enumerate(prompts):
        problem = _conversation_problem(prompt) if conversational else _text_problem(prompt)
        if problem:
            kind = "a list of {role, content} messages" if conversational else "a non-empty text"
            raise UserError(
                f"row {row} of the {split} split: {problem}; expected {kind} (as in row 0)", file=source, field="prompt"
            )
    for column in columns:
        row = next((row for row, value in enumerate(dataset[column]) if value is None), None)
        if row is not None:
            raise UserError(f"row {row} of the {split} split has no value", file=source, field=column)
    return conversational


def _text_problem(prompt) -> str | None:
    if not isinstance(prompt, str):
        return f"a {type(prompt).__name__}"
    return None if prompt.strip() else "empty"


def _conversation_problem(prompt) -> str | None:
    if not isinstance(prompt, list) or not prompt:
        return "empty" if isinstance(prompt, list) else f"a {type(prompt).__name__}"
    for message in prompt:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) or message.get("content") is None:
            return f"message {message!r:.60} has no role or content"
    return None


def check_chat_template(model: str, *, source: str) -> None:
    """UserError naming the model's directory when conversational prompts meet a local tokenizer without a chat
    template (TRL applies it to every prompt); a Hub model is not looked up."""
    if not Path(model).is_dir():
        return
    from transformers import AutoTokenizer

    if AutoTokenizer.from_pretrained(model).chat_template is None:
        raise UserError(
            f"the prompts of {source} are conversational, and this model's tokenizer has no chat template "
            "(add chat_template.jinja, or use text prompts)",
            file=model,
            field="chat_template",
        )


def _line(err: Exception) -> str:
    lines = str(err).strip().splitlines() or [""]
    return (lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}")[:240]  # datasets puts the reason last
