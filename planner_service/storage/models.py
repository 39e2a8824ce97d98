"""SQLAlchemy 2 ORM tables.  Only :mod:`planner_service.storage.repository` writes them; the
schema itself is created by the Alembic migrations in ``storage/migrations`` (never by
``metadata.create_all`` in production code).

Plans are immutable: a row is inserted once, complete (request, result and summary columns in
one transaction), and only ever deleted.  ``(tenant, request_hash, revision)`` is unique:
revision 0 is the plan a plain POST creates; ``"force": true`` and replans insert revision
``max + 1``.

Every owned row (plans, jobs, clusters, models, profiles) has a ``tenant``; API keys map a
bearer key to a tenant and a role (``api_keys`` stores a salted HMAC of the key, never the key).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


DEFAULT_TENANT = "default"
ROLES = ("admin", "member", "reader")


def _tenant_column() -> Mapped[str]:
    return mapped_column(String(100), nullable=False, default=DEFAULT_TENANT, server_default=DEFAULT_TENANT, index=True)


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator):
    """Timezone-aware UTC timestamps on every backend.

    PostgreSQL stores ``timestamptz``; SQLite has no time zones, so values are stored as naive
    UTC (ISO text that sorts chronologically) and come back with ``tzinfo=UTC``.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> Any:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Any) -> Any:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class PlanRow(Base):
    __tablename__ = "plans"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    tenant: Mapped[str] = _tenant_column()
    request_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    revision: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    parent_id: Mapped[str | None] = mapped_column(String(36), ForeignKey("plans.id"), nullable=True, index=True)
    status: Mapped[str] = mapped_column(String(16), nullable=False, index=True)
    objective: Mapped[str] = mapped_column(String(32), nullable=False)
    model_name: Mapped[str] = mapped_column(String(200), nullable=False, index=True)
    model_params: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    cluster_name: Mapped[str] = mapped_column(String(200), nullable=False, index=True)
    #: Device types of the plan's cluster as ",A100-SXM4-80GB,H100-SXM5-80GB," (LIKE '%,X,%').
    device_types: Mapped[str] = mapped_column(String(1000), nullable=False)
    num_devices: Mapped[int] = mapped_column(Integer, nullable=False)
    step_time_s: Mapped[float] = mapped_column(Float, nullable=False)
    tokens_per_s: Mapped[float] = mapped_column(Float, nullable=False)
    mfu: Mapped[float] = mapped_column(Float, nullable=False)
    strategy: Mapped[dict] = mapped_column(JSON, nullable=False)
    request: Mapped[dict] = mapped_column(JSON, nullable=False)
    result: Mapped[dict] = mapped_column(JSON, nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False, default=utcnow)

    __table_args__ = (
        UniqueConstraint("tenant", "request_hash", "revision"),
        Index("ix_plans_created_at_id", "created_at", "id"),
        Index("ix_plans_tokens_per_s_id", "tokens_per_s", "id"),
        Index("ix_plans_step_time_s_id", "step_time_s", "id"),
        Index("ix_plans_mfu_id", "mfu", "id"),
        Index("ix_plans_device_types", "device_types"),
        Index("ix_plans_num_devices", "num_devices"),
    )


JOB_STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")


class JobRow(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    tenant: Mapped[str] = _tenant_column()
    kind: Mapped[str] = mapped_column(String(16), nullable=False)  # "plan" | "replan"
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    progress: Mapped[float] = mapped_column(Float, nullable=False, default=0.0)
    request: Mapped[dict] = mapped_column(JSON, nullable=False)
    request_hash: Mapped[str] = mapped_column(String(64), nullable=False, index=True)
    force: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    parent_id: Mapped[str | None] = mapped_column(String(36), nullable=True)
    callback_url: Mapped[str | None] = mapped_column(Text, nullable=True)
    plan_id: Mapped[str | None] = mapped_column(String(36), nullable=True)
    error: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    worker_id: Mapped[str | None] = mapped_column(String(200), nullable=True)
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)

    __table_args__ = (
        CheckConstraint("status IN ('queued','running','succeeded','failed','cancelled')", name="status"),
        Index("ix_jobs_status_created_at", "status", "created_at"),
    )


class ClusterRow(Base):
    __tablename__ = "clusters"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = _tenant_column()
    name: Mapped[str] = mapped_column(String(200), nullable=False)
    body: Mapped[dict] = mapped_column(JSON, nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False, default=utcnow)

    __table_args__ = (UniqueConstraint("tenant", "name"),)


class ModelRow(Base):
    __tablename__ = "models"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    tenant: Mapped[str] = _tenant_column()
    name: Mapped[str] = mapped_column(String(200), nullable=False, index=True)
    format: Mapped[str] = mapped_column(String(16), nullable=False)
    graph: Mapped[dict] = mapped_column(JSON, nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False, default=utcnow)

    __table_args__ = (CheckConstraint("format IN ('onnx','graph')", name="format"),)


class ProfileRow(Base):
    __tablename__ = "profiles"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    tenant: Mapped[str] = _tenant_column()
    device: Mapped[str] = mapped_column(String(200), nullable=False, index=True)
    body: Mapped[dict] = mapped_column(JSON, nullable=False)
    fitted: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False, default=utcnow)


class ApiKeyRow(Base):
    """An API key: ``id`` is the public part of the key (``plk_<id>_<secret>``), ``key_hash``
    the HMAC-SHA256 of the secret under ``salt``."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(100), nullable=False, index=True)
    role: Mapped[str] = mapped_column(String(16), nullable=False)
    salt: Mapped[str] = mapped_column(String(64), nullable=False)
    key_hash: Mapped[str] = mapped_column(String(128), nullable=False)
    name: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)

    __table_args__ = (CheckConstraint("role IN ('admin','member','reader')", name="role"),)


class ObservationRow(Base):
    """What a launched run of a plan measured (``POST /v1/plans/{id}/observations``).  Keyed by
    the plan and by its cluster (``cluster_key``: the cluster's name), whose calibration it feeds.
    ``basis`` is what the fit re-costs (the plan's canonical request, strategy and stages), so
    the evidence outlives the plan; ``predicted`` is the plan's prediction when it was observed."""

    __tablename__ = "observations"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    tenant: Mapped[str] = _tenant_column()
    plan_id: Mapped[str] = mapped_column(String(36), nullable=False, index=True)
    cluster_key: Mapped[str] = mapped_column(String(200), nullable=False, index=True)
    format: Mapped[str] = mapped_column(String(32), nullable=False)
    step_time_s: Mapped[float] = mapped_column(Float, nullable=False)
    summary: Mapped[dict] = mapped_column(JSON, nullable=False)
    predicted: Mapped[dict] = mapped_column(JSON, nullable=False)
    basis: Mapped[dict] = mapped_column(JSON, nullable=False)
    calibration_version: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False, default=utcnow)

    __table_args__ = (Index("ix_observations_tenant_cluster_key_created_at", "tenant", "cluster_key", "created_at"),)


class CalibrationRow(Base):
    """One fitted calibration of a cluster: version 1, 2, … per (tenant, cluster_key); a plan
    records the version it was costed with."""

    __tablename__ = "calibrations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = _tenant_column()
    cluster_key: Mapped[str] = mapped_column(String(200), nullable=False)
    version: Mapped[int] = mapped_column(Integer, nullable=False)
    constants: Mapped[dict] = mapped_column(JSON, nullable=False)
    fit: Mapped[dict] = mapped_column(JSON, nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False, default=utcnow)

    __table_args__ = (UniqueConstraint("tenant", "cluster_key", "version"),)


__all__ = ["ApiKeyRow", "CalibrationRow", "ObservationRow", "DEFAULT_TENANT", "ROLES", "Base", "ClusterRow", "JOB_STATUSES", "JobRow", "ModelRow", "PlanRow", "ProfileRow", "UTCDateTime", "utcnow"]
