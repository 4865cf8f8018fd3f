"""Engines for the store: URL handling, SQLite settings for concurrent writers and readers, migrations on first use."""

import ipaddress
import math
import os
import re
import sqlite3
import threading
import time
from pathlib import Path
from urllib.parse import quote

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError
from sqlalchemy.pool import StaticPool

from rlscale.base import settings
from rlscale.base.errors import UserError, first_line

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
VERSION_TABLE = "rlscale_alembic_version"  # as db/migrations/env.py names it
SQLITE_BUSY_TIMEOUT_S = 30.0  # a writer commits in milliseconds; waiting beats "database is locked"
SQLITE_OPTIONS = {"timeout"}  # URL query options passed to sqlite3.connect
WRITE_OPTION = "rlscale_write"  # execution option: this transaction writes (SQLite: BEGIN IMMEDIATE)
# query parameters that carry secrets in libpq/psycopg and other drivers' URLs (password=, sslpassword=, ...)
_SECRET_KEY = re.compile(r"pass|pwd|secret|token|credential|auth|key", re.IGNORECASE)
_MASK = "rlscale-masked-secret"  # rendered, then shown as *** (render_as_string would quote '*')
URL_EXAMPLE = "a SQLAlchemy URL such as sqlite:///rlscale.db or postgresql+psycopg://user@host:5432/db"

_migrated: set[str] = set()
_migrate_lock = threading.Lock()


def parse_url(url: str) -> URL:
    """The SQLAlchemy URL, with a relative SQLite path made absolute (so a later chdir keeps the same file)."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        # the text is not echoed: an unparseable URL may still carry a password
        raise UserError(f"expected {URL_EXAMPLE}", field="--db") from None
    try:
        port = parsed.port
    except ValueError:
        raise UserError(f"expected {URL_EXAMPLE} (a port is a number)", field="--db") from None
    if port is not None and not 0 < port < 65536:
        raise UserError(f"expected a port from 1 to 65535, got {port} in {display_url(parsed)}", field="--db")
    if parsed.get_backend_name() == "sqlite" and (parsed.host or parsed.port or parsed.username):
        raise UserError(
            f"a SQLite URL names a file after three slashes (sqlite:///path/to/file.db), got {display_url(parsed)}",
            field="--db",
        )
    if parsed.host and not _host_name(parsed.host):
        raise UserError(f"expected a host name or address, got {parsed.host!r} in {display_url(parsed)}", field="--db")
    if parsed.get_backend_name() == "sqlite" and not _is_memory(parsed):
        parsed = parsed.set(database=os.path.abspath(parsed.database))
    return parsed


def _host_name(host: str) -> bool:
    """Whether `host` can be looked up: an IP address (IPv6 in brackets or not) or a name IDNA encodes (no empty
    label: a placeholder such as `...` is not one, and the driver's resolver raises UnicodeError on it)."""
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        pass
    try:
        host.encode("idna")
    except UnicodeError:
        return False
    return True


def display_url(url: URL | str) -> str:
    """The URL as text, password and password-like query parameters as ***; all messages show store URLs through it."""
    try:
        parsed = make_url(url) if isinstance(url, str) else url
    except (ArgumentError, ValueError):
        return "(unparseable URL)"
    secret = {key: _MASK for key in parsed.query if _SECRET_KEY.search(key)}
    if secret:
        parsed = parsed.update_query_dict(secret)
    return parsed.render_as_string(hide_password=True).replace(_MASK, "***")


def writer(engine: Engine) -> Engine:
    """`engine` for transactions that write: on SQLite they start with BEGIN IMMEDIATE, so concurrent writers
    (imports, fits, sweeps in other processes) queue on the busy timeout instead of failing "database is locked"."""
    return engine.execution_options(**{WRITE_OPTION: True})


def make_engine(url: URL, *, create: bool = True, read_only: bool = False, shown: str | None = None) -> Engine:
    """An engine for `url`; SQLite gets WAL, a busy timeout, foreign keys and real BEGINs, and a file this process
    cannot write opens read-only. `read_only`: the database itself refuses writes. `shown`: the URL as messages name
    it (default `url`'s)."""
    shown = shown or display_url(url)
    if url.get_backend_name() != "sqlite":
        # the server refuses every write in this session: a viewer cannot change a sweep's store by mistake
        options = {}
        if read_only:  # libpq's `options` of the URL (a search_path, say) are kept beside it
            given = url.query.get("options", "")
            given = " ".join(given) if isinstance(given, tuple) else given
            options = {"connect_args": {"options": f"{given} -c default_transaction_read_only=on".strip()}}
        try:
            engine = create_engine(url, pool_pre_ping=True, **options)
        except (NoSuchModuleError, ImportError) as err:
            hint = ""
            if url.get_backend_name() == "postgresql":  # the postgres extra ships psycopg 3, not psycopg2
                hint = (
                    " (pip install -e .[postgres]"
                    + ("" if url.get_driver_name() == "psycopg" else "; write postgresql+psycopg://...")
                    + ")"
                )
            raise UserError(f"cannot use {shown}: {err}{hint}", field="--db") from None
        except (ArgumentError, TypeError, ValueError) as err:
            raise UserError(f"cannot use {shown}: {first_line(err)}", field="--db") from None
        _translate_errors(engine, shown)
        return engine
    unknown = sorted(set(url.query) - SQLITE_OPTIONS)
    if unknown:
        raise UserError(
            f"unknown option(s) {', '.join(unknown)} in {shown}: expected sqlite:///path/to/file.db "
            f"(options: {', '.join(sorted(SQLITE_OPTIONS))})",
            field="--db",
        )
    timeout = url.query.get("timeout", "0")
    try:
        valid = isinstance(timeout, str) and math.isfinite(float(timeout)) and float(timeout) >= 0
    except ValueError:
        valid = False
    if not valid:
        raise UserError(f"expected one timeout in seconds >= 0 in {shown}, got {timeout!r}", field="--db")
    wanted = read_only
    read_only = None if _is_memory(url) else _sqlite_read_only(url.database, create=create)
    if wanted and read_only is None:
        read_only = read_only_request(url)
    if _is_memory(url):
        engine = create_engine(url, poolclass=StaticPool, connect_args={"check_same_thread": False})
    elif read_only:
        # `immutable` when not even the -shm file can be made (read-only directory or filesystem)
        uri = f"file:{quote(url.database)}?{read_only}"
        engine = create_engine(
            "sqlite://",
            creator=lambda: sqlite3.connect(uri, uri=True, timeout=SQLITE_BUSY_TIMEOUT_S, check_same_thread=False),
        )
    else:
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S})

    @event.listens_for(engine, "connect")
    def _sqlite_connect(dbapi_connection, _record) -> None:
        # pysqlite's own transaction handling delays BEGIN and commits around DDL; let SQLAlchemy own it.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        if not _is_memory(url) and not read_only:
            # WAL: readers (a report in another process) never wait for the sweep's writer.
            _set_wal(cursor)
            cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _sqlite_begin(conn) -> None:
        # a deferred BEGIN that later writes gets "database is locked" at once; IMMEDIATE waits on the busy timeout
        write = conn.get_execution_options().get(WRITE_OPTION) and not read_only
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    _translate_errors(engine, shown, read_only=bool(read_only))
    return engine


def _set_wal(cursor) -> None:
    # switching to WAL can get "database is locked" at once, bypassing the busy handler: retry within the timeout
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def read_only_request(url: URL) -> str:
    """The SQLite URI option that opens a writable file read-only (mode=ro: readers still see a writer's commits
    through WAL); UserError for a file that does not exist (opening would create it) or an in-memory store."""
    if _is_memory(url):
        raise UserError("an in-memory store has nothing to read: expected a SQLite file or a server URL", field="--db")
    if not os.path.exists(url.database):
        raise UserError(
            f"no store at {url.database}: expected an existing SQLite file (a sweep creates it)", field="--db"
        )
    return "mode=ro"


def _sqlite_read_only(path: str, *, create: bool) -> str | None:
    directory = os.path.dirname(path) or "."
    if not os.path.exists(path):
        return None  # created on first write; a missing directory fails there with a clear message
    if os.path.isdir(path):
        raise UserError(f"{path} is a directory: expected a SQLite file", field="--db")
    dir_writable = os.access(directory, os.W_OK)
    if os.access(path, os.W_OK) and dir_writable:
        return None
    if not dir_writable and not os.path.exists(path + "-shm"):
        return "immutable=1"  # WAL needs a -shm file it cannot create: read the file as it is
    return "mode=ro"


class StoreUnreachable(UserError):
    """The database server did not take a connection: a wrong URL when a command opens the store, or a server
    restarting under a running sweep (whose writes wait for it)."""


def _translate_errors(engine: Engine, shown: str, *, read_only: bool = False) -> None:
    @event.listens_for(engine, "handle_error")
    def _user_errors(context) -> None:
        orig = context.original_exception
        text = first_line(orig)
        if isinstance(orig, sqlite3.OperationalError) and "readonly" in text:
            raise UserError(
                f"the store {shown} is read-only ({text}); this command writes to it", field="--db"
            ) from None
        if isinstance(orig, sqlite3.DatabaseError) and ("not a database" in text or "malformed" in text):
            raise UserError(f"{shown} is not a SQLite database ({text})", field="--db") from None
        if isinstance(orig, sqlite3.OperationalError) and "unable to open" in text:
            raise UserError(
                f"cannot open the store {shown} ({text}; does its directory exist?)", field="--db"
            ) from None
        if context.connection is None and not isinstance(orig, sqlite3.Error):
            # a failure to connect (server, host, port, credentials, driver options): the store cannot be opened
            raise StoreUnreachable(f"cannot open the store {shown}: {text}", field="--db") from None


def migrate(engine: Engine, *, shown: str | None = None) -> None:
    """Bring the schema to the newest alembic revision, once per process per database; a store already there is
    only read (no write lock), so opening it never waits for a writer."""
    key = None if _is_memory(engine.url) else engine.url.render_as_string(hide_password=False)
    if key is not None and key in _migrated:
        return
    with _migrate_lock:
        if key is not None and key in _migrated:
            return
        _upgrade(engine, shown or display_url(engine.url))
        if key is not None:
            _migrated.add(key)


def check_schema(engine: Engine, *, shown: str | None = None) -> None:
    """Read-only stores are not migrated: UserError unless the schema is at the newest alembic revision."""
    shown = shown or display_url(engine.url)
    current = _current_revision(engine, shown)
    _config, head = _alembic()
    if current is None:
        raise UserError(f"{shown} has no rlscale tables yet (a sweep or an import creates them)", field="--db")
    if current != head:
        raise UserError(
            f"{shown} is at schema revision {current}, this rlscale reads {head}: open it once with a "
            "command that writes (rlscale sweep or import) to upgrade it",
            field="--db",
        )


def _alembic() -> tuple:
    """(alembic's Config, built in code so it works from an installed package and any cwd; the head revision)."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config, ScriptDirectory.from_config(config).get_current_head()


def _current_revision(engine: Engine, shown: str) -> str | None:
    from alembic.runtime.migration import MigrationContext

    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
            return context.get_current_revision()
    except DBAPIError as err:
        raise _cannot_open(shown, err) from None


def _upgrade(engine: Engine, shown: str) -> None:
    from alembic import command

    config, head = _alembic()
    if _current_revision(engine, shown) == head:
        return
    try:
        # IMMEDIATE: two processes creating one new store take turns; the second finds it at head
        with writer(engine).begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, "head")
    except DBAPIError as err:
        raise _cannot_open(shown, err) from None


def _cannot_open(shown: str, err: DBAPIError) -> UserError:
    reason = first_line(err.orig) if err.orig else first_line(err)
    return UserError(f"cannot open the store {shown}: {reason}", field="--db")


def _is_memory(url: URL) -> bool:
    return url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:")


def lasting_url(url: str | None) -> str | None:
    """`url` for a command whose writes must outlast it (import, plan --save); UserError for an in-memory store."""
    if _is_memory(parse_url(settings.db_url(url))):
        raise UserError(
            "an in-memory store keeps nothing after the command: give a file (sqlite:///path/to/file.db) or a server",
            field="--db",
        )
    return url
