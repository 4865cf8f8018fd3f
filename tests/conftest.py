import gc
import os
import sys
import uuid

import pytest


def pytest_collection_modifyitems(config, items):
    # In CI every backend must be there: a missing PostgreSQL is a failure, not a skip.
    if os.environ.get("CI") and not os.environ.get("RLSCALE_TEST_PG_URL"):
        raise pytest.UsageError("CI is set but RLSCALE_TEST_PG_URL is not: .ci/run must start PostgreSQL")


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """Run in a fresh directory with a private cache and the default (SQLite) store inside it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLSCALE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("RLSCALE_DB", raising=False)
    return tmp_path


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request, tmp_path):
    """A URL to an empty database: a fresh SQLite file, or a fresh PostgreSQL schema dropped afterwards."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    base = os.environ.get("RLSCALE_TEST_PG_URL")
    if not base:
        pytest.skip("RLSCALE_TEST_PG_URL is not set (CI sets it; see .ci/run)")
    schema = f"rlscale_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base, pool_pre_ping=True)  # a test may restart the server meanwhile
    with admin.begin() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    # the schema goes first on the search path, so the store (and alembic's version table) live in it
    url = make_url(base).update_query_dict({"options": f"-csearch_path={schema}"})
    yield url.render_as_string(hide_password=False)
    gc.collect()  # close pooled connections of stores the test dropped
    with admin.begin() as conn:
        conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
    admin.dispose()


@pytest.fixture
def store(db_url):
    from rlscale.db.store import Store

    with Store(db_url) as store:
        yield store


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """Run `rlscale ARGS` in-process, as the console script does: (exit code, stdout, stderr)."""
    from rlscale.cli import main

    monkeypatch.setattr(sys, "argv", ["rlscale", *map(str, args)])
    try:
        main()
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def cli(monkeypatch, capsys):
    """`cli("fit", "x.csv", "--json")` -> (exit code, stdout, stderr), in-process."""
    return lambda *args: run_cli(monkeypatch, capsys, *args)
