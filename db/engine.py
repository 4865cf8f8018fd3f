"""Engines for the store: URL handling, SQLite settings for concurrent readers, migrations on first use."""

import os
import threading
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError
from sqlalchemy.pool import StaticPool

from rlscale.base.errors import UserError

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
SQLITE_BUSY_TIMEOUT_S = 30.0  # a writer commits in milliseconds; waiting beats "database is locked"

_migrated: set[str] = set()
_migrate_lock = threading.Lock()


def parse_url(url: str) -> URL:
    """The SQLAlchemy URL, with a relative SQLite path made absolute (so a later chdir keeps the same file)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        # the text is not echoed: an unparseable URL may still carry a password
        raise UserError("expected a SQLAlchemy URL such as sqlite:///rlscale.db or postgresql+psycopg://user@host/db", field="--db") from None
    if parsed.get_backend_name() == "sqlite" and not _is_memory(parsed):
        parsed = parsed.set(database=os.path.abspath(parsed.database))
    return parsed


def display_url(url: URL | str) -> str:
    """The URL as text with any password replaced by ***."""
    return (make_url(url) if isinstance(url, str) else url).render_as_string(hide_password=True)


def make_engine(url: URL) -> Engine:
    """An engine for `url`; SQLite gets WAL, a busy timeout, foreign keys and real BEGINs."""
    if url.get_backend_name() != "sqlite":
        try:
            return create_engine(url, pool_pre_ping=True)
        except (NoSuchModuleError, ImportError) as err:
            hint = ""
            if url.get_backend_name() == "postgresql":  # the postgres extra ships psycopg 3, not psycopg2
                hint = " (pip install -e .[postgres]" + ("" if url.get_driver_name() == "psycopg" else "; write postgresql+psycopg://...") + ")"
            raise UserError(f"cannot use {display_url(url)}: {err}{hint}", field="--db") from None
    if _is_memory(url):
        engine = create_engine(url, poolclass=StaticPool, connect_args={"check_same_thread": False})
    else:
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S})

    @event.listens_for(engine, "connect")
    def _sqlite_connect(dbapi_connection, _record) -> None:
        # pysqlite's own transaction handling delays BEGIN and commits around DDL; let SQLAlchemy own it.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        if not _is_memory(url):
            # WAL: readers (a report in another process) never wait for the sweep's writer.
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _sqlite_begin(conn) -> None:
        conn.exec_driver_sql("BEGIN")

    return engine


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest alembic revision; done once per process per database."""
    key = None if _is_memory(engine.url) else engine.url.render_as_string(hide_password=False)
    if key is not None and key in _migrated:
        return
    with _migrate_lock:
        if key is not None and key in _migrated:
            return
        _upgrade(engine)
        if key is not None:
            _migrated.add(key)


def _upgrade(engine: Engine) -> None:
    from alembic import command
    from alembic.config import Config

    config = Config()  # built in code: works from an installed package and from any cwd
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    try:
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, "head")
    except OperationalError as err:
        reason = str(err.orig).strip().splitlines()[0] if err.orig else str(err).splitlines()[0]
        raise UserError(f"cannot open the store {display_url(engine.url)}: {reason}", field="--db") from None


def _is_memory(url: URL) -> bool:
    return url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:")
