"""Alembic environment for the rlscale store.

db.engine.migrate() passes an open connection in `config.attributes["connection"]`; the offline and
URL paths exist for `alembic -x url=... revision --autogenerate` during development.
"""

from alembic import context
from rlscale.db.models import Base
from sqlalchemy import create_engine

target_metadata = Base.metadata
# Prefixed, like the tables: Optuna's RDB storage shares the database (bayes sweeps) and has its own
# `studies` table and `alembic_version`.
VERSION_TABLE = "rlscale_alembic_version"


def _configure(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite alters tables by copying them
        compare_type=True,
        version_table=VERSION_TABLE,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        return
    url = context.get_x_argument(as_dictionary=True).get("url") or context.config.get_main_option("sqlalchemy.url")
    with create_engine(url).connect() as connection:
        _configure(connection)


def run_offline() -> None:
    url = context.get_x_argument(as_dictionary=True).get("url") or context.config.get_main_option("sqlalchemy.url")
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True, version_table=VERSION_TABLE)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
