"""`rlscale COMMAND --help`: the command's description and every option's help are shown whole (help is rendered as
Markdown so that it wraps to the terminal; nothing in it may be read as markup and dropped, e.g. `<source>`)."""

import inspect
import json
import re

import pytest
import typer
from helpers import run_cli

from rlscale.cli import app

COMMANDS = typer.main.get_command(app).commands


def _flat(text: str) -> str:
    """Text as a reader sees it in the terminal: box drawing, backticks (shown as code) and line breaks removed."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text.replace("`", "")).split())


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_shows_the_description_and_every_option_help_whole(name, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "400")  # no wrapping: each help string must appear as written
    code, out, _ = run_cli(monkeypatch, capsys, name, "--help")
    assert code == 0
    shown = _flat(out)
    command = COMMANDS[name]
    for paragraph in inspect.cleandoc(command.help or "").split("\n\n"):
        assert _flat(paragraph) in shown, f"{name}: description paragraph not shown whole: {paragraph!r}"
    for param in command.params:
        help_text = getattr(param, "help", None)
        if help_text:
            assert _flat(help_text) in shown, f"{name} {param.opts}: help not shown whole: {help_text!r}"


@pytest.mark.parametrize(
    "args, message",
    [
        (("fit", "--json", "--bogus"), "error: No such option: --bogus (see rlscale fit --help)"),
        (("status", "--json"), "error: Missing argument 'study'. (see rlscale status --help)"),
        (("recommend", "--study", "s"), "error: Missing option '--budget'. (see rlscale recommend --help)"),
        (("nosuch",), "error: No such command 'nosuch'. (see rlscale --help)"),
    ],
)
def test_a_usage_error_is_one_line_exit_2_and_on_stdout_only_as_asked_json(cli, args, message):
    code, out, err = cli(*args)
    assert code == 2 and err.strip() == message
    assert (json.loads(out)["error"] if "--json" in args else out) == (message[len("error: ") :] if out else "")


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_at_80_columns_cuts_no_option_name(name, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run_cli(monkeypatch, capsys, name, "--help")
    assert code == 0 and "…" not in out and max(map(len, out.splitlines())) <= 80
