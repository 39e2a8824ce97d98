"""Service settings (pydantic-settings).

Read from the environment (and passed explicitly in tests): ``DATABASE_URL`` plus
``PLANNER_*`` variables.  Nothing here is global: :func:`planner_service.api.create_app`,
``planner worker`` and ``planner db upgrade`` each build one :class:`ServiceSettings` and pass it
down.
"""

from __future__ import annotations

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ServiceSettings(BaseSettings):
    """Every knob of the HTTP service, the job worker and storage.

    Environment names: ``DATABASE_URL`` (or ``PLANNER_DATABASE_URL``) and ``PLANNER_<FIELD>`` for
    the rest, e.g. ``PLANNER_SOLVER_TIME_LIMIT_S=5``.
    """

    model_config = SettingsConfigDict(env_prefix="PLANNER_", populate_by_name=True, extra="ignore")

    database_url: str = Field(
        default="sqlite:///./planner.db",
        validation_alias=AliasChoices("DATABASE_URL", "PLANNER_DATABASE_URL", "database_url"),
        description="SQLAlchemy URL: sqlite:///path.db or postgresql+psycopg://user@host:5432/db",
    )
    #: CP-SAT wall-clock budget per plan (passed to the planner as SolverSettings.time_limit_s).
    solver_time_limit_s: float = Field(default=2.0, gt=0, le=3600)
    #: CP-SAT worker threads per plan.
    solver_num_workers: int = Field(default=2, ge=1, le=64)
    #: A POST /v1/plans whose search has more candidate strategies than this runs as a job (202).
    sync_max_candidates: int = Field(default=100_000, ge=1)
    #: Largest accepted request body; larger bodies get 413.
    max_body_bytes: int = Field(default=2_000_000, ge=1024)
    #: Largest accepted file upload (POST /v1/models/onnx); larger uploads get 413.
    max_upload_bytes: int = Field(default=256_000_000, ge=1024)
    #: A running job whose worker has not renewed its lease for this long is re-queued.
    job_lease_timeout_s: float = Field(default=30.0, gt=0)
    #: A job claimed this many times without finishing is failed instead of re-queued.
    job_max_attempts: int = Field(default=3, ge=1)
    #: How often an idle worker looks for queued jobs.
    worker_poll_interval_s: float = Field(default=0.5, gt=0)
    #: Run the job worker loop inside the API process.  ``None`` means: yes on SQLite, no on
    #: PostgreSQL (where ``planner worker`` processes run the jobs).
    inline_worker: bool | None = None
    #: Timeout of the POST to a job's callback_url.
    callback_timeout_s: float = Field(default=5.0, gt=0)
    #: Upgrade the schema on start.  ``None`` means: yes on SQLite, no on PostgreSQL (there the
    #: server refuses to start on an old schema; run ``planner db upgrade``).
    auto_migrate: bool | None = None
    #: Database connection pool size (PostgreSQL).
    db_pool_size: int = Field(default=10, ge=1)
    db_max_overflow: int = Field(default=20, ge=0)

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    @property
    def run_inline_worker(self) -> bool:
        return self.is_sqlite if self.inline_worker is None else self.inline_worker

    @property
    def migrate_on_start(self) -> bool:
        return self.is_sqlite if self.auto_migrate is None else self.auto_migrate


__all__ = ["ServiceSettings"]
