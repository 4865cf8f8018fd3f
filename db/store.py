"""The store the planner, the sweep driver, `fit` and the reports read and write through.
Every method is one short transaction; frames come back as pandas DataFrames with plain columns."""

import hashlib
import json
import math
import os
from typing import Any

import pandas as pd
from rlscale.db.engine import check_schema, display_url, make_engine, migrate, parse_url, writer
from rlscale.db.models import RUN_STATUSES, Fit, Plan, Record, Run, Study, utcnow
from rlscale.db.outage import OutagePolicy, waits_out_outages
from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from rlscale.base import settings
from rlscale.base.errors import UserError
from rlscale.base.names import check_name
from rlscale.base.numbers import float_or_none as _float_or_none
from rlscale.base.numbers import is_missing as _is_missing
from rlscale.base.numbers import json_safe as _json_safe

RECORD_COLUMNS = ["run_id", "run", "step", "gpu_hours", "rollouts", "tokens", "val_reward"]
RUN_COLUMNS = ["run_id", "run", "seed", "status", "error", "config", "created_at", "updated_at"]
FIT_COLUMNS = ["run_id", "run", "model", "A_lo", "A_hi", "identified", "reason", "fitted_on"]
_FIT_FIELDS = set(FIT_COLUMNS)  # fit-frame columns that are not curve parameters (the rest go into Fit.params)


def check_store(url: str | None) -> None:
    """UserError if a sweep could not open or create its store at `url` (default RLSCALE_DB, else rlscale.db),
    found without writing: a SQLite file's folder is checked, a server is asked for one read-only connection."""
    try:
        parsed = parse_url(settings.db_url(url))
        shown = display_url(parsed)
        if parsed.get_backend_name() != "sqlite":
            engine = make_engine(parsed, create=False, read_only=True)
            try:
                engine.connect().close()
            finally:
                engine.dispose()
            return
        if parsed.database in (None, "", ":memory:"):
            return
        path = os.path.abspath(parsed.database)
        folder = os.path.dirname(path)
        if os.path.isdir(path):
            raise UserError(f"{path} is a directory: expected a SQLite file", field="--db")
        if not os.path.isdir(folder):
            raise UserError(f"cannot create the store {shown}: no directory {folder}", field="--db")
        if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
            raise UserError(f"cannot write the store {shown}: permission denied", field="--db")
    except UserError as err:  # a URL the environment gave is named as such
        if url is None and err.field == "--db" and os.environ.get("RLSCALE_DB"):
            raise UserError(err.detail, file=err.file, field="RLSCALE_DB") from None
        raise


class Store:
    """Studies, runs, records, fits and plans in one SQL database (SQLite by default, any SQLAlchemy URL)."""

    def __init__(self, url: str | None = None, *, create: bool = True, read_only: bool = False):
        """`create=False`: a missing SQLite file reads as an empty in-memory store, so reading leaves no file behind.
        `read_only=True` (a viewer): never migrated, writes refused; a missing file, empty or old schema: UserError."""
        try:
            self._open(url, create, read_only)
        except UserError as err:  # a URL the environment gave is named as such
            if url is None and err.field == "--db" and os.environ.get("RLSCALE_DB"):
                raise UserError(err.detail, file=err.file, field="RLSCALE_DB") from None
            raise

    def _open(self, url: str | None, create: bool, read_only: bool) -> None:
        self.url = parse_url(settings.db_url(url))
        self.url_for_display = display_url(self.url)
        self.read_only = read_only
        if (
            not create
            and not read_only
            and self.url.get_backend_name() == "sqlite"
            and self.url.database not in (None, "", ":memory:")
        ):
            if not os.path.exists(self.url.database):
                self.url = self.url.set(database=":memory:")
        self.engine = make_engine(
            self.url, create=create and not read_only, read_only=read_only, shown=self.url_for_display
        )
        if read_only:
            check_schema(self.engine, shown=self.url_for_display)
        else:
            migrate(self.engine, shown=self.url_for_display)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        # writes take SQLite's write lock up front so concurrent writers wait (db/engine.py)
        self._writes = sessionmaker(writer(self.engine), expire_on_commit=False)
        self.outage = OutagePolicy()  # wait_out_outages() makes every call wait for a database that went away

    def wait_out_outages(self, seconds: float, on_note=None) -> None:
        """From now on, a call whose database went away (a server restart) is retried for up to `seconds`;
        on_note(text) hears a one-line note while it waits, and "" once the database answers again."""
        self.outage.seconds = seconds
        if on_note is not None:
            self.outage.on_note = on_note

    def lock_study(self, name: str):
        """A StudyLock holding study `name` for one sweep driver (`release` it at the end); StudyBusy (a UserError
        naming the holder) while another process's driver holds it."""
        from rlscale.db.study_lock import acquire

        return acquire(self.engine, self.url, self.url_for_display, name)

    def study_is_swept(self, name: str) -> bool | None:
        """Whether a sweep driver holds study `name` now (read without taking its lock); None where unknown."""
        from rlscale.db.study_lock import is_held

        return is_held(self.engine, self.url, self.url_for_display, name)

    def __repr__(self) -> str:
        return f"Store({self.url_for_display!r})"

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @waits_out_outages
    def upsert_study(self, name: str, spec: dict) -> int:
        """The study's id; creates it, or replaces its spec if it exists."""
        check_name(name, field="study", what="study name")
        with self._writes.begin() as session:
            study = session.scalar(select(Study).where(Study.name == name))
            if study is None:
                study = Study(name=name, spec=_json_safe(spec))
                session.add(study)
            else:
                study.spec = _json_safe(spec)
            session.flush()
            return study.id

    @waits_out_outages
    def study_names(self) -> list[str]:
        """All study names, sorted."""
        with self._sessions() as session:
            return list(session.scalars(select(Study.name).order_by(Study.name)))

    @waits_out_outages
    def study_counts(self) -> list[dict]:
        """Per study: its name, runs, runs by status, records and sigmoid fits."""
        with self._sessions() as session:
            runs = session.execute(
                select(Study.name, Run.status, func.count(Run.id))
                .outerjoin(Run, Run.study_id == Study.id)
                .group_by(Study.name, Run.status)
            ).all()
            records = dict(
                session.execute(
                    select(Study.name, func.count(Record.id))
                    .join(Run, Run.study_id == Study.id)
                    .join(Record, Record.run_id == Run.id)
                    .group_by(Study.name)
                ).all()
            )
            fits = dict(
                session.execute(
                    select(Study.name, func.count(Fit.id))
                    .join(Run, Run.study_id == Study.id)
                    .join(Fit, Fit.run_id == Run.id)
                    .where(Fit.model == "sigmoid")
                    .group_by(Study.name)
                ).all()
            )
        counts: dict[str, dict] = {}
        for name, status, n in runs:
            row = counts.setdefault(name, {"study": name, "runs": 0, **dict.fromkeys(RUN_STATUSES, 0)})
            if status is not None:
                row[status] = row.get(status, 0) + n
                row["runs"] += n
        for name, row in counts.items():
            row["records"] = records.get(name, 0)
            row["fits"] = fits.get(name, 0)
        return [counts[name] for name in sorted(counts)]

    @waits_out_outages
    def study_stamp(self, name: str) -> tuple:
        """(runs, last run update, records, last record id): a viewer polls it, rereading frames only when it moves."""
        with self._sessions() as session:
            study = self._study(session, name)
            runs = session.execute(
                select(func.count(Run.id), func.max(Run.updated_at)).where(Run.study_id == study.id)
            ).one()
            records = session.execute(
                select(func.count(Record.id), func.max(Record.id))
                .join(Run, Run.id == Record.run_id)
                .where(Run.study_id == study.id)
            ).one()
        return (runs[0], str(runs[1]), records[0], records[1])

    @waits_out_outages
    def study_spec(self, name: str) -> dict:
        """The spec saved with the study; UserError naming the known studies if there is none."""
        with self._sessions() as session:
            return dict(self._study(session, name).spec)

    @waits_out_outages
    def ensure_run(self, study: str, name: str, config: dict, seed: int = 0) -> int:
        """The id of the run of `study` with this config and seed, created (pending) if new."""
        for _attempt in range(2):  # a concurrent writer may insert the same run between our select and insert
            try:
                with self._writes.begin() as session:
                    return _ensure_run(session, study, name, config, seed)[0]
            except IntegrityError:
                continue
        raise RuntimeError(f"could not create run {name!r} in study {study!r}")

    @waits_out_outages
    def set_run_status(self, run_id: int, status: str, error: str | None = None) -> None:
        """Set a run's status (pending, running, paused, done, failed, stopped) and error text."""
        if status not in RUN_STATUSES:
            raise ValueError(f"run status must be one of {', '.join(RUN_STATUSES)}, got {status!r}")
        with self._writes.begin() as session:
            run = session.get(Run, run_id)
            if run is None:
                raise KeyError(f"no run with id {run_id} in {self.url_for_display}")
            run.status = status
            run.error = error
            run.updated_at = utcnow()

    @waits_out_outages
    def delete_run(self, run_id: int) -> None:
        """Remove a run with its records and fits."""
        with self._writes.begin() as session:
            for table in (Fit, Record):
                session.execute(delete(table).where(table.run_id == run_id))
            session.execute(delete(Run).where(Run.id == run_id))

    @waits_out_outages
    def runs_frame(self, study: str) -> pd.DataFrame:
        """One row per run of `study`: run_id, run, seed, status, error, config (dict), created_at, updated_at."""
        with self._sessions() as session:
            study_row = self._study(session, study)
            rows = session.execute(
                select(Run.id, Run.name, Run.seed, Run.status, Run.error, Run.config, Run.created_at, Run.updated_at)
                .where(Run.study_id == study_row.id)
                .order_by(Run.id)
            ).all()
        return pd.DataFrame([tuple(row) for row in rows], columns=RUN_COLUMNS)

    @waits_out_outages
    def add_records(self, run_id: int, records: list[dict]) -> int:
        """How many of a run's records were inserted; steps already stored are skipped."""
        with self._writes.begin() as session:
            return _add_records(session, run_id, records)

    @waits_out_outages
    def import_runs(self, study: str, runs: list[tuple[str, dict, list[dict]]]) -> tuple[int, int, int]:
        """(runs created, records inserted, records skipped) in one transaction; new runs are done (complete logs)."""
        created = inserted = skipped = 0
        with self._writes.begin() as session:
            for name, config, records in runs:
                run_id = _imported_run(session, study, name, config)
                is_new = run_id is None
                if is_new:
                    run_id, is_new = _ensure_run(session, study, name, config, 0, status="done")
                added = _add_records(session, run_id, records)
                created += is_new
                inserted += added
                skipped += len(records) - added
        return created, inserted, skipped

    @waits_out_outages
    def records_frame(self, study: str, *, after_id: int = 0, until_id: int | None = None) -> pd.DataFrame:
        """One row per (run, step) of `study`: RECORD_COLUMNS plus metrics, record ids in (after_id, until_id] only."""
        ids = [Record.id > after_id] + ([Record.id <= until_id] if until_id is not None else [])
        with self._sessions() as session:
            study_row = self._study(session, study)
            rows = session.execute(
                select(
                    Record.run_id,
                    Run.name,
                    Record.step,
                    Record.gpu_hours,
                    Record.rollouts,
                    Record.tokens,
                    Record.val_reward,
                    Record.metrics,
                )
                .join(Run, Run.id == Record.run_id)
                .where(Run.study_id == study_row.id, *ids)
                .order_by(Record.run_id, Record.step)
            ).all()
        frame = pd.DataFrame([tuple(row[:-1]) for row in rows], columns=RECORD_COLUMNS)
        frame["val_reward"] = frame["val_reward"].astype(float)
        frame["gpu_hours"] = frame["gpu_hours"].astype(float)
        for column in ("rollouts", "tokens"):
            frame[column] = frame[column].astype("Int64")
        metrics = pd.DataFrame([row[-1] or {} for row in rows], index=frame.index)
        for column in metrics.columns:
            if column not in frame.columns:
                frame[column] = _numeric_or_object(metrics[column])
        return frame

    @waits_out_outages
    def save_fits(self, study: str, fits: pd.DataFrame, model: str = "sigmoid") -> None:
        """Replace the study's fits of `model` by `fits` (one row per run, keyed by run_id or a unique run name)."""
        with self._writes.begin() as session:
            study_row = self._study(session, study)
            runs = session.execute(select(Run.id, Run.name).where(Run.study_id == study_row.id)).all()
            run_ids = {run_id for run_id, _ in runs}
            by_name: dict[str, list[int]] = {}
            for run_id, name in runs:
                by_name.setdefault(name, []).append(run_id)
            new = []
            for row in fits.to_dict("records"):
                run_id = _resolve_run(row, run_ids, by_name, study)
                params = {k: v for k, v in row.items() if k not in _FIT_FIELDS}
                new.append(
                    Fit(
                        run_id=run_id,
                        model=model,
                        params=_json_safe(params),
                        a_lo=_float_or_none(row.get("A_lo")),
                        a_hi=_float_or_none(row.get("A_hi")),
                        identified=bool(row.get("identified", False)),
                        reason=_text_or_none(row.get("reason")),
                        fitted_on=utcnow(),
                    )
                )
            session.execute(delete(Fit).where(Fit.model == model, Fit.run_id.in_(run_ids)))
            session.add_all(new)

    @waits_out_outages
    def fits_frame(self, study: str, model: str = "sigmoid") -> pd.DataFrame:
        """The study's stored fits of `model`: FIT_COLUMNS with the curve parameters after `model`."""
        with self._sessions() as session:
            study_row = self._study(session, study)
            rows = session.execute(
                select(Fit, Run.name)
                .join(Run, Run.id == Fit.run_id)
                .where(Run.study_id == study_row.id, Fit.model == model)
                .order_by(Fit.run_id)
            ).all()
        records = []
        for fit, name in rows:
            params = {k: (math.nan if v is None else v) for k, v in fit.params.items()}
            records.append(
                {
                    "run_id": fit.run_id,
                    "run": name,
                    "model": fit.model,
                    **params,
                    "A_lo": _nan_if_none(fit.a_lo),
                    "A_hi": _nan_if_none(fit.a_hi),
                    "identified": fit.identified,
                    "reason": fit.reason,
                    "fitted_on": fit.fitted_on,
                }
            )
        frame = pd.DataFrame(records)
        if frame.empty:
            return pd.DataFrame(columns=FIT_COLUMNS)
        params = [c for c in frame.columns if c not in _FIT_FIELDS]
        return frame[["run_id", "run", "model", *params, "A_lo", "A_hi", "identified", "reason", "fitted_on"]]

    @waits_out_outages
    def save_plan(self, name: str, plan: dict) -> int:
        """The plan's id; a plan saved again under the same name replaces the old one."""
        with self._writes.begin() as session:
            row = session.scalar(select(Plan).where(Plan.name == name))
            if row is None:
                row = Plan(name=name, plan=_json_safe(plan))
                session.add(row)
            else:
                row.plan = _json_safe(plan)
                row.created_at = utcnow()
            session.flush()
            return row.id

    @waits_out_outages
    def plan(self, name: str) -> dict:
        """The plan saved under `name`; UserError if there is none."""
        with self._sessions() as session:
            row = session.scalar(select(Plan).where(Plan.name == name))
            if row is None:
                known = ", ".join(session.scalars(select(Plan.name).order_by(Plan.name))) or "none"
                raise UserError(f"no plan named {name!r} in {self.url_for_display}; known: {known}")
            return dict(row.plan)

    def _study(self, session: Session, name: str) -> Study:
        check_name(name, field="study", what="study name")
        study = session.scalar(select(Study).where(Study.name == name))
        if study is None:
            known = ", ".join(session.scalars(select(Study.name).order_by(Study.name))) or "none"
            raise UserError(f"no study named {name!r} in {self.url_for_display}; known: {known}")
        return study


def config_hash(config: dict) -> str:
    """SHA-256 (hex) of the config as canonical JSON: the same recipe always hashes the same."""
    canonical = json.dumps(_json_safe(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _ensure_run(
    session: Session, study: str, name: str, config: dict, seed: int, status: str = "pending"
) -> tuple[int, bool]:
    config = _json_safe(config)
    digest = config_hash(config)
    study_row = session.scalar(select(Study).where(Study.name == study))
    if study_row is None:
        check_name(study, field="study", what="study name")
        study_row = Study(name=study, spec={})
        session.add(study_row)
        session.flush()
    run_id = session.scalar(
        select(Run.id).where(Run.study_id == study_row.id, Run.config_hash == digest, Run.seed == seed)
    )
    if run_id is not None:
        return run_id, False
    run = Run(study_id=study_row.id, name=name, config=config, config_hash=digest, seed=seed, status=status)
    session.add(run)
    session.flush()
    return run.id, True


def _imported_run(session: Session, study: str, name: str, config: dict) -> int | None:
    """The id of the run imported as `name` into `study` before, its config brought up to date (what a newer import
    reads from the same log: its compute unit, its geometry); None if there is none."""
    found = session.scalars(
        select(Run).join(Study, Study.id == Run.study_id).where(Study.name == study, Run.name == name, Run.seed == 0)
    ).all()
    run = next((run for run in found if (run.config or {}).get("source") == "import"), None)
    if run is None:
        return None
    config = _json_safe(config)
    if run.config != config:
        run.config, run.config_hash = config, config_hash(config)
    return run.id


def _add_records(session: Session, run_id: int, records: list[dict]) -> int:
    stored = set(session.scalars(select(Record.step).where(Record.run_id == run_id)))
    rows = []
    for record in records:
        step = int(record["step"])
        if step in stored:
            continue
        stored.add(step)
        rows.append(
            Record(
                run_id=run_id,
                step=step,
                gpu_hours=float(record["gpu_hours"]),
                rollouts=_int_or_none(record.get("rollouts")),
                tokens=_int_or_none(record.get("tokens")),
                val_reward=_float_or_none(record.get("val_reward")),
                metrics=_json_safe(dict(record.get("metrics") or {})),
            )
        )
    session.add_all(rows)
    session.flush()
    return len(rows)


def _resolve_run(row: dict, run_ids: set[int], by_name: dict[str, list[int]], study: str) -> int:
    run_id = row.get("run_id")
    if run_id is not None and not _is_missing(run_id):
        if int(run_id) not in run_ids:
            raise ValueError(f"fit for run_id {run_id}, which is not a run of study {study!r}")
        return int(run_id)
    name = str(row["run"])
    ids = by_name.get(name, [])
    if len(ids) != 1:
        problem = "no run" if not ids else f"{len(ids)} runs (pass run_id)"
        raise ValueError(f"fit for run {name!r}: study {study!r} has {problem} of that name")
    return ids[0]


def _int_or_none(value: Any) -> int | None:
    return None if _is_missing(value) else int(value)


def _text_or_none(value: Any) -> str | None:
    return None if _is_missing(value) or value == "" else str(value)


def _nan_if_none(value: float | None) -> float:
    return math.nan if value is None else value


def _numeric_or_object(column: pd.Series) -> pd.Series:
    try:
        return pd.to_numeric(column)
    except (TypeError, ValueError):
        return column
