"""Tables of the store: studies, runs, records, fits, plans (docs/methods.md section 6).
The alembic migrations in db/migrations/versions create exactly these: a change here needs a new migration."""

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

RUN_STATUSES = ("pending", "running", "paused", "done", "failed", "stopped")


def utcnow() -> datetime:
    """The current time in UTC (timezone-aware)."""
    return datetime.now(UTC)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON}


class Study(Base):
    __tablename__ = "rlscale_studies"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    spec: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    runs: Mapped[list["Run"]] = relationship(back_populates="study", cascade="all, delete-orphan")


class Run(Base):
    """One RL job (a point of a study, one seed). Its config is the recipe as JSON."""

    __tablename__ = "rlscale_runs"
    # A study point is identified by what it runs, not by its display name: resuming a sweep finds it again.
    __table_args__ = (UniqueConstraint("study_id", "config_hash", "seed", name="uq_runs_study_config_seed"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("rlscale_studies.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    config: Mapped[dict[str, Any]] = mapped_column(default=dict)
    config_hash: Mapped[str] = mapped_column(String(64))
    seed: Mapped[int] = mapped_column(Integer, default=0)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)

    study: Mapped[Study] = relationship(back_populates="runs")


class Record(Base):
    """What a run had spent and reached at one step. val_reward is None on steps without an eval."""

    __tablename__ = "rlscale_records"
    __table_args__ = (UniqueConstraint("run_id", "step", name="uq_records_run_step"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("rlscale_runs.id", ondelete="CASCADE"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    gpu_hours: Mapped[float] = mapped_column(Float)
    rollouts: Mapped[int | None] = mapped_column(Integer)
    tokens: Mapped[int | None] = mapped_column(Integer)
    val_reward: Mapped[float | None] = mapped_column(Float)
    # train reward, entropy, KL, grad norm, truncation rate, ...: free-form like optuna's attrs
    metrics: Mapped[dict[str, Any]] = mapped_column(default=dict)


class Fit(Base):
    """One fitted curve of one run under one model (sigmoid, power, ...)."""

    __tablename__ = "rlscale_fits"
    __table_args__ = (UniqueConstraint("run_id", "model", name="uq_fits_run_model"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("rlscale_runs.id", ondelete="CASCADE"), index=True)
    model: Mapped[str] = mapped_column(String(32))
    params: Mapped[dict[str, Any]] = mapped_column(default=dict)
    a_lo: Mapped[float | None] = mapped_column(Float)
    a_hi: Mapped[float | None] = mapped_column(Float)
    identified: Mapped[bool] = mapped_column(Boolean)
    reason: Mapped[str | None] = mapped_column(Text)
    fitted_on: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Plan(Base):
    """A saved IsoCompute plan (the planner's JSON), by name."""

    __tablename__ = "rlscale_plans"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    plan: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
