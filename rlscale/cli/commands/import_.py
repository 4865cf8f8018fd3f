"""`rlscale import SOURCE --study NAME`: load run logs into the store: CSV/JSONL tracker exports, a directory of
TensorBoard event files (one run per subdirectory), verl's file-logger JSONL, W&B run directories, or the runs of
an MLflow experiment (--mlflow URI --experiment NAME) or a trackio project (--trackio PROJECT)."""

from dataclasses import asdict
from pathlib import Path

import typer

from rlscale.base.errors import UserError
from rlscale.base.names import check_name
from rlscale.cli.console import print_json, say
from rlscale.cli.options import ComputeTag, DbUrl, RewardTag
from rlscale.db.engine import lasting_url


def register(app: typer.Typer) -> None:
    @app.command("import")
    def import_(
        file: Path = typer.Argument(
            None,
            help="run log: .csv or .jsonl with run, compute (or gpu_hours), reward[, step, rollouts, tokens]; "
            "a TensorBoard directory; a verl file-logger .jsonl; or W&B run directories (./wandb)",
        ),
        study: str = typer.Option(..., "--study", help="study to add the runs to (created if new)"),
        db: DbUrl = None,
        json_out: bool = typer.Option(False, "--json", help="print the summary as JSON"),
        mlflow: str = typer.Option(
            None, "--mlflow", help="an MLflow tracking URI (sqlite:///mlflow.db, ./mlruns, http://...) to read from"
        ),
        experiment: str = typer.Option(None, "--experiment", help="with --mlflow: the experiment (name or id)"),
        trackio: str = typer.Option(None, "--trackio", help="a trackio project to read (in TRACKIO_DIR)"),
        reward: RewardTag = None,
        compute: ComputeTag = None,
        gpus: float = typer.Option(
            None, "--gpus", help="trackers: compute is GPU-hours from each step's wall time x this many GPUs"
        ),
    ) -> None:
        """Import run logs into a study; steps already stored are skipped, so importing twice adds nothing."""
        from rlscale.db.importer import import_run_log, read_run_log
        from rlscale.db.store import Store

        if sum(source is not None for source in (file, mlflow, trackio)) != 1:
            raise UserError("give one source: a FILE or directory, --mlflow URI or --trackio PROJECT", field="import")
        if experiment is not None and mlflow is None:
            raise UserError("--experiment names an MLflow experiment: give --mlflow URI too", field="--experiment")
        # the whole source is read and checked before the store is opened (or created)
        check_name(study, field="study", what="study name")
        lasting_url(db)
        if mlflow is not None:
            from rlscale.db.trackers import read_mlflow_log

            rows = read_mlflow_log(mlflow, experiment, reward=reward, compute=compute, gpus=gpus)
        elif trackio is not None:
            from rlscale.db.trackers import read_trackio_log

            rows = read_trackio_log(trackio, reward=reward, compute=compute, gpus=gpus)
        else:
            rows = read_run_log(file, tag=reward, compute_tag=compute, gpus=gpus)
        source = rows.attrs.get("source") or str(file)
        store = Store(db)
        summary = import_run_log(store, source, study, rows)
        unit = rows.attrs.get("compute_unit")
        note = rows.attrs.get("compute_note")
        if unit and not note:
            from rlscale.db.logs import compute_note

            note = compute_note(unit)
        left_out = rows.attrs.get("runs_left_out", [])
        if json_out:
            print_json(
                {
                    **asdict(summary),
                    "db": store.url_for_display,
                    "compute_unit": unit,
                    "compute_note": note,
                    "runs_left_out": left_out,
                }
            )
            return
        say(
            f"{summary.file} -> study {summary.study} in {store.url_for_display}: {summary.runs} runs "
            f"({summary.runs_created} new), {summary.records_added} records added, {summary.records_skipped} "
            "already stored"
        )
        tags = sorted(set(rows.attrs.get("reward_tags", {}).values()))
        if reward is None and tags:  # the reward read by default: say which
            say(f"reward: {', '.join(tags)}")
        if note:
            say(f"compute: {note}")
        if left_out:
            say(f"left out, no {reward or ' or '.join(tags) or 'reward'!r} logged: {', '.join(left_out)}")
