"""Observed runs and per-cluster calibrations: the reads and writes of the ``observations`` and
``calibrations`` tables, tenant-scoped like the rest of :class:`Repository` (a tenant's view
writes and reads its own rows; cluster keys are per tenant, as saved-cluster names are).

Observations are append-only; a calibration is inserted once with the next version of its
(tenant, cluster) — the unique constraint makes concurrent recalibrations take distinct
versions (the loser retries)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from planner_service.storage.db import write_connection
from planner_service.storage.errors import Conflict, NotFound
from planner_service.storage.ids import is_uuid
from planner_service.storage.models import CalibrationRow, ObservationRow, utcnow
from planner_service.storage.repository import Repository, _iso, new_id

_VERSION_RETRIES = 20
#: At most this many observations of one cluster feed a fit (the newest).
MAX_FIT_OBSERVATIONS = 500


@dataclass(frozen=True, kw_only=True)
class StoredObservation:
    id: str
    plan_id: str
    cluster_key: str
    format: str
    step_time_s: float
    summary: dict
    predicted: dict
    basis: dict
    calibration_version: int
    created_at: datetime

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "plan_id": self.plan_id,
            "cluster": self.cluster_key,
            "format": self.format,
            "created_at": _iso(self.created_at),
            "observed": self.summary,
            "predicted": self.predicted,
            "calibration_version": self.calibration_version,
        }


@dataclass(frozen=True, kw_only=True)
class StoredCalibration:
    cluster_key: str
    version: int
    constants: dict
    fit: dict
    created_at: datetime

    def to_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster_key, "version": self.version, "constants": self.constants, "fit": self.fit,
                "created_at": _iso(self.created_at)}


def _observation(row: Any) -> StoredObservation:
    return StoredObservation(id=row.id, plan_id=row.plan_id, cluster_key=row.cluster_key, format=row.format, step_time_s=row.step_time_s,
                             summary=row.summary, predicted=row.predicted, basis=row.basis, calibration_version=row.calibration_version,
                             created_at=row.created_at)


def _calibration(row: Any) -> StoredCalibration:
    return StoredCalibration(cluster_key=row.cluster_key, version=row.version, constants=row.constants, fit=row.fit, created_at=row.created_at)


class ObservationStore:
    """The observation and calibration tables seen through ``repo``'s tenant."""

    def __init__(self, repo: Repository) -> None:
        self.repo = repo
        self.engine = repo.engine

    # ------------------------------------------------------------------ observations
    def add(self, *, plan_id: str, cluster_key: str, format: str, step_time_s: float, summary: dict, predicted: dict, basis: dict,
            calibration_version: int) -> StoredObservation:
        obs_id = new_id()
        with write_connection(self.engine) as conn:
            conn.execute(ObservationRow.__table__.insert().values(
                id=obs_id, tenant=self.repo.owner, plan_id=plan_id, cluster_key=cluster_key[:200], format=format, step_time_s=step_time_s,
                summary=summary, predicted=predicted, basis=basis, calibration_version=calibration_version, created_at=utcnow()))
        return self.get(obs_id)

    def get(self, observation_id: str) -> StoredObservation:
        if not is_uuid(observation_id):
            raise NotFound(f"observation {observation_id[:80]!r} does not exist", field="id")
        with self.engine.connect() as conn:
            row = conn.execute(select(ObservationRow.__table__).where(
                ObservationRow.id == observation_id, self.repo._readable(ObservationRow.tenant))).first()
        if row is None:
            raise NotFound(f"observation {observation_id!r} does not exist", field="id")
        return _observation(row)

    def for_plan(self, plan_id: str) -> list[StoredObservation]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(ObservationRow.__table__).where(
                ObservationRow.plan_id == plan_id, self.repo._readable(ObservationRow.tenant)).order_by(ObservationRow.created_at, ObservationRow.id)).all()
        return [_observation(r) for r in rows]

    def for_cluster(self, cluster_key: str, limit: int = MAX_FIT_OBSERVATIONS) -> list[StoredObservation]:
        """The cluster's observations in this tenant, oldest first (the newest ``limit``)."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(ObservationRow.__table__).where(
                ObservationRow.cluster_key == cluster_key, ObservationRow.tenant == self.repo.owner)
                .order_by(ObservationRow.created_at.desc(), ObservationRow.id.desc()).limit(limit)).all()
        return [_observation(r) for r in reversed(rows)]

    # ------------------------------------------------------------------ calibrations
    def add_calibration(self, cluster_key: str, constants: dict, fit: dict) -> StoredCalibration:
        for _ in range(_VERSION_RETRIES):
            try:
                with write_connection(self.engine) as conn:
                    top = conn.execute(select(func.max(CalibrationRow.version)).where(
                        CalibrationRow.cluster_key == cluster_key, CalibrationRow.tenant == self.repo.owner)).scalar()
                    version = 1 if top is None else top + 1
                    conn.execute(CalibrationRow.__table__.insert().values(
                        tenant=self.repo.owner, cluster_key=cluster_key[:200], version=version, constants=constants, fit=fit, created_at=utcnow()))
                return self.calibration(cluster_key, version)
            except IntegrityError:
                continue
        raise Conflict("too many concurrent recalibrations of the same cluster; retry", field="cluster")

    def calibration(self, cluster_key: str, version: int | None = None) -> StoredCalibration:
        """Version ``version`` of the cluster's calibration (None: the latest)."""
        q = select(CalibrationRow.__table__).where(CalibrationRow.cluster_key == cluster_key, CalibrationRow.tenant == self.repo.owner)
        q = q.where(CalibrationRow.version == version) if version is not None else q.order_by(CalibrationRow.version.desc()).limit(1)
        with self.engine.connect() as conn:
            row = conn.execute(q).first()
        if row is None:
            raise NotFound(f"cluster {cluster_key!r} has no calibration" + (f" version {version}" if version is not None else ""), field="cluster")
        return _calibration(row)

    def latest_calibration(self, cluster_key: str) -> StoredCalibration | None:
        try:
            return self.calibration(cluster_key)
        except NotFound:
            return None

    def calibrations(self, cluster_key: str) -> list[StoredCalibration]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(CalibrationRow.__table__).where(
                CalibrationRow.cluster_key == cluster_key, CalibrationRow.tenant == self.repo.owner).order_by(CalibrationRow.version)).all()
        return [_calibration(r) for r in rows]


__all__ = ["MAX_FIT_OBSERVATIONS", "ObservationStore", "StoredCalibration", "StoredObservation"]
