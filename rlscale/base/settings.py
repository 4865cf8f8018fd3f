"""Where things live: the store URL and the on-disk cache."""

import os
from pathlib import Path

DEFAULT_DB_URL = "sqlite:///rlscale.db"  # a file in the working directory, like optuna/mlflow


def db_url(explicit: str | None = None) -> str:
    """The SQLAlchemy URL: `--db` wins, then `RLSCALE_DB`, then ./rlscale.db (SQLite)."""
    return explicit or os.environ.get("RLSCALE_DB") or DEFAULT_DB_URL


def cache_dir() -> Path:
    """Directory for built artefacts (the tiny base policy, checkpoints): `RLSCALE_CACHE` or ~/.cache/rlscale."""
    path = Path(os.environ.get("RLSCALE_CACHE", Path.home() / ".cache" / "rlscale"))
    path.mkdir(parents=True, exist_ok=True)
    return path
