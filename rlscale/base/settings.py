"""Where things live: the store URL and the on-disk cache."""

import os
import re
from pathlib import Path

DEFAULT_DB_URL = "sqlite:///rlscale.db"  # a file in the working directory, like optuna/mlflow


def db_url(explicit: str | None = None) -> str:
    """The SQLAlchemy URL: `--db` wins, then `RLSCALE_DB`, then ./rlscale.db (SQLite)."""
    return explicit or os.environ.get("RLSCALE_DB") or DEFAULT_DB_URL


def command_db_url(explicit: str | None = None) -> str:
    """The store's URL for a printed command line: a SQLite file's path made absolute (the command then names the same
    store from any directory), other URLs as given."""
    url = db_url(explicit)
    scheme, slashes, rest = url.partition(":///")
    path, _, query = rest.partition("?")
    sqlite = slashes and re.fullmatch(r"sqlite(\+\w+)?", scheme, re.IGNORECASE)
    if not sqlite or path in ("", ":memory:") or path.startswith("file:"):
        return url
    return f"{scheme}:///{os.path.abspath(path)}" + (f"?{query}" if query else "")


def cache_dir() -> Path:
    """Directory for built artefacts (the tiny base policy, checkpoints): `RLSCALE_CACHE` or ~/.cache/rlscale."""
    path = Path(os.environ.get("RLSCALE_CACHE", Path.home() / ".cache" / "rlscale"))
    path.mkdir(parents=True, exist_ok=True)
    return path
