import os

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
