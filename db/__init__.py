"""Store: SQLAlchemy models, sessions, alembic migrations, CSV/JSONL import."""
