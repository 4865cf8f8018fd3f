"""`rlscale fit`: per-run sigmoid fits of a run-log file, or of a study's stored records (saved back)."""

import math
import warnings
from pathlib import Path

import typer

from rlscale.base.errors import UserError
from rlscale.base.numbers import format_number, json_safe
from rlscale.cli.console import console, print_json, safe, say
from rlscale.cli.options import ComputeTag, DbUrl, RewardTag, check_fit_source, check_out_dir

# Keys of `fit --json`, in order (docs/methods.md section 7); scripts rely on them. `noise`: the noise model used.
JSON_KEYS = ("run", "A", "B", "C_mid", "R0", "rss", "r2", "A_lo", "A_hi", "n_points", "identified", "reason", "noise")
# Added by --at: the predicted mean reward over the last 10% of compute up to `at` and its prediction interval.
# `rlscale fit --study` with these shows the study's fit of record (and stores it); other options are shown only
DEFAULT_OPTIONS = dict(r0=None, min_compute=0.0, noise="auto", bounded=True)
PREDICTION_KEYS = ("at", "predicted", "predicted_lo", "predicted_hi", "level")
# Added by --target: the compute at which the run is predicted to reach `target`, its interval at `reach_level`, and
# reach_code (laws.target): reached, reached_unbounded (no upper end), at_start, not_reached (below A),
# a_not_identified (below an A not identified), not_fitted.
TARGET_KEYS = ("target", "reach_code", "reach_compute", "reach_compute_lo", "reach_compute_hi", "reach_level")


def register(app: typer.Typer) -> None:
    @app.command("fit")
    def fit(
        file: Path = typer.Argument(
            None,
            help=(
                "run log: .csv or .jsonl with run (optional), compute or gpu_hours, reward; a TensorBoard directory; "
                "a verl file-logger .jsonl"
            ),
        ),
        study: str = typer.Option(
            None, "--study", help=("fit the stored records of this study instead of a file, and save the fits")
        ),
        db: DbUrl = None,
        r0: float = typer.Option(None, "--r0", help="reward before RL, held fixed (default: fitted)"),
        min_compute: float = typer.Option(
            0.0,
            "--min-compute",
            min=0.0,
            metavar="<float>",
            help=("drop points below this compute (ScaleRL: ~1.5k of 16k GPU-hours)"),
        ),
        noise: str = typer.Option(
            "auto",
            "--noise",
            help=(
                "reward noise around the curve: auto (chosen by likelihood), binomial (pass rates), constant (plain "
                "least squares), multiplicative"
            ),
        ),
        unbounded: bool = typer.Option(
            False, "--unbounded", help=("the metric is not a pass rate in [0, 1] (A and R0 unbounded)")
        ),
        json_out: bool = typer.Option(False, "--json", help="print a JSON list, one object per run"),
        plot: Path = typer.Option(
            None, "--plot", help=("also write a PNG: points (filled: those fitted), curves, bands")
        ),
        at: float = typer.Option(
            None,
            "--at",
            help=(
                "also predict each run's mean reward over the last 10% of compute up to C, with a prediction interval"
            ),
        ),
        target: float = typer.Option(
            None,
            "--target",
            help=(
                "also give the compute at which each run is predicted to reach reward R, with an interval, or say "
                "it is not reached below A"
            ),
        ),
        level: float = typer.Option(0.9, "--level", help="the intervals' level (with --at and --target)"),
        tag: RewardTag = None,
        compute_tag: ComputeTag = None,
    ) -> None:
        """Fit R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) per run; say when A is not identified."""
        check_fit_source(
            file, study, db, command="fit", noise=noise, unbounded=unbounded, r0=r0, tags=(tag, compute_tag)
        )
        if plot is not None and plot.suffix.lower() != ".png":
            raise UserError(f"expected a file name ending in .png, got {plot.name!r}", field="--plot")
        if plot is not None:
            check_out_dir(plot.parent, plot.name, "--plot")
        if at is not None and not (math.isfinite(at) and at > 0):
            raise UserError(f"expected a finite compute > 0, got {at:g}", field="--at")
        if target is not None and not math.isfinite(target):
            raise UserError(f"expected a finite reward, got {target:g}", field="--target")
        if not 0.0 < level < 1.0:
            raise UserError(f"expected a level in (0, 1), got {level:g}", field="--level")
        if not math.isfinite(min_compute):
            raise UserError(f"expected a finite compute >= 0, got {min_compute:g}", field="--min-compute")
        options = dict(r0=r0, min_compute=min_compute, noise=noise, bounded=not unbounded)
        predictions = targets = None
        # Overflow in a plot's axis or a degenerate run's fit is handled there; it must not print above a
        # result or a one-line error.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            records, fits, title, store, record_breaking, draws = _fit_and_plot(
                file, study, db, options, plot, (tag, compute_tag)
            )
            if at is not None:
                from rlscale.fitting.laws.predict import predict_runs

                predictions = predict_runs(
                    records, at, level=level, run_col="run", compute_col="compute", reward_col="reward", **options
                )
            if target is not None and draws is not None:  # the fit of record's, as the report reads them
                from rlscale.fitting.laws.target import curve_targets

                targets = curve_targets(fits, draws, target, level=level)
            elif target is not None:
                targets = _targets(records, record_breaking, target, level, options)
        if json_out:
            print_json(fits_json(fits, predictions, targets))
            return
        from rlscale.cli.views import print_fits
        from rlscale.fitting.sigmoid.points import fitted_points_label

        print_fits(fits, title=f"{title}: sigmoid fits (on {fitted_points_label(record_breaking)})")
        if store is not None:
            say(f"saved {len(fits)} fits of study {study!r} to {store.url_for_display}")
        elif study is not None:
            say("shown with your options; the store keeps the study's fit of record (the default options)")
        if predictions is not None:
            _print_predictions(predictions)
        if targets is not None:
            _print_targets(targets)
        if plot is not None:
            say(f"plot: {plot}")


def _fit_and_plot(file, study, db, options, plot, tags=(None, None)):
    """(records, fits, title, store or None, record_breaking, draws): the run log's or the stored study's fits (on the
    points the study's `fit.points` names; a run log's on every evaluation), plotted when asked; draws: the fit of
    record's bootstrap draws when `fits` is it, else None. `tags`: the log's reward and compute metrics."""
    if file is not None:
        from rlscale.db.importer import read_run_log
        from rlscale.db.trackers import is_wandb_log
        from rlscale.fitting.sigmoid.runs import fit_runs

        if is_wandb_log(file):  # its metrics have to be named: the import does that, once
            raise UserError(
                "W&B runs: import them first, naming the reward (rlscale import DIR --reward METRIC --study NAME), "
                "then rlscale fit --study NAME",
                file=str(file),
            )
        records = read_run_log(file, tag=tags[0], compute_tag=tags[1])
        title, store, record_breaking, draws = file.stem, None, False, None
        fits = fit_runs(records, run_col="run", compute_col="compute", reward_col="reward", **options)
    else:
        from rlscale.db.store import Store
        from rlscale.fitting.stored import store_fits, study_records

        store, title = Store(db, create=False), study
        records = study_records(store, study)
        of_record = store_fits(store, study)
        record_breaking = of_record.record_breaking
        fits, draws = of_record.curves, of_record.draws
        if options != DEFAULT_OPTIONS:  # shown with the user's options; the store keeps the study's fit of record
            from rlscale.fitting.curves import fitted_points
            from rlscale.fitting.sigmoid.runs import fit_runs

            points = _each_run(
                records,
                lambda c, r: fitted_points(c.to_numpy(float), r.to_numpy(float), record_breaking, of_record.bin_width),
            )
            fits = fit_runs(points, run_col="run", compute_col="compute", reward_col="reward", **options)
            store = draws = None
    if fits["A"].isna().all():  # nothing to show or plot: the file (or study) is no input for a fit
        from rlscale.cli.views import reason_line

        shown = [reason_line(row) for row in fits.to_dict("records")]
        more = f"; and {len(shown) - 3} more" if len(shown) > 3 else ""
        raise UserError(
            f"no run could be fitted ({'; '.join(shown[:3])}{more})",
            file=str(file) if file is not None else None,
            field=None if file is not None else f"study {study}",
        )
    if plot is not None:
        from rlscale.views.plots import plot_study

        plot_study(
            records,
            fits,
            plot,
            run_col="run",
            compute_col="compute",
            reward_col="reward",
            title=title,
            record_breaking=record_breaking,
        )
    return records, fits, title, store, record_breaking, draws


def _print_predictions(predictions) -> None:
    """One line per run: the predicted reward at the target compute and its prediction interval."""
    for row in predictions.to_dict("records"):
        console.print(
            f"{safe(row['run'])}: at {row['at']:.4g}: {format_number(row['predicted'])} "
            f"[{format_number(row['predicted_lo'])}, {format_number(row['predicted_hi'])}] "
            f"({row['level']:.0%} PI)",
            highlight=False,
            soft_wrap=True,
        )


def _targets(records, record_breaking: bool, target: float, level: float, options: dict) -> list[dict]:
    """fitting.laws.target.record_targets on the points each run's fit used (its record-breaking points when the study
    fits those)."""
    from rlscale.fitting.laws.target import record_targets
    from rlscale.fitting.sigmoid.points import record_breaking_points

    points = _each_run(records, record_breaking_points) if record_breaking else records
    return record_targets(
        points, target, level=level, run_col="run", compute_col="compute", reward_col="reward", **options
    )


def _each_run(records, select):
    """The rows of `records` that `select(compute, reward)` keeps within each run (an index or a mask of its rows)."""
    keep = [group.index[select(group["compute"], group["reward"])] for _, group in records.groupby("run", sort=False)]
    return records.loc[[index for part in keep for index in part]]


def _print_targets(targets: list[dict]) -> None:
    """One line per run: where it is predicted to reach the target (rlscale.views.wording), or why not."""
    from rlscale.fitting.rules.reasons import Reason
    from rlscale.views.wording import reason_text

    for row in targets:
        why = Reason(row["reach"]["code"], row["reach"]["values"])
        level = f" ({why['level']:.0%})" if why.code in ("reached", "reached_unbounded") else ""
        console.print(f"{safe(row['run'])}: {safe(reason_text(why))}{level}", highlight=False, soft_wrap=True)


def target_json(row: dict) -> dict:
    """TARGET_KEYS of one fitting.laws.target row (null where they do not apply)."""
    values = row["reach"]["values"]
    return {
        "target": values.get("target"),
        "reach_code": row["reach"]["code"],
        "reach_compute": values.get("compute"),
        "reach_compute_lo": values.get("compute_lo"),
        "reach_compute_hi": values.get("compute_hi"),
        "reach_level": values.get("level"),
    }


def fits_json(fits, predictions=None, targets=None) -> list[dict]:
    """The fits as plain JSON-ready dicts with JSON_KEYS (NaN and inf become null); with `predictions`
    (laws.predict.predict_runs), each also has PREDICTION_KEYS; with `targets` (laws.target.record_targets),
    TARGET_KEYS."""
    out = []
    for row in fits.to_dict("records"):
        item = {key: json_safe(row.get(key)) for key in JSON_KEYS}  # numpy scalars made plain, NaN and inf null
        item["run"], item["identified"] = str(item["run"]), bool(item["identified"])
        if item["noise"] is not None:
            item["noise"] = str(item["noise"])
        if item["n_points"] is not None:
            item["n_points"] = int(item["n_points"])
        out.append(item)
    if predictions is not None:
        by_run = {str(row["run"]): row for row in predictions.to_dict("records")}
        for item in out:
            row = by_run.get(item["run"], {})
            item.update({key: json_safe(row.get(key)) for key in PREDICTION_KEYS})
    if targets is not None:
        by_run = {row["run"]: row for row in targets}
        for item in out:
            row = by_run.get(item["run"])
            item.update(json_safe(target_json(row)) if row else dict.fromkeys(TARGET_KEYS))
    return out
