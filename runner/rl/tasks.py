"""Verifiable tasks: prompts with known answers, a binary verifier, train and validation splits.
`make_task` knows `arithmetic` (2-digit sums), `arithmetic_hard` (3), `arithmetic_<d>d` and {prompt, answer} .jsonl."""

from __future__ import annotations

import importlib
import json
import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlscale.base.errors import UserError

Verifier = Callable[[str, str], float]

ARITHMETIC_DIGITS = {"arithmetic": 2, "arithmetic_hard": 3}
VALIDATION_FRACTION = 0.1  # of the arithmetic pairs, held out by a seed-independent hash
MAX_VALIDATION = 512


@dataclass(frozen=True)
class Prompt:
    """One task instance: a stable id (for pass-rate history), the prompt text and its reference answer."""

    id: int
    text: str
    answer: str


class Task:
    """Train prompts, held-out validation prompts and a binary verifier; deterministic by seed."""

    def __init__(self, name: str, train: list[Prompt], validation: list[Prompt], verifier: Verifier, seed: int):
        if not train or not validation:
            raise UserError("task needs at least one train and one validation prompt", field=name)
        self.name = name
        self.train = train
        self.validation_prompts = validation
        self.verifier = verifier  # (answer, completion) -> bool
        self._rng = random.Random(seed)

    def train_prompts(self, count: int) -> list[Prompt]:
        """`count` train prompts drawn uniformly with replacement (the local loop uses a PromptPool instead)."""
        return [self._rng.choice(self.train) for _ in range(count)]

    def validation(self, count: int | None = None) -> list[Prompt]:
        """The first `count` held-out prompts (the same ones for every seed, so runs are comparable)."""
        return self.validation_prompts[:count] if count else list(self.validation_prompts)

    def verify(self, prompt: Prompt, completion: str) -> float:
        """1.0 if `completion` answers `prompt` correctly, else 0.0."""
        return float(self.verifier(prompt.answer, completion))


def exact_match(answer: str, completion: str) -> float:
    """1.0 if the completion, stripped of surrounding whitespace, equals the answer."""
    return float(completion.strip() == answer.strip())


_BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")
_NUMBER_COMMAS = re.compile(r"(?<=\d),(?=\d{3}\b)")


def normalize_math_answer(text: str) -> str:
    """Canonical form of a final answer: last \\boxed{...} content, stripped, no trailing '.', no thousands commas."""
    boxed = _BOXED.findall(text)
    if boxed:
        text = boxed[-1]
    text = text.strip().rstrip(".").strip()
    text = _NUMBER_COMMAS.sub("", text)
    if text.startswith("$") and text.endswith("$") and len(text) > 1:
        text = text.strip("$").strip()
    return text


def math_match(answer: str, completion: str) -> float:
    """1.0 if the normalised completion equals the normalised answer (numbers compared by value)."""
    got, want = normalize_math_answer(completion), normalize_math_answer(answer)
    if got == want:
        return 1.0
    try:
        return float(float(got) == float(want))
    except ValueError:
        return 0.0


def load_verifier(spec: str) -> Verifier:
    """Import `module:function` (never eval'd); the function takes (answer, completion) and returns 0/1."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UserError(f"expected 'module:function', got {spec!r}", field="verifier")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise UserError(f"cannot import module {module_name!r}: {err}", field="verifier") from None
    function = getattr(module, attr, None)
    if not callable(function):
        raise UserError(f"module {module_name!r} has no function {attr!r}", field="verifier")
    return function


def arithmetic_prompt(a: int, b: int, digits: int) -> str:
    """The prompt for a + b with zero-padded operands, e.g. '07+35=' (every prompt has one length)."""
    return f"{a:0{digits}d}+{b:0{digits}d}="


def _is_validation_pair(a: int, b: int) -> bool:
    # a fixed multiplicative hash, not Python's salted hash(): the split must not depend on the process
    return (a * 2654435761 + b * 40503) % 1000 < VALIDATION_FRACTION * 1000


def arithmetic_task(digits: int, seed: int, *, name: str | None = None, train_size: int = 20000) -> Task:
    """d-digit addition: all pairs (sampled for d > 2), split train/validation by a fixed hash of the pair."""
    if not 1 <= digits <= 6:
        raise UserError(f"arithmetic digits must be 1-6, got {digits}", field="task")
    top = 10**digits
    if top * top <= 4 * train_size:
        pairs = [(a, b) for a in range(top) for b in range(top)]
    else:
        pair_rng = random.Random(1234 + digits)  # the instance set is part of the task, not of the seed
        pairs = sorted(
            {(pair_rng.randrange(top), pair_rng.randrange(top)) for _ in range(train_size + train_size // 5)}
        )
    train, validation = [], []
    for a, b in pairs:
        prompt = Prompt(id=a * top + b, text=arithmetic_prompt(a, b, digits), answer=str(a + b))
        (validation if _is_validation_pair(a, b) else train).append(prompt)
    random.Random(99).shuffle(validation)  # a fixed order, so `validation(k)` is a spread-out subset
    return Task(name or f"arithmetic_{digits}d", train, validation[:MAX_VALIDATION], exact_match, seed)


def jsonl_task(path: str | Path, seed: int, *, verifier: Verifier = math_match, validation_size: int = 128) -> Task:
    """A task from a JSONL file of {"prompt", "answer"} lines; validation is the head of a seed-independent shuffle."""
    path = Path(path)
    if not path.is_file():
        raise UserError("file not found", file=str(path), field="task")
    prompts = []
    from rlscale.db.importer import read_text  # the one UTF-8 reader of user files: a bad byte is a UserError

    for number, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise UserError(f"invalid JSON: {err.msg}", file=str(path), field=f"line {number}") from None
        if not isinstance(row, dict) or "prompt" not in row or "answer" not in row:
            raise UserError('expected an object with "prompt" and "answer"', file=str(path), field=f"line {number}")
        where = {"file": str(path), "field": f"line {number}"}
        prompt, answer = row["prompt"], row["answer"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise UserError(f"prompt: expected text, got {json.dumps(prompt)}", **where)
        finite = isinstance(answer, int | float) and not isinstance(answer, bool) and math.isfinite(answer)
        if not (finite or (isinstance(answer, str) and answer.strip())):  # a NaN or null answer matches nothing
            raise UserError(f"answer: expected text or a finite number, got {json.dumps(answer)}", **where)
        prompts.append(Prompt(id=len(prompts), text=prompt, answer=str(answer)))
    if len(prompts) < 2:
        raise UserError("need at least 2 {prompt, answer} lines", file=str(path))
    order = list(range(len(prompts)))
    random.Random(99).shuffle(order)
    held = min(validation_size, max(1, len(prompts) // 10))
    validation = [prompts[i] for i in order[:held]]
    train = [prompts[i] for i in sorted(order[held:])]
    return Task(path.name, train, validation, verifier, seed)


def make_task(recipe_or_name, seed: int | None = None) -> Task:
    """The task a recipe names (or a task name), with the recipe's custom verifier if it has one."""
    name = getattr(recipe_or_name, "task", recipe_or_name)
    verifier_spec = getattr(recipe_or_name, "verifier", None)
    if seed is None:
        seed = getattr(recipe_or_name, "seed", 0)
    if name.endswith(".jsonl"):
        return jsonl_task(name, seed, verifier=load_verifier(verifier_spec) if verifier_spec else math_match)
    match = re.fullmatch(r"arithmetic_(\d)d", name)
    if name in ARITHMETIC_DIGITS or match:
        task = arithmetic_task(ARITHMETIC_DIGITS.get(name) or int(match.group(1)), seed, name=name)
        if verifier_spec:
            task.verifier = load_verifier(verifier_spec)
        return task
    raise UserError(
        f"expected 'arithmetic', 'arithmetic_hard', 'arithmetic_<d>d' or a .jsonl file, got {name!r}", field="task"
    )
