"""Run names as trackers write them (W&B, TensorBoard paths, verl experiments) round-trip through import, fit,
report, status and export, shown as typed: markup inert, nothing interpreted by a terminal, markdown or a plot."""

import html
import json
import shlex

import numpy as np
import pytest
from helpers import NAMES, curves_csv, run_cli
from rlscale.db.store import Store
from rlscale.fitting.sigmoid import sigmoid


@pytest.fixture
def cli(monkeypatch, capsys):
    def call(*args, width: int | None = None):
        if width is not None:
            from rlscale.cli.console import console

            monkeypatch.setattr(console, "_width", width)
        return run_cli(monkeypatch, capsys, *args)

    return call


def test_realistic_names_round_trip_through_import_fit_report_and_status(cli, workdir):
    curves_csv(workdir / "runs.csv", NAMES)
    url = "sqlite:///rl.db"
    code, out, err = cli("import", "runs.csv", "--study", "logs", "--db", url, "--json")
    assert (code, err) == (0, "") and json.loads(out)["runs"] == len(NAMES)
    with Store(url) as store:
        assert store.runs_frame("logs")["run"].tolist() == NAMES  # stored as typed

    code, out, _ = cli("fit", "runs.csv", "--json")
    assert code == 0 and [fit["run"] for fit in json.loads(out)] == NAMES
    code, out, _ = cli("fit", "--study", "logs", "--db", url, "--json")
    assert code == 0 and [fit["run"] for fit in json.loads(out)] == NAMES
    assert all(fit["identified"] for fit in json.loads(out))

    code, out, err = cli("report", "logs", "--db", url, "--bootstrap", "0", "--json")
    assert (code, err) == (0, "")
    payload = json.loads(out)
    assert [row["run"] for row in payload["fits"]] == NAMES
    page = (workdir / "reports" / "logs" / "report.html").read_text()
    assert all(html.escape(name) in page for name in NAMES)
    markdown = (workdir / "reports" / "logs" / "report.md").read_text()
    # escaped so that a markdown viewer shows them as typed: no link, emphasis, math or broken table
    assert r"| \[bold\]x\[/bold\] |" in markdown and r"cost \$5 \*draft\* \_v2" in markdown

    for command in (
        ("fit", "--study", "logs", "--db", url),
        ("report", "logs", "--db", url, "--bootstrap", "0"),
        ("status", "logs", "--db", url),
    ):
        code, out, err = cli(*command, width=400)  # wide: one row per run, names whole
        assert (code, err) == (0, ""), command
        assert all(name in out for name in NAMES), (command, out)
        assert "\x1b" not in out


def test_names_wrap_in_80_columns_and_every_line_fits(cli, workdir):
    curves_csv(workdir / "runs.csv", NAMES)
    code, out, err = cli("fit", "runs.csv", width=80)
    assert (code, err) == (0, "")
    assert max(map(len, out.splitlines())) <= 80, out
    # the run column read down: a wrapped name joins up again
    run_column = "".join(line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│"))
    assert "qwen2.5-7b/lr=1e-6,bs=256" in run_column and "[bold]x[/bold]" in run_column


def test_plots_show_names_literally_without_warnings(cli, workdir):
    curves_csv(workdir / "runs.csv", ["cost $5 and $10", "_hidden", "温度"])
    code, out, err = cli("fit", "runs.csv", "--plot", "runs.png")
    assert (code, err) == (0, "") and (workdir / "runs.png").stat().st_size > 0
    from rlscale.views.plots import plot_text

    assert plot_text("cost $5 and $10") == r"cost \$5 and \$10"  # not mathtext
    assert plot_text("_hidden") == " _hidden"  # a legend drops labels starting with "_"


def test_training_logs_are_named_by_their_directory_path_or_file_name(cli, workdir):
    from helpers import REWARD, write_events

    write_events(workdir / "tb" / "grpo" / "seed_1", {s: {REWARD: 0.1 * s} for s in range(3)})
    write_events(workdir / "tb" / "GRPO (clip 0.2)", {s: {REWARD: 0.1 * s} for s in range(3)})
    verl = workdir / "qwen2.5-7b lr=1e-6,bs=256.jsonl"
    verl.write_text("".join(json.dumps({"step": s, "data": {REWARD: 0.1 * s}}) + "\n" for s in range(3)))
    url = "sqlite:///rl.db"
    for path in ("tb", verl.name):
        code, _, err = cli("import", path, "--study", "logs", "--db", url)
        assert (code, err) == (0, "")
    with Store(url) as store:
        assert sorted(store.runs_frame("logs")["run"]) == [
            "GRPO (clip 0.2)",
            "grpo/seed_1",
            "qwen2.5-7b lr=1e-6,bs=256",
        ]


def test_export_names_the_chosen_run_as_typed(cli, workdir):
    from rlscale.planner.recipe import Recipe

    url = "sqlite:///rl.db"
    compute = np.geomspace(10, 2000, 25)
    with Store(url) as store:
        for i, name in enumerate(["GRPO (clip 0.2)", "qwen2.5-7b/lr=1e-6,bs=256"]):
            run_id = store.ensure_run("runs", name, Recipe(rollouts=8 * (i + 1)).to_json(), 0)
            rewards = sigmoid(compute, 0.5 + 0.1 * i, 1.5, 300.0, 0.1)
            store.add_records(
                run_id,
                [
                    {"step": s, "gpu_hours": float(c), "val_reward": float(r)}
                    for s, (c, r) in enumerate(zip(compute, rewards))
                ],
            )
            store.set_run_status(run_id, "done")
    code, out, err = cli("export", "--format", "yaml", "--study", "runs", "--db", url)
    assert (code, err) == (0, "")
    # two rollouts values: the study decides an allocation, from the run named as typed
    assert "from run qwen2.5-7b/lr=1e-6,bs=256" in out
    # the report names the export that just ran: whether a decision exports is one fact
    code, out, err = cli("report", "runs", "--db", url, "--out", "report", "--json", "--bootstrap", "0")
    assert code == 0, err
    export = shlex.split(json.loads(out)["decision"]["commands"]["export"])
    assert export[:5] == ["rlscale", "export", "--format", "verl", "--study"]
    code, out, err = cli(*export[1:])
    assert code == 0 and "from run qwen2.5-7b/lr=1e-6,bs=256" in out, err


def test_a_long_plot_title_wraps_inside_its_figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rlscale.views.plots import set_title

    reason = (
        "the frontier has not bent: n* is still moving at the largest compute observed (30); the last n* = 32 "
        "holds over only 2% of the log-compute range (need 20%), so extrapolation would be a guess"
    )
    for size, fontsize in (((8, 4), 9), ((8, 5), 10), ((10, 5), 10)):
        fig, ax = plt.subplots(figsize=size, dpi=120)
        set_title(ax, f"Optimal n: frontier and law (not identified: {reason})", fontsize=fontsize)
        fig.tight_layout()
        fig.canvas.draw()
        box = ax.title.get_window_extent()
        assert 0 <= box.x0 and box.x1 <= fig.bbox.width and box.y1 <= fig.bbox.height, (size, box)
        plt.close(fig)
