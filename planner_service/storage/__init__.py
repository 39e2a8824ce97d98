"""Storage: SQLAlchemy 2 ORM tables, Alembic migrations (packaged in ``migrations/``) and the
repository, which is the only writer."""

from planner_service.storage.db import (
    SchemaNotReady,
    check_schema,
    current_revision,
    head_revision,
    make_engine,
    upgrade,
)
from planner_service.storage.repository import (
    NewPlan,
    PlanFilters,
    PlanSummary,
    Repository,
    StoredJob,
    StoredPlan,
)

__all__ = [
    "NewPlan",
    "PlanFilters",
    "PlanSummary",
    "Repository",
    "SchemaNotReady",
    "StoredJob",
    "StoredPlan",
    "check_schema",
    "current_revision",
    "head_revision",
    "make_engine",
    "upgrade",
]
