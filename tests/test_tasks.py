"""Verifiable tasks: splits, determinism, verifiers, JSONL loading and custom verifiers."""

import json

import pytest
from rlscale.planner.recipe import Recipe
from rlscale.runner.rl.tasks import make_task, math_match, normalize_math_answer

from rlscale.base.errors import UserError


def test_arithmetic_prompts_have_one_length_and_correct_answers():
    task = make_task("arithmetic", seed=0)
    prompts = task.train_prompts(200) + task.validation(50)
    assert {len(p.text) for p in prompts} == {len("07+35=")}
    for p in prompts:
        a, b = p.text[:-1].split("+")
        assert p.answer == str(int(a) + int(b))


def test_hard_variant_has_more_digits():
    prompt = make_task("arithmetic_hard", seed=0).validation(1)[0]
    assert len(prompt.text) == len("007+350=")
    assert len(make_task("arithmetic_4d", seed=0).validation(1)[0].text) == len("0007+3500=")


def test_validation_is_held_out_and_seed_independent():
    one, other = make_task("arithmetic", seed=1), make_task("arithmetic", seed=2)
    assert [p.id for p in one.validation()] == [p.id for p in other.validation()]
    assert not {p.id for p in one.validation()} & {p.id for p in one.train}
    assert 400 <= len(one.validation()) <= 512 and len(one.train) + len(one.validation()) <= 10000


def test_train_draws_are_deterministic_by_seed():
    draw = lambda seed: [p.id for p in make_task("arithmetic", seed=seed).train_prompts(20)]
    assert draw(5) == draw(5) != draw(6)


def test_arithmetic_verifier_is_exact():
    task = make_task("arithmetic", seed=0)
    prompt = task.validation(1)[0]
    assert task.verify(prompt, prompt.answer) == 1.0
    assert task.verify(prompt, f" {prompt.answer}\n") == 1.0
    assert task.verify(prompt, prompt.answer + "0") == 0.0
    assert task.verify(prompt, "") == 0.0


@pytest.mark.parametrize(
    "completion, answer, reward",
    [
        ("The answer is \\boxed{1,234}.", "1234", 1.0),
        ("1,234.", "1234", 1.0),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0),
        ("42.0", "42", 1.0),
        ("$7$", "7", 1.0),
        ("43", "42", 0.0),
        ("\\boxed{41} then \\boxed{42}", "42", 1.0),  # the last boxed answer counts
    ],
)
def test_math_answer_normalisation(completion, answer, reward):
    assert math_match(answer, completion) == reward


def test_normalize_keeps_decimal_commas_out_of_numbers():
    assert normalize_math_answer(" 12,345,678 ") == "12345678"
    assert normalize_math_answer("(1,2)") == "(1,2)"


def test_jsonl_task(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": f"Q{i}", "answer": str(i)}) for i in range(30)) + "\n")
    task = make_task(Recipe(task=str(path)))
    assert len(task.train) + len(task.validation()) == 30
    prompt = task.validation(1)[0]
    assert task.verify(prompt, f"\\boxed{{{prompt.answer}}}") == 1.0


def test_jsonl_errors_name_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a", "answer": "1"}\n{"prompt": "b"}\n')
    with pytest.raises(UserError, match=r"bad.jsonl: line 2: expected an object"):
        make_task(str(path), seed=0)


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"prompt": "b", "answer": NaN}', "answer: expected text or a finite number, got NaN"),
        ('{"prompt": "b", "answer": null}', "answer: expected text or a finite number, got null"),
        ('{"prompt": "b", "answer": ""}', 'answer: expected text or a finite number, got ""'),
        ('{"prompt": "b", "answer": [1]}', "answer: expected text or a finite number, got \\[1\\]"),
        ('{"prompt": null, "answer": "1"}', "prompt: expected text, got null"),
        ('{"prompt": {"q": 1}, "answer": "1"}', "prompt: expected text"),
    ],
)
def test_a_task_row_that_no_completion_could_match_is_refused_naming_its_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a", "answer": 1}\n' + line + "\n")
    with pytest.raises(UserError, match=rf"bad.jsonl: line 2: {message}"):
        make_task(str(path), seed=0)
    path.write_bytes(b'{"prompt": "a", "answer": 1}\n\xff\xfe\n')
    with pytest.raises(UserError, match=r"bad.jsonl: expected UTF-8 text, found byte 0xff"):
        make_task(str(path), seed=0)


def test_custom_verifier_is_imported_not_evaluated(tmp_path, monkeypatch):
    (tmp_path / "my_verifier.py").write_text("def always(answer, completion):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    task = make_task(Recipe(verifier="my_verifier:always"))
    assert task.verify(task.validation(1)[0], "wrong") == 1.0
    with pytest.raises(UserError, match="verifier"):
        make_task(Recipe(verifier="__import__('os')"))
    with pytest.raises(UserError, match="has no function"):
        make_task(Recipe(verifier="my_verifier:missing"))


def test_unknown_task_is_a_user_error():
    with pytest.raises(UserError, match="task"):
        make_task("sudoku", seed=0)
