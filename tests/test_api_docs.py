"""docs/api.md runs as written: its python blocks in one namespace and its `rlscale ...` lines through the CLI, in
order, from a copy of the repository's examples; then the results they show are checked."""

import json
import math
import re
import shlex
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```(python|bash)\n(.*?)^```", re.S | re.M)


def doc_blocks(text: str) -> list[tuple[str, str]]:
    """(language, code) of each python and bash block of a markdown text, in order."""
    return [(match[1], match[2]) for match in BLOCK.finditer(text)]


@pytest.fixture(scope="module")
def namespace(tmp_path_factory):
    """What running docs/api.md leaves behind (its variables), run in a fresh directory."""
    from typer.testing import CliRunner

    from rlscale.cli import app

    tmp = tmp_path_factory.mktemp("apidoc")
    (tmp / "examples").symlink_to(ROOT / "examples")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp)
        mp.delenv("RLSCALE_DB", raising=False)  # the docs' default store: ./rlscale.db
        names: dict = {}
        for language, code in doc_blocks((ROOT / "docs" / "api.md").read_text()):
            if language == "python":
                exec(compile(code, "docs/api.md", "exec"), names)
                continue
            for line in code.splitlines():
                if line.startswith("rlscale "):
                    result = CliRunner().invoke(app, shlex.split(line)[1:])
                    assert result.exit_code == 0, f"{line}: {result.output} {result.exception!r}"
        yield names, tmp


def test_the_fit_example_gives_the_fits_it_shows(namespace):
    names, _ = namespace
    columns = ["run", "A", "A_lo", "A_hi", "B", "C_mid", "identified"]
    # the table the docs show, to its printed digits (the solver's last digits move with scipy's builds)
    block = (ROOT / "docs" / "api.md").read_text().split(names["fits"][columns].to_string().splitlines()[0])[1]
    rows = [line.split()[1:] for line in block.split("```")[0].strip().splitlines()]
    shown = pd.DataFrame(rows, columns=columns).astype({c: float for c in columns[1:-1]})
    shown["identified"] = shown["identified"] == "True"
    pd.testing.assert_frame_equal(names["fits"][columns], shown, check_exact=False, rtol=1e-6, check_dtype=False)
    fits = names["fits"].set_index("run")
    assert list(fits.index) == ["cispo", "gspo", "dapo", "grpo_short"]
    assert fits.loc["cispo", "A"] == pytest.approx(0.616, abs=5e-4) and fits.loc["cispo", "identified"]
    assert fits.loc["cispo", "A_lo"] < fits.loc["cispo", "A"] < fits.loc["cispo", "A_hi"]
    assert not fits.loc["grpo_short", "identified"] and "7 points for 4 parameters" in fits.loc["grpo_short", "reason"]


def test_the_prediction_example_gives_an_interval_around_each_prediction(namespace):
    at = namespace[0]["at_4000"]
    assert (at["at"] == 4000).all() and (at["predicted_lo"] < at["predicted"]).all()
    assert (at["predicted"] < at["predicted_hi"]).all()


def test_the_decision_example_decides_as_its_text_says(namespace):
    names, _ = namespace
    rec = names["decision"].recommendation
    assert (rec.prompts_per_batch, rec.rollouts, rec.steps) == (16, 16, 80)
    lo, hi = rec.predicted_interval
    assert lo < rec.predicted_reward < hi and names["decision"].budget == 0.04
    shown = (ROOT / "docs" / "api.md").read_text()
    lines = names["rlscale"].decision_text(names["decision"]).splitlines()
    assert all(line in shown for line in lines[:4])


def test_the_stored_study_examples_read_the_study_as_the_commands_do(namespace):
    from rlscale.db.store import Store
    from rlscale.fitting.stored import study_decision

    names, tmp = namespace
    assert list(names["stored"]["run"]) == ["cispo", "gspo", "dapo", "grpo_short"]
    assert names["stored"]["A"].tolist()[:3] == pytest.approx(names["fits"]["A"].tolist()[:3], abs=1e-9)
    pd.testing.assert_frame_equal(names["stored_at_4000"], names["at_4000"])
    with Store(f"sqlite:///{tmp / 'rlscale.db'}", read_only=True) as store:
        expected = study_decision(store, "ablation").to_dict()
    assert json.dumps(names["stored_decision"].to_dict(), default=str) == json.dumps(expected, default=str)


def test_the_plot_examples_write_their_pngs(namespace):
    _, tmp = namespace
    for name in ("fits.png", "ablation.png"):
        assert (tmp / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert math.isfinite(namespace[0]["fits"]["A"].iloc[0])
